"""The writer process of `gym-tf serve --record` (server.recording starts it): batches of exchanges arrive on stdin
as length-prefixed pickles from the server, which is their only writer; each is turned into a traffic row (streamed
events folded into answers, the redaction hook applied) and stored. Calls (feedback) are answered on stdout, in
order, after every exchange that arrived before them.

    python -m gym_tf.traffic_writer WORKSPACE SETTINGS_JSON
"""

from __future__ import annotations

import importlib
import json
import pickle
import sqlite3
import struct
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

from gym_tf.errors import ConfigError, UnknownChoice
from gym_tf.traffic import Feedback, TrafficLog

FRAME = struct.Struct(">I")


@dataclass(frozen=True)
class RecordSettings:
    max_days: float | None = 30.0  # exchanges older than this are deleted
    max_rows: int | None = 1_000_000  # beyond this many, the oldest are deleted
    redact: str | None = None  # `module:function`, (exchange dict) -> dict, or None to drop it
    flush_s: float = 0.05  # how often the batch goes to the writer
    max_pending_bytes: int = 64 << 20  # handed over but not yet taken by the writer; beyond, exchanges are dropped
    prune_every_s: float = 60.0

    def __post_init__(self) -> None:
        if self.max_days is not None and self.max_days <= 0:
            raise ConfigError("record_max_days must be > 0")
        if self.max_rows is not None and self.max_rows < 1:
            raise ConfigError("record_max_rows must be >= 1")


def load_redactor(name: str | None) -> Callable[[dict[str, Any]], dict[str, Any] | None] | None:
    if not name:
        return None
    module_name, _, attr = name.partition(":")
    try:
        function = getattr(importlib.import_module(module_name), attr, None) if attr else None
    except ImportError as exc:
        raise ConfigError(f"--redact {name!r}: cannot import {module_name!r}: {exc}") from None
    if not callable(function):
        raise ConfigError(f"--redact {name!r}: not a callable `module:function`")
    return function


def write(workspace: str, settings: RecordSettings) -> None:
    """The writer's loop, until the server says stop or goes away."""
    redact = load_redactor(settings.redact)
    log = TrafficLog(workspace)
    source, sink = sys.stdin.buffer, sys.stdout.buffer
    last_prune, since_prune = 0.0, 0
    while True:
        header = source.read(4)
        if len(header) < 4:
            return  # the server is gone
        batch = pickle.loads(source.read(FRAME.unpack(header)[0]))
        rows: list[dict[str, Any]] = []
        for job in batch:
            if job[0] == "record":
                row = _row(redact, *job[1:])
                if row is not None:
                    rows.append(row)
                continue
            if rows:  # a call sees every exchange handed over before it
                _store(log, rows)
                rows = []
            if job[0] == "stop":
                return
            _answer(sink, log, *job[1:])
        if rows:
            _store(log, rows)
            since_prune += len(rows)
        # by time, and after every 1,000 new rows, so a burst never waits a minute to be trimmed
        if time.monotonic() - last_prune > settings.prune_every_s or since_prune >= 1000:
            last_prune, since_prune = time.monotonic(), 0
            log.prune(settings.max_days, settings.max_rows)


def _store(log: TrafficLog, rows: list[dict[str, Any]]) -> None:
    """Insert a batch; a database that refuses it (disk full, locked for 30 s) loses this batch, not the writer."""
    try:
        log.add(rows)
    except sqlite3.Error as exc:
        print(f"gym-tf recorder: {len(rows)} exchanges not kept: {exc}", file=sys.stderr)


def _answer(sink, log: TrafficLog, ident: int, name: str, args: tuple) -> None:
    error, result = None, None
    try:
        if name == "feedback":
            tenant, feedback, key = args
            result = log.put_feedback(tenant, Feedback.model_validate(feedback), key)
    except LookupError as exc:
        error, result = "lookup", str(exc)
    except UnknownChoice as exc:
        error, result = "choice", str(exc)
    except Exception as exc:  # noqa: BLE001 - reported to the waiting request, which answers with an error
        error, result = "failed", f"{type(exc).__name__}: {exc}"
    payload = pickle.dumps((ident, error, result))
    sink.write(FRAME.pack(len(payload)) + payload)
    sink.flush()


def _row(redact, meta: dict[str, Any], reply: dict[str, Any] | None, raw: bytes | None,
         latency_s: float) -> dict[str, Any] | None:
    reply = reply if reply is not None else stream_reply(raw or b"")
    if not reply.get("id"):
        return None
    choices = sorted((c for c in reply.get("choices") or [] if isinstance(c, dict)),
                     key=lambda c: c.get("index", 0) if isinstance(c.get("index"), int) else 0)
    exchange = {
        "response_id": str(reply["id"]), "tenant": meta["tenant"], "created": meta["created"],
        "route": meta["route"], "model": meta["model"], "library_version": meta["library_version"],
        "request": meta["request"], "answers": [_text(c) for c in choices],
        "finish_reasons": [c.get("finish_reason") for c in choices], "usage": reply.get("usage"),
        "latency_s": latency_s,
    }
    if redact is not None:
        try:
            redacted = redact(exchange)
            if redacted is None:
                return None
            # the hook may change values, never the row's shape: unknown keys would break the insert
            exchange = {k: redacted[k] for k in exchange}
            json.dumps(exchange)
        except Exception as exc:  # noqa: BLE001 - a failing redactor must never let the unredacted row through
            print(f"gym-tf recorder: redaction hook failed ({type(exc).__name__}: {exc}): exchange not kept",
                  file=sys.stderr)
            return None
    return {**exchange, **{k: json.dumps(exchange.get(k)) for k in ("request", "answers", "finish_reasons", "usage")}}


def _text(choice: dict[str, Any]) -> str:
    message = choice.get("message")
    if isinstance(message, dict):
        content = message.get("content")
        return content if isinstance(content, str) else json.dumps(content) if content else ""
    return choice.get("text") if isinstance(choice.get("text"), str) else ""


def stream_reply(raw: bytes) -> dict[str, Any]:
    """A streamed response folded back into the shape of a non-streamed one: id, choices with text, usage."""
    reply: dict[str, Any] = {}
    texts: dict[int, list[str]] = {}
    finish: dict[int, str | None] = {}
    for line in raw.split(b"\n"):
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            break
        try:
            event = json.loads(data)
        except ValueError:
            continue
        if not isinstance(event, dict) or "error" in event:
            return {}  # the stream ended in an error: nothing to learn from
        reply.setdefault("id", event.get("id"))
        if isinstance(event.get("usage"), dict):
            reply["usage"] = event["usage"]
        for choice in event.get("choices") or []:
            if not isinstance(choice, dict):
                continue
            index = choice.get("index", 0) if isinstance(choice.get("index"), int) else 0
            delta = choice.get("delta")
            piece = delta.get("content") if isinstance(delta, dict) else choice.get("text")
            texts.setdefault(index, []).append(piece if isinstance(piece, str) else "")
            if choice.get("finish_reason"):
                finish[index] = choice["finish_reason"]
    reply["choices"] = [{"index": i, "text": "".join(texts[i]), "finish_reason": finish.get(i)} for i in sorted(texts)]
    return reply


if __name__ == "__main__":
    write(sys.argv[1], RecordSettings(**json.loads(sys.argv[2])))
