"""Served traffic and user feedback: what `gym-tf serve --record` keeps, and how it becomes problems to learn from.

Two tables in the workspace's traffic database (`WORKSPACE/traffic.db`, beside the run store's `gym-tf.db`):

    traffic    one row per answered request: the response id the client saw (the completion's `id`), the tenant,
               when, the route, the request as the client sent it (after the redaction hook, before the library was
               injected), the answer text of each choice, usage, latency, and the library version that answered
    feedback   one row per (tenant, response id, API key): up/down or a score, a corrected answer, a comment. Posting
               again with the same key replaces that key's row (idempotent)

Rows are never shared across tenants: every read names its tenant. `traffic_dataset` freezes a tenant's traffic
into a JSONL file that the ordinary optimize loop reads, so a from-traffic run resumes like any other.
"""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
import time
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, model_validator
from sqlite_utils import Database

from gym_tf.chat import conversation_error, conversation_text, request_text
from gym_tf.datasets import CONVERSATION_FIELD
from gym_tf.errors import ConfigError, UnknownChoice, UnknownResponse
from rewards.answers import extract_answer

DEFAULT_TENANT = "default"
# A file of its own beside the run store's gym-tf.db: the recording writer commits every 50 ms under traffic, and
# a writer that busy in gym-tf.db made an optimize run's writes fail at once (SQLITE_BUSY_SNAPSHOT on its
# deferred transactions, 33 of 400 in a test); here it contends with nothing but feedback.
TRAFFIC_DB = "traffic.db"
POSITIVE = 0.5  # a score at or above this makes the served answer a reference; below, a known-bad answer


