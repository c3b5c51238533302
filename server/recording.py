"""`gym-tf serve --record`: each answered request is kept in the workspace, written off the request path.

The request path does three cheap things: it appends each streamed chunk to a list, reads the response id from
the first chunk, and puts one job on a queue when the response is complete. A writer thread with its own SQLite
connection takes jobs in batches: it parses the streamed events into answers, applies the redaction hook, inserts
the batch in one transaction, and applies the retention limits. Feedback reads and writes go through the same
thread, after every exchange queued before them, so feedback posted right after a response finds it.

Kill switch: while the file `WORKSPACE/recording.off` exists nothing is recorded (`gym-tf traffic pause` makes
it, `gym-tf traffic resume` removes it); the server looks at most once a second.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import queue
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Callable

from gym_tf.errors import ConfigError
from gym_tf.traffic import Feedback, TrafficLog

KILL_FILE = "recording.off"
_ID = re.compile(rb'"id"\s*:\s*"([^"\\]{1,256})"')


@dataclass(frozen=True)
class RecordSettings:
    max_days: float | None = 30.0  # exchanges older than this are deleted
    max_rows: int | None = 1_000_000  # beyond this many, the oldest are deleted
    redact: str | None = None  # `module:function`, (exchange dict) -> dict, or None to drop it
    batch: int = 512  # exchanges per write transaction at most
    max_pending: int = 20_000  # exchanges waiting for the writer; beyond, new ones are dropped (and counted)
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


class Recorder:
    """The queue, the writer thread, and the open streams (response id -> done event)."""

    def __init__(self, workspace: str | Path, settings: RecordSettings = RecordSettings()):
        self.settings = settings
        self.redact = load_redactor(settings.redact)
        self.kill_file = Path(workspace) / KILL_FILE
        self.log = TrafficLog(workspace)  # opened (tables made) here, then used by the writer thread only
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.open_streams: dict[tuple[str, str], asyncio.Event] = {}
        self.dropped = self.written = 0
        self._paused, self._checked = False, 0.0
        self._last_prune = 0.0
        self.thread = threading.Thread(target=self._write, name="gym-tf recorder", daemon=True)
        self.thread.start()

    # --- the request path -----------------------------------------------------------------------------------------

    def active(self) -> bool:
        now = time.monotonic()
        if now - self._checked > 1.0:
            self._paused, self._checked = self.kill_file.exists(), now
        return not self._paused

    def completed(self, meta: dict[str, Any], reply: dict[str, Any], latency_s: float) -> None:
        """A non-streaming answer: queue it (one put; the writer does the rest)."""
        self._queue(("record", meta, reply, None, latency_s))

    def _queue(self, job: tuple) -> None:
        # Serving never waits for the disk: if the writer falls this far behind, exchanges are dropped, not queued.
        if self.jobs.qsize() >= self.settings.max_pending:
            self.dropped += 1
            return
        self.jobs.put(job)

    async def capture(self, meta: dict[str, Any], events: AsyncIterator[bytes], start: float) -> AsyncIterator[bytes]:
        """Relay a stream's bytes unchanged; queue it once it is complete: it ended, or [DONE] went out (clients
        such as the openai SDK close the connection at [DONE], often before the upstream's own end arrives). A
        client gone mid-stream leaves nothing."""
        chunks: list[bytes] = []
        key = None
        complete = False
        try:
            async for chunk in events:
                if key is None:
                    found = _ID.search(chunk)
                    if found:
                        key = (meta["tenant"], found.group(1).decode())
                        self.open_streams[key] = asyncio.Event()
                chunks.append(chunk)
                complete = complete or b"data: [DONE]" in chunk
                yield chunk
            complete = True
        finally:
            if complete:
                self._queue(("record", meta, None, chunks, time.perf_counter() - start))
            if key is not None:
                done = self.open_streams.pop(key, None)
                if done is not None:
                    done.set()

    # --- feedback (through the writer thread, after everything queued before it) ----------------------------------

    async def feedback(self, tenant: str, feedback: Feedback, key: str, wait_s: float = 30.0) -> bool:
        """Record feedback; LookupError for a response id this tenant never got. A stream still open under that id
        is waited for (up to `wait_s`): a client may post feedback the moment it read [DONE]."""
        done = self.open_streams.get((tenant, feedback.response_id))
        if done is not None:
            await asyncio.wait_for(done.wait(), wait_s)
        return await self.call(self.log.put_feedback, tenant, feedback, key)

    async def call(self, function: Callable[..., Any], *args: Any) -> Any:
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        self.jobs.put(("call", function, args, future, asyncio.get_running_loop()))
        return await future

    def close(self, timeout: float = 10.0) -> None:
        self.jobs.put(("stop",))
        self.thread.join(timeout)

    # --- the writer thread --------------------------------------------------------------------------------------------

    def _write(self) -> None:
        while True:
            jobs = [self.jobs.get()]
            while len(jobs) < self.settings.batch:
                try:
                    jobs.append(self.jobs.get_nowait())
                except queue.Empty:
                    break
            rows = []
            for job in jobs:
                if job[0] == "record":
                    row = self._row(*job[1:])
                    if row is not None:
                        rows.append(row)
                    continue
                if rows:  # a feedback call sees every exchange queued before it
                    self._insert(rows)
                    rows = []
                if job[0] == "stop":
                    return
                self._run_call(*job[1:])
            if rows:
                self._insert(rows)
            if time.monotonic() - self._last_prune > self.settings.prune_every_s:
                self._last_prune = time.monotonic()
                self.log.prune(self.settings.max_days, self.settings.max_rows)

    def _insert(self, rows: list[dict[str, Any]]) -> None:
        self.log.add(rows)
        self.written += len(rows)
        if self.settings.max_rows is not None and self.written % 1000 < len(rows):
            self.log.prune(None, self.settings.max_rows)  # a burst must not wait a minute to be trimmed

    @staticmethod
    def _run_call(function, args, future, loop) -> None:
        try:
            result = function(*args)
        except BaseException as exc:  # handed to the awaiting request, which decides
            loop.call_soon_threadsafe(_settle, future, None, exc)
        else:
            loop.call_soon_threadsafe(_settle, future, result, None)

    def _row(self, meta: dict[str, Any], reply: dict[str, Any] | None, chunks: list[bytes] | None,
             latency_s: float) -> dict[str, Any] | None:
        reply = reply if reply is not None else stream_reply(b"".join(chunks or []))
        if not reply.get("id"):
            return None
        choices = sorted((c for c in reply.get("choices") or [] if isinstance(c, dict)), key=lambda c: c.get("index", 0))
        exchange = {
            "response_id": str(reply["id"]), "tenant": meta["tenant"], "created": meta["created"],
            "route": meta["route"], "model": meta["model"], "library_version": meta["library_version"],
            "request": meta["request"], "answers": [_text(c) for c in choices],
            "finish_reasons": [c.get("finish_reason") for c in choices], "usage": reply.get("usage"),
            "latency_s": latency_s,
        }
        if self.redact is not None:
            try:
                exchange = self.redact(exchange)
            except Exception:  # noqa: BLE001 - a failing redactor must never let the unredacted row through
                self.dropped += 1
                return None
            if exchange is None:
                return None
        return {**exchange, **{k: json.dumps(exchange.get(k)) for k in ("request", "answers", "finish_reasons", "usage")}}


def _settle(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


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