class Feedback(BaseModel):
    """What a user said about one response. At least one of score, correction or comment."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    response_id: str = Field(min_length=1, max_length=256, description="the `id` of the completion it is about")
    score: Literal["up", "down"] | float | None = Field(
        None, description="thumbs `up` (1.0) / `down` (0.0), or a number from 0 to 1")
    correction: str | None = Field(None, min_length=1, max_length=32_000, description="the answer it should have given")
    comment: str | None = Field(None, min_length=1, max_length=32_000, description="free text")
    choice: StrictInt = Field(0, ge=0, le=1023, description="which choice (its `index`) of an n > 1 response it is about")

    @model_validator(mode="after")
    def _rules(self) -> "Feedback":
        if self.score is None and self.correction is None and self.comment is None:
            raise ValueError("feedback needs a score, a correction or a comment")
        if isinstance(self.score, float) and not 0.0 <= self.score <= 1.0:
            raise ValueError("score must be `up`, `down` or a number from 0 to 1")
        return self

    @property
    def value(self) -> float | None:
        return {"up": 1.0, "down": 0.0}.get(self.score, self.score) if isinstance(self.score, str) else self.score


def key_id(api_key: str) -> str:
    """What the store keeps of an API key: a digest (feedback is idempotent per key, the key itself is never stored)."""
    return hashlib.sha256(api_key.encode()).hexdigest()[:16]


def parse_since(text: str, now: float | None = None) -> float:
    """`7d`, `12h`, `30m`, an ISO date or time, or epoch seconds -> epoch seconds.

    >>> parse_since("2d", now=200000.0)
    27200.0
    """
    now = time.time() if now is None else now
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([dhms])\s*", text)
    if match:
        return now - float(match.group(1)) * {"d": 86400, "h": 3600, "m": 60, "s": 1}[match.group(2)]
    try:
        return float(text)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ConfigError(f"--since {text!r}: use 7d / 12h / 30m, an ISO date, or epoch seconds") from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)).timestamp()


class TrafficLog:
    """The traffic and feedback tables, over a connection of its own (the server's writer thread holds one; the CLI
    another). Every method names the tenant it reads or writes."""

    def __init__(self, workspace: str | Path):
        self.root = Path(workspace)
        self.root.mkdir(parents=True, exist_ok=True)
        self.db = Database(sqlite3.connect(self.root / TRAFFIC_DB, check_same_thread=False, timeout=30))
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self._create()

    def _create(self) -> None:
        if {"traffic", "feedback"} <= set(self.db.table_names()):
            if "choice" not in self.db["feedback"].columns_dict:  # a log recorded before feedback named a choice
                with self._immediate():  # checked again under the lock: another process may have just added it
                    if "choice" not in {row[1] for row in self.db.execute("pragma table_info(feedback)")}:
                        self.db.execute("alter table feedback add column choice integer not null default 0")
            return
        with self._immediate():
            self.db["traffic"].create(
                {"seq": int, "response_id": str, "tenant": str, "created": float, "route": str, "model": str,
                 "library_version": str, "request": str, "answers": str, "finish_reasons": str, "usage": str,
                 "latency_s": float},
                pk="seq", if_not_exists=True)
            self.db["traffic"].create_index(["tenant", "response_id"], if_not_exists=True)
            self.db["traffic"].create_index(["created"], if_not_exists=True)
            self.db["feedback"].create(
                {"tenant": str, "response_id": str, "key_id": str, "score": float, "correction": str, "comment": str,
                 "created": float, "choice": int},
                pk=("tenant", "response_id", "key_id"), not_null={"choice"}, defaults={"choice": 0},
                if_not_exists=True)

    def _immediate(self):
        return _Immediate(self.db.conn)

    # --- writing --------------------------------------------------------------------------------------------------

    def add(self, rows: list[dict[str, Any]]) -> None:
        """Record a batch of exchanges in one transaction (the server's writer thread calls this)."""
        with self._immediate():
            self.db["traffic"].insert_all(rows)

    def put_feedback(self, tenant: str, feedback: Feedback, key: str) -> bool:
        """Record a key's feedback on a response of this tenant; True if it replaced that key's earlier feedback.
        The response must have been recorded for this tenant (UnknownResponse if not), with that choice
        (UnknownChoice if not)."""
        with self._immediate():
            exchange = self.find(tenant, feedback.response_id)
            if exchange is None:
                raise UnknownResponse(feedback.response_id)
            if feedback.choice >= len(exchange["answers"] or [None]):
                raise UnknownChoice(f"choice {feedback.choice}: response {feedback.response_id!r} has "
                                    f"{len(exchange['answers'] or [None])} choice(s), from index 0")
            before = self.db.conn.execute(
                "select 1 from feedback where tenant = ? and response_id = ? and key_id = ?",
                [tenant, feedback.response_id, key]).fetchone()
            self.db["feedback"].insert(
                {"tenant": tenant, "response_id": feedback.response_id, "key_id": key, "score": feedback.value,
                 "correction": feedback.correction, "comment": feedback.comment, "created": time.time(),
                 "choice": feedback.choice},
                replace=True)
        return before is not None

    def prune(self, max_days: float | None, max_rows: int | None, now: float | None = None) -> int:
        """Delete exchanges older than `max_days` and beyond the newest `max_rows`, with their feedback."""
        now = time.time() if now is None else now
        before = self.db.conn.total_changes
        with self._immediate():
            if max_days is not None:
                self.db.execute("delete from traffic where created < ?", [now - max_days * 86400])
            if max_rows is not None:
                self.db.execute("delete from traffic where seq in (select seq from traffic order by seq desc "
                                "limit -1 offset ?)", [max_rows])
            removed = self.db.conn.total_changes - before
            if removed:
                self.db.execute("delete from feedback where not exists (select 1 from traffic t where "
                                "t.tenant = feedback.tenant and t.response_id = feedback.response_id)")
        return removed

    def forget(self, tenant: str) -> int:
        """Delete every exchange and feedback of a tenant."""
        with self._immediate():
            removed = self.db.execute("delete from traffic where tenant = ?", [tenant]).rowcount
            self.db.execute("delete from feedback where tenant = ?", [tenant])
        return removed

    def merge(self, other: str | Path) -> dict[str, int]:
        """Take in what another replica recorded (its workspace folder or its traffic.db): exchanges not yet here
        (by tenant and response id), and feedback, the newer of two rows by the same key on the same response
        winning. Serving replicas without a shared disk each record on their own; merging their logs into the
        learning workspace gives one run all of them. Merging the same log twice adds nothing."""
        path = Path(other)
        path = path / TRAFFIC_DB if path.is_dir() else path
        if not path.is_file():
            raise ConfigError(f"{path}: no recorded traffic there (a workspace of `serve --record`, or its {TRAFFIC_DB})")
        if path.resolve() == (self.root / TRAFFIC_DB).resolve():
            raise ConfigError(f"{path} is this workspace's own traffic")
        columns = "response_id, tenant, created, route, model, library_version, request, answers, finish_reasons, " \
                  "usage, latency_s"
        self.db.conn.execute("ATTACH DATABASE ? AS other", [str(path)])
        try:
            with self._immediate():
                exchanges = self.db.conn.execute(
                    f"insert into traffic ({columns}) select {columns} from other.traffic o where not exists "
                    "(select 1 from traffic t where t.tenant = o.tenant and t.response_id = o.response_id) "
                    "order by o.created").rowcount
                theirs = {row[1] for row in self.db.conn.execute("pragma other.table_info(feedback)")}
                choice = "choice" if "choice" in theirs else "0"  # a log recorded before feedback named a choice
                feedback = self.db.conn.execute(
                    "insert into feedback (tenant, response_id, key_id, score, correction, comment, created, choice) "
                    f"select tenant, response_id, key_id, score, correction, comment, created, {choice} "
                    "from other.feedback where true on conflict (tenant, response_id, key_id) do update set "
                    "score = excluded.score, correction = excluded.correction, comment = excluded.comment, "
                    "created = excluded.created, choice = excluded.choice where excluded.created > feedback.created"
                ).rowcount
        finally:
            self.db.conn.execute("DETACH DATABASE other")
        return {"exchanges": exchanges, "feedback": feedback}

    # --- reading --------------------------------------------------------------------------------------------------

    def find(self, tenant: str, response_id: str) -> dict[str, Any] | None:
        """The newest exchange of this tenant with that response id (another tenant's is never found)."""
        rows = list(self.db["traffic"].rows_where("tenant = ? and response_id = ?", [tenant, response_id],
                                                  order_by="seq desc", limit=1))
        return _decoded(rows[0]) if rows else None

    def exchanges(self, tenant: str, since: float = 0.0, until: float | None = None) -> Iterator[dict[str, Any]]:
        """A tenant's exchanges in order, each with `feedback`: every key's row on it."""
        until = time.time() if until is None else until
        feedback: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for row in self.db["feedback"].rows_where("tenant = ?", [tenant], order_by="created"):
            feedback[row["response_id"]].append(row)
        for row in self.db["traffic"].rows_where("tenant = ? and created >= ? and created <= ?",
                                                 [tenant, since, until], order_by="seq"):
            yield {**_decoded(row), "feedback": feedback.get(row["response_id"], [])}

    def counts(self, tenant: str, since: float = 0.0) -> dict[str, int]:
        exchanges = self.db.conn.execute("select count(*) from traffic where tenant = ? and created >= ?",
                                         [tenant, since]).fetchone()[0]
        feedback = self.db.conn.execute("select count(*) from feedback where tenant = ? and created >= ?",
                                        [tenant, since]).fetchone()[0]
        return {"exchanges": exchanges, "feedback": feedback}

    def close(self) -> None:
        self.db.conn.close()


class _Immediate:
    """BEGIN IMMEDIATE ... COMMIT (the write lock first, as the run store does), or a savepoint when nested."""

    def __init__(self, conn: sqlite3.Connection):
        self.conn = conn

    def __enter__(self) -> None:
        self.nested = self.conn.in_transaction
        self.conn.execute("SAVEPOINT traffic" if self.nested else "BEGIN IMMEDIATE")

    def __exit__(self, kind, *_: object) -> None:
        if self.nested:
            self.conn.execute("ROLLBACK TO traffic" if kind else "RELEASE traffic")
            if kind:
                self.conn.execute("RELEASE traffic")
        else:
            self.conn.execute("ROLLBACK" if kind else "COMMIT")


def _decoded(row: dict[str, Any]) -> dict[str, Any]:
    return {**row, **{k: json.loads(row[k]) if row[k] else None
                      for k in ("request", "answers", "finish_reasons", "usage")}}


# --- from exchanges to problems -------------------------------------------------------------------------------------


def problem_row(exchange: dict[str, Any]) -> dict[str, Any] | None:
    """One exchange as a dataset row, or None when it has no text problem (a token-id prompt, no user message).

    A chat exchange keeps its conversation as the client sent it (`messages`, after the redaction hook), so that it
    is re-sampled as it was served; its problem text is that conversation (`chat.conversation_text`).

    The reference `answer` is the newest correction, else the served answer's final answer when the mean score is
    positive (thumbs up); a negative score keeps the served answer as `served_answer` with `label: down`, for the
    feedback reward to count against; a comment alone gives `label: comment`. Of an n > 1 response, the served
    answer is the choice the newest feedback names, and only the scores given to that choice count."""
    request = exchange["request"] if isinstance(exchange["request"], dict) else {}  # a redaction hook may blank it
    conversation = None
    if exchange["route"] == "/chat/completions":
        messages = request.get("messages")
        if conversation_error(messages):  # not one to re-send (it ends with the assistant's turn, say): its user text
            text = request_text(messages)
        else:
            conversation, text = messages, conversation_text(messages)
    else:
        text = request.get("prompt") if isinstance(request.get("prompt"), str) else ""
    if not text.strip():
        return None
    rows = exchange["feedback"]
    answers = exchange["answers"] or [""]
    scored = [f for f in rows if f["score"] is not None]  # a later comment alone does not move the choice
    about = (scored or rows)[-1].get("choice", 0) if rows else 0  # the choice the newest feedback names (n > 1)
    served = answers[about] if about < len(answers) else answers[0]
    corrections = [f["correction"] for f in rows if f["correction"]]
    scores = [f["score"] for f in rows if f["score"] is not None and f.get("choice", 0) == about]
    mean = sum(scores) / len(scores) if scores else None
    if corrections:
        label, answer = "correction", corrections[-1]
    elif mean is not None:
        label, answer = ("up", extract_answer(served) or served) if mean >= POSITIVE else ("down", None)
    else:
        label, answer = ("comment" if any(f["comment"] for f in rows) else "none"), None
    return {"id": exchange["response_id"], "problem": text, "answer": answer, "label": label, "served_answer": served,
            "score": mean, "comment": "\n".join(f["comment"] for f in rows if f["comment"]) or None,
            "library_version": exchange["library_version"],
            **({CONVERSATION_FIELD: conversation} if conversation is not None else {})}


def _hold_out_rank(row: dict[str, Any]) -> float:
    """A number in [0, 1] fixed by the response id."""
    return int(hashlib.sha256(row["id"].encode()).hexdigest()[:8], 16) / 0xFFFFFFFF


def traffic_dataset(log: TrafficLog, tenant: str, out_dir: Path, since: float = 0.0, until: float | None = None,
                    val_fraction: float = 0.0) -> tuple[Path, Path | None, dict[str, int]]:
    """Freeze a tenant's traffic into JSONL files the optimize loop reads: (train, val or None, counts).

    `val_fraction` of the feedback-labelled rows (those with a reference answer) is held out for the gate, chosen
    by a hash of the response id: a row is held out when its hash falls below the fraction, so the same rows are held
    out on every call, and as traffic grows within a window, a row once trained on is not held out later. When no row
    falls below (likely with few labelled rows), the one with the lowest hash is held out, so a positive fraction
    always gates; it moves to training once a row falls below. (A window that moves, `--since 7d` or retention, can
    drop rows and so hold out one an earlier run trained on.)
    A response id recorded twice keeps its newest row.
    """
    if not 0 <= val_fraction < 1:
        raise ConfigError(f"--val-fraction {val_fraction}: a fraction from 0 (no hold-out) up to, not including, 1")
    until = time.time() if until is None else until
    rows: dict[str, dict[str, Any]] = {}
    for exchange in log.exchanges(tenant, since, until):
        row = problem_row(exchange)
        if row is not None:
            rows.pop(row["id"], None)
            rows[row["id"]] = row
    if not rows:
        raise ConfigError(f"tenant {tenant!r} has no recorded text requests to learn from in that time range "
                          "(is `gym-tf serve --record` on?)")
    with_answer = sorted((r for r in rows.values() if r["answer"] is not None), key=_hold_out_rank)
    held = ([r for r in with_answer if _hold_out_rank(r) < val_fraction] or with_answer[:1]) if val_fraction > 0 else []
    held_ids = {r["id"] for r in held}
    train = [r for r in rows.values() if r["id"] not in held_ids]
    if not train:
        raise ConfigError("every recorded request was held out for validation: lower --val-fraction")
    digest = hashlib.sha256(json.dumps([train, held], sort_keys=True).encode()).hexdigest()[:12]
    out_dir.mkdir(parents=True, exist_ok=True)
    train_path = out_dir / f"{tenant}-{digest}-train.jsonl"
    train_path.write_text("".join(json.dumps(r) + "\n" for r in train))
    val_path = None
    if held:
        val_path = out_dir / f"{tenant}-{digest}-val.jsonl"
        val_path.write_text("".join(json.dumps(r) + "\n" for r in held))
    labelled = sum(r["label"] != "none" for r in rows.values())
    return train_path, val_path, {"problems": len(train), "held_out": len(held), "with_feedback": labelled}
