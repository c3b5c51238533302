"""The run store: one SQLite file per workspace (default `./.gym-tf/gym-tf.db`) holding runs, rollouts, every
learner prompt and reply, ops with verdicts, library versions and steps. WAL mode; a step commits atomically.

Every LLM reply is written as soon as it arrives, so a crash loses no paid-for tokens: `--resume` reads them back.

Several processes may share a workspace. A run is held by one store at a time (`new_run`, `claim_run`) and kept
alive by a heartbeat thread; a run whose heartbeat stopped is shown as `crashed` and may be resumed. Writes that
check before they insert take the write lock first (`BEGIN IMMEDIATE`), so two imports of one version record it once.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import socket
import sqlite3
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from pydantic import BaseModel
from sqlite_utils import Database

from gym_tf.datasets import Problem, dataset_hash, fingerprints
from gym_tf.errors import ConfigError, StoreError, UnknownRun, UnknownVersion
from gym_tf.library import EMPTY_LIBRARY, LibraryVersion, OpVerdict
from gym_tf.rollouts import Rollout
from ledger.cid import canonical
from ledger.log import MerkleLog, leaf_hash

DEFAULT_WORKSPACE = ".gym-tf"
HEARTBEAT_S = 10.0  # how often a process holding a run marks it alive
SCHEMA_VERSION = 1  # PRAGMA user_version once `_create` has made every table, column and index
STALE_BEATS = 6  # a running run silent for this many beats is shown as crashed, and a resume may take it over


def workspace_path(workspace: str | Path | None = None) -> Path:
    return Path(workspace or os.environ.get("GYM_TF_WORKSPACE", DEFAULT_WORKSPACE))


def config_hash(config: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


LEARNER_ANSWER = "learner/"  # the problem id prefix of the learner's answers, stored beside the model's rollouts
HINTED_ANSWER = "hinted/"  # and of the model's answers asked with the reference answer shown (`hinted_examples`)
REFERENCE_ANSWER = "reference/"  # and of a problem's reference answer shown alone (`labeled_examples`): never stored


def rollout_key(run_id: str, step: int, problem_id: str, sample: int, version: str = "") -> str:
    """A rollout's key. Validation rollouts name their library version too: a prune step validates several
    versions on the same problems in one step."""
    return f"{run_id}/{step}/{problem_id}/{sample}" + (f"@{version}" if version else "")


# The token stage a rollouts row counts under: the model's answers, its validation answers, or the learner's.
ROLLOUT_STAGE_SQL = ("case when problem_id like 'val/%' then 'validate' "
                     f"when problem_id like '{LEARNER_ANSWER}%' then 'learner-answer' "
                     f"when problem_id like '{HINTED_ANSWER}%' then 'hinted-answer' else 'rollout' end")


def learner_answer(key: str) -> bool:
    """Whether a rollout key is one of the learner's answers (run ids and steps hold no slash)."""
    return key.split("/", 2)[-1].startswith(LEARNER_ANSWER)


def hinted_answer(key: str) -> bool:
    """Whether a rollout key is one of the model's answers asked with the reference answer shown."""
    return key.split("/", 2)[-1].startswith(HINTED_ANSWER)


def reference_answer(key: str) -> bool:
    """Whether a rollout key names a problem's reference answer, shown alone as a worked example (never sampled)."""
    return key.split("/", 2)[-1].startswith(REFERENCE_ANSWER)


def _version_in_key(rollout: Rollout) -> str:
    return rollout.library_version if rollout.problem_id.startswith("val/") else ""


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: delivers nothing, only checks
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def run_is_stale(root: Path, row: dict[str, Any], now: float, heartbeat_s: float = HEARTBEAT_S) -> bool:
    """A running run's holder stopped beating, or is a process of this machine that no longer exists (kill -9 a
    moment ago)."""
    last = row.get("heartbeat")
    try:
        path = root / "heartbeats" / row["id"]
        if path.read_text() == row["owner"]:
            last = max(last or 0.0, path.stat().st_mtime)
    except OSError:
        pass
    if last is None or now - last > STALE_BEATS * heartbeat_s:
        return True
    pid, _, host = (row["owner"] or "").partition("/")[0].partition("@")
    return host == socket.gethostname() and pid.isdigit() and not _process_exists(int(pid))


def shown_status(root: Path, row: dict[str, Any], heartbeat_s: float = HEARTBEAT_S) -> str:
    """A run's status as people should see it: `running` whose heartbeat stopped is `crashed`."""
    if row["status"] == "running" and run_is_stale(root, row, time.time(), heartbeat_s):
        return "crashed"
    return row["status"]


_UNWRITABLE = ("full", "readonly", "read-only", "disk I/O", "unable to open")  # sqlite3's words for the disk's faults


def _named(root: Path, exc: Exception, doing: str, then: str) -> StoreError | None:
    """sqlite3's (or the OS's) error as a StoreError naming the workspace, or None when it is not the workspace's
    doing (a bug, to be seen whole)."""
    reason = str(exc)
    if "locked" in reason:
        return StoreError(f"the workspace {root} is locked: another process has held its write lock longer than the "
                          "wait allows; try again when it is done")
    if isinstance(exc, sqlite3.OperationalError) and not any(word in reason for word in _UNWRITABLE):
        return None
    return StoreError(f"cannot {doing} the workspace {root} ({reason}): {then}")


def _writes(method: Callable[..., Any]) -> Callable[..., Any]:
    """A store write whose workspace cannot take it (disk full, read-only, an I/O error) raises StoreError naming the
    workspace, not sqlite3's OperationalError: the CLI prints one line, and the transaction rolled back, so
    `--resume` continues from the last committed step (found by tests/test_attack_faults.py)."""

    @functools.wraps(method)
    def guarded(self: "RunStore", *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except sqlite3.OperationalError as exc:
            error = _named(self.root, exc, "write to", "nothing of this write was kept; free space or make it "
                                                      "writable, then resume")
            if error is None:
                raise
            raise error from None

    return guarded


class RunStore:
    def __init__(self, workspace: str | Path | None = None, heartbeat_s: float = HEARTBEAT_S):
        self.root = workspace_path(workspace)
        self.heartbeat_s = heartbeat_s
        # Who holds the runs this store runs: unique per store, readable in "run X is running in process ...".
        self.owner = f"{os.getpid()}@{socket.gethostname()}/{uuid.uuid4().hex[:8]}"
        self._beating: dict[str, threading.Event] = {}  # run id -> set to stop its heartbeat
        try:
            self._open()
        except (sqlite3.OperationalError, OSError) as exc:  # a read-only or full filesystem, a folder it may not use
            with contextlib.suppress(AttributeError):  # what was opened before the failure
                self.ledger.close()
            with contextlib.suppress(AttributeError):
                self.db.conn.close()
            error = _named(self.root, exc, "open", "it must be a writable folder with free space")
            if error is None:
                raise
            raise error from None

    def _open(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        # One connection, used by one thread at a time (the CLI's, or the server's event loop thread). Another
        # process may hold the write lock for a moment: wait for it rather than fail.
        self.db = Database(sqlite3.connect(self.root / "gym-tf.db", check_same_thread=False, timeout=30))
        self._enable_wal()
        self.db.execute("PRAGMA synchronous=NORMAL")
        # The Merkle log lives in the same file (pymerkle's `leaf` table), so a version and its log entry commit
        # in one transaction.
        self.ledger = MerkleLog(self.root / "gym-tf.db")
        # A workspace whose tables are all made opens without a write: a reader (`ledger verify`, `serve`) is not
        # held up, nor failed after the busy timeout, by another process's long write (tests/test_attack_concurrency.py)
        if self.db.execute("PRAGMA user_version").fetchone()[0] < SCHEMA_VERSION:
            with self._immediate():  # the write lock first: processes creating the tables together take turns
                self._create()
                self.db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def close(self) -> None:
        """Release the workspace's files (both connections: the store's and the Merkle log's)."""
        self.ledger.close()
        self.db.conn.close()

    def _enable_wal(self) -> None:
        """Switching a new file to WAL needs it alone, and SQLite's busy wait does not cover that switch: processes
        opening a new workspace together take turns (measured: 3 at once failed with "database is locked")."""
        for attempt in range(200):
            try:
                self.db.enable_wal()
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or attempt == 199:
                    raise
                time.sleep(0.05)

    def _create(self) -> None:
        db = self.db
        db["runs"].create(
            {"id": str, "kind": str, "status": str, "created": float, "updated": float, "config": str,
             "config_hash": str, "model": str, "dataset": str, "current_version": str, "summary": str,
             "owner": str, "heartbeat": float},
            pk="id", if_not_exists=True,
        )
        if "heartbeat" not in db["runs"].columns_dict:  # a workspace made before run locks
            with self._immediate():  # two processes may open it at once: check again under the write lock
                for column, kind in (("owner", str), ("heartbeat", float)):
                    if column not in db["runs"].columns_dict:
                        db["runs"].add_column(column, kind)
        db["run_datasets"].create(
            {"run_id": str, "split": str, "hash": str, "problems": str}, pk=("run_id", "split"), if_not_exists=True,
        )
        db["rollouts"].create(
            {"key": str, "run_id": str, "epoch": int, "step": int, "problem_id": str, "sample": int,
             "library_version": str, "messages": str, "completion": str, "finish_reason": str,
             "prompt_tokens": int, "completion_tokens": int, "latency_s": float, "reward": float, "created": float,
             "shown": str},
            pk="key", if_not_exists=True,
        )
        db["learner_calls"].create(
            {"key": str, "run_id": str, "step": int, "stage": str, "subject": str, "attempt": int,
             "messages": str, "reply": str, "prompt_tokens": int, "completion_tokens": int, "valid": int,
             "error": str, "created": float},
            pk="key", if_not_exists=True,
        )
        db["versions"].create(
            {"id": str, "parent": str, "run_id": str, "step": int, "created": float, "content": str,
             "status": str, "config_hash": str, "evaluation": str, "leaf_index": int},
            pk="id", if_not_exists=True,
        )
        db["publications"].create(
            {"manifest": str, "version_id": str, "transport": str, "signer": str, "created": float, "direction": str},
            pk="manifest", if_not_exists=True,
        )
        db["anchors"].create({"tx": str, "root": str, "tree_size": int, "rpc_url": str, "created": float},
                             pk="tx", if_not_exists=True)
        db["ops"].create(
            {"run_id": str, "step": int, "seq": int, "stage": str, "version_id": str, "op": str, "accepted": int,
             "reason": str},
            pk=("run_id", "step", "stage", "seq"), if_not_exists=True,
        )
        db["steps"].create(
            {"run_id": str, "step": int, "epoch": int, "batch": int, "version_before": str, "version_after": str,
             "status": str, "tokens": str, "stats": str, "committed": float},
            pk=("run_id", "step"), if_not_exists=True,
        )
        db["serving"].create({"name": str, "version_id": str, "updated": float}, pk="name", if_not_exists=True)
        db["evaluations"].create({"id": str, "created": float, "dataset": str, "model": str, "problems": int,
                                  "samples": int, "report": str}, pk="id", if_not_exists=True)
        # the studio's pages are a few indexed queries each (benchmarks/studio_pages.py)
        for table, cols in [("rollouts", ["run_id", "step"]), ("learner_calls", ["run_id", "step"]),
                            ("versions", ["run_id", "step"]), ("versions", ["parent"]), ("versions", ["created"]),
                            ("versions", ["leaf_index"]), ("ops", ["version_id"]), ("runs", ["created"]),
                            # token sums per run and stage read the index alone, not the rows' long prompts
                            ("rollouts", ["run_id", "problem_id", "prompt_tokens", "completion_tokens"]),
                            ("learner_calls", ["run_id", "stage", "prompt_tokens", "completion_tokens"])]:
            db[table].create_index(cols, if_not_exists=True)
        if "versions" in db.table_names() and db["versions"].count == 0:
            self.put_version(EMPTY_LIBRARY, run_id="", status="promoted")

    # --- runs -----------------------------------------------------------------------------------------------

    @_writes
    def new_run(self, kind: str, config: dict[str, Any], model: str, dataset: str, version: str) -> str:
        """Record a new run, held by this store (its heartbeat runs until `finish_run`)."""
        run_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
        now = time.time()
        with self._immediate():
            self.db["runs"].insert(
                {"id": run_id, "kind": kind, "status": "running", "created": now, "updated": now,
                 "config": json.dumps(config, sort_keys=True), "config_hash": config_hash(config), "model": model,
                 "dataset": dataset, "current_version": version, "summary": "{}", "owner": self.owner,
                 "heartbeat": now}
            )
        self._beat(run_id)
        return run_id

    def run_config(self, run_id: str, kind: str, model: type[BaseModel], **updates: Any) -> tuple[str, Any]:
        """A run's full id and its stored config, to resume it exactly as started (`updates`, where not None,
        replace fields such as a raised budget, for this resume: the stored config keeps what the run started with)."""
        run = self.run(run_id)
        if run["kind"] != kind:
            raise ConfigError(f"run {run['id']} is a {run['kind']} run, not a{'n' if kind[0] in 'aeiou' else ''} {kind} run")
        changes = {k: v for k, v in updates.items() if v is not None}
        return run["id"], model.model_validate({**run["config"], **changes})  # a change is checked like the rest

    @_writes
    def claim_run(self, run_id: str) -> None:
        """Hold a run for this store before resuming it, and keep it alive until `finish_run`.

        A run held by another live process raises StoreError naming that process; a run whose heartbeat stopped
        (its process crashed) is taken over. Claiming a run this store already holds is a no-op.
        """
        now = time.time()
        with self._immediate():  # check and take in one write transaction: two resumes cannot both win
            row = self.db["runs"].get(self.run(run_id)["id"])
            if row["status"] == "running" and row["owner"] != self.owner and not self._stale(row, now):
                raise StoreError(f"run {row['id']} is running in process {row['owner']} (alive "
                                 f"{now - row['heartbeat']:.0f} s ago): wait for it to end, or stop it first")
            self.db["runs"].update(row["id"], {"status": "running", "owner": self.owner, "heartbeat": now})
        self._beat(row["id"])

    def run(self, run_id: str) -> dict[str, Any]:
        matches = list(self.db["runs"].rows_where("id = ? or id like ?", [run_id, f"%{run_id}"]))
        if len(matches) != 1:
            raise UnknownRun(f"no run {run_id!r}" if not matches else f"{run_id!r} names {len(matches)} runs")
        row = self._shown(matches[0])
        row["config"] = json.loads(row["config"])
        row["summary"] = json.loads(row["summary"] or "{}")
        return row

    def runs(self) -> list[dict[str, Any]]:
        return [
            {**self._shown(r), "summary": json.loads(r["summary"] or "{}")}
            for r in self.db["runs"].rows_where(order_by="created desc")
        ]

    @_writes
    def finish_run(self, run_id: str, status: str, summary: dict[str, Any]) -> None:
        """Record how a run ended and let go of it (stops its heartbeat)."""
        stop = self._beating.pop(run_id, None)
        if stop is not None:
            stop.set()
            self._heartbeat_file(run_id).unlink(missing_ok=True)
        with self._immediate():
            self.db["runs"].update(run_id, {"status": status, "updated": time.time(), "summary": json.dumps(summary),
                                            "owner": ""})

    def _stale(self, row: dict[str, Any], now: float) -> bool:
        return run_is_stale(self.root, row, now, self.heartbeat_s)

    def _shown(self, row: dict[str, Any]) -> dict[str, Any]:
        """A run marked running whose heartbeat stopped is shown as crashed: its process died without a word."""
        row["status"] = shown_status(self.root, row, self.heartbeat_s)
        return row

    def _beat(self, run_id: str) -> None:
        """Mark a held run alive every `heartbeat_s` by touching a file of its own (`heartbeats/RUN`): a second
        writer on the database would break the main connection's transactions (SQLITE_BUSY_SNAPSHOT in WAL)."""
        if run_id in self._beating:
            return
        stop = self._beating[run_id] = threading.Event()
        path = self._heartbeat_file(run_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.owner)

        def beat() -> None:
            while not stop.wait(self.heartbeat_s):
                with contextlib.suppress(OSError):
                    os.utime(path)

        threading.Thread(target=beat, name=f"heartbeat {run_id}", daemon=True).start()

    def _heartbeat_file(self, run_id: str) -> Path:
        return self.root / "heartbeats" / run_id

    @contextlib.contextmanager
    def _immediate(self) -> Iterator[None]:
        """A write transaction that takes the write lock before it reads, so a check stays true until the write it
        guards commits (with a plain BEGIN, another process could write in between). Nested: a savepoint.

        Every write goes through here, even one that checks nothing: sqlite-utils reads the schema before it
        inserts, and a transaction that read first and then writes after another process committed fails at once
        with "database is locked" (SQLITE_BUSY_SNAPSHOT in WAL), whatever the busy timeout. Seen as an optimize
        crash while `serve` read and a version was promoted (tests/test_attack_concurrency.py)."""
        if self.db.conn.in_transaction:
            with self.db.atomic():
                yield
            return
        self.db.conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            if self.db.conn.in_transaction:  # SQLite has rolled back itself after SQLITE_FULL or an I/O error
                self.db.conn.execute("ROLLBACK")
            raise
        self.db.conn.execute("COMMIT")

    # --- the dataset a run was started on -----------------------------------------------------------------------

    @_writes
    def check_dataset(self, run_id: str, problems: Sequence[Problem], split: str = "train") -> None:
        """Record the content of a run's problems on the first call; on every later one (a resume), raise
        ConfigError if they changed. Stored rollouts and learner replies are keyed by problem id, and ids default
        to row numbers: a row deleted before `--resume` would pair them with the wrong problems.

        >>> store.check_dataset(run_id, problems)               # after loading, before the first step
        >>> store.check_dataset(run_id, val_problems, "val")
        """
        digest = dataset_hash(problems)
        with self._immediate():
            rows = list(self.db["run_datasets"].rows_where("run_id = ? and split = ?", [run_id, split]))
            if not rows:  # a new run, or one started before datasets were recorded: its content from now on
                self.db["run_datasets"].insert({"run_id": run_id, "split": split, "hash": digest, "problems":
                                                json.dumps([list(f) for f in fingerprints(problems)])})
                return
        if rows[0]["hash"] == digest:
            return
        before = dict(json.loads(rows[0]["problems"]))
        now = dict(fingerprints(problems))
        differences = [
            f"{len(ids)} {what} ({', '.join(ids[:5])}{', ...' if len(ids) > 5 else ''})"
            for what, ids in [("problems changed", [i for i in before if i in now and now[i] != before[i]]),
                              ("missing", [i for i in before if i not in now]),
                              ("added", [i for i in now if i not in before])] if ids
        ] or ["the problems are in another order"]
        raise ConfigError(f"the {split} dataset of run {run_id} changed since the run started: "
                          f"{'; '.join(differences)}. Its stored rollouts would be paired with the wrong problems: "
                          f"restore the original data, or start a new run")

    # --- rollouts ---------------------------------------------------------------------------------------------

    @_writes
    def put_rollouts(self, run_id: str, epoch: int, step: int, rollouts: list[Rollout]) -> None:
        rows = [
            {"key": rollout_key(run_id, step, r.problem_id, r.sample, _version_in_key(r)), "run_id": run_id,
             "epoch": epoch, "step": step, "problem_id": r.problem_id, "sample": r.sample, "library_version": r.library_version,
             "messages": json.dumps(r.messages), "completion": r.completion, "finish_reason": r.finish_reason,
             "prompt_tokens": r.prompt_tokens, "completion_tokens": r.completion_tokens, "latency_s": r.latency_s,
             "reward": r.reward, "created": time.time(), "shown": json.dumps(list(r.shown))}
            for r in rollouts
        ]
        with self._immediate():  # see _immediate: a read-then-write upgrade fails at once
            self.db["rollouts"].insert_all(rows, replace=True, alter=True)

    def rollouts(self, run_id: str, step: int | None = None, validation: bool = False) -> list[Rollout]:
        """A run's rollouts (of one step); `validation`: only the validation ones."""
        where, args = ("run_id = ?", [run_id]) if step is None else ("run_id = ? and step = ?", [run_id, step])
        if validation:
            where += " and problem_id like 'val/%'"
        return [
            Rollout(
                problem_id=r["problem_id"], sample=r["sample"], messages=json.loads(r["messages"]),
                completion=r["completion"], finish_reason=r["finish_reason"], prompt_tokens=r["prompt_tokens"],
                completion_tokens=r["completion_tokens"], latency_s=r["latency_s"], reward=r["reward"],
                library_version=r["library_version"], shown=tuple(json.loads(r.get("shown") or "[]")),
            )
            for r in self.db["rollouts"].rows_where(where, args, order_by="step, problem_id, sample")
        ]

    # --- learner calls ----------------------------------------------------------------------------------------

    def learner_call(self, run_id: str, step: int, stage: str, subject: str, attempt: int) -> dict | None:
        key = f"{run_id}/{step}/{stage}/{subject}/{attempt}"
        rows = list(self.db["learner_calls"].rows_where("key = ?", [key]))
        return rows[0] if rows else None

    @_writes
    def put_learner_call(self, run_id: str, step: int, stage: str, subject: str, attempt: int, **fields: Any) -> None:
        key = f"{run_id}/{step}/{stage}/{subject}/{attempt}"
        row = {"key": key, "run_id": run_id, "step": step, "stage": stage, "subject": subject, "attempt": attempt,
               "created": time.time(), **fields}
        row["messages"] = json.dumps(row.get("messages", []))
        with self._immediate():  # see _immediate: a read-then-write upgrade fails at once
            self.db["learner_calls"].insert(row, replace=True)

    # --- versions and steps -------------------------------------------------------------------------------------

    @_writes
    def put_version(self, version: LibraryVersion, run_id: str, status: str, config_hash: str = "",
                    evaluation: dict | None = None, ops: list[Any] | None = None) -> None:
        """Record a version and append its entry to the Merkle log, in one transaction (a version already
        recorded, by this process or another, is left as it is: versions are immutable)."""
        with self._immediate():
            if self.db["versions"].count_where("id = ?", [version.id]):
                return
            created = time.time()
            leaf_index = self._log(version, run_id, status, ops or [], config_hash, evaluation, created)
            self.db["versions"].insert(
                {"id": version.id, "parent": version.parent, "run_id": run_id, "step": version.step,
                 "created": created, "content": version.canonical_bytes().decode(), "status": status,
                 "config_hash": config_hash, "evaluation": json.dumps(evaluation or {}), "leaf_index": leaf_index},
            )

    def _log(self, version: LibraryVersion, run_id: str, status: str, ops: list[Any], config_hash: str = "",
             evaluation: dict | None = None, created: float | None = None) -> int:
        """Append the version's log entry: its CID, its parent's, the digest of the ops that made it, the digests
        of its run's config and of the gate's evaluation, and its creation time, so `ledger verify` covers every
        column of the version's row."""
        entry = canonical({"version": version.id, "parent": version.parent, "run": run_id, "step": version.step,
                           "status": status, "ops_sha256": hashlib.sha256(canonical(ops)).hexdigest(),
                           "config_hash": config_hash, "created": created,
                           "evaluation_sha256": hashlib.sha256(canonical(evaluation or {})).hexdigest()})
        self.db.execute("INSERT INTO leaf(entry, hash) VALUES (?, ?)", [entry, leaf_hash(entry)])
        return self.db.execute("SELECT max(id) FROM leaf").fetchone()[0]

    def log_event(self, entry: dict[str, Any]) -> int:
        """Append an entry that is not a version (a promotion) to the Merkle log; its leaf index. Call it inside the
        transaction that records the event, so both commit together."""
        data = canonical(entry)
        self.db.execute("INSERT INTO leaf(entry, hash) VALUES (?, ?)", [data, leaf_hash(data)])
        return self.db.execute("SELECT max(id) FROM leaf").fetchone()[0]

    def version(self, ref: str) -> LibraryVersion:
        """A version by full id or unique prefix; `empty` is the empty library. The prefix is compared as plain text
        (never a LIKE pattern, where `%` and `_` would match anything)."""
        if ref == "empty":
            return EMPTY_LIBRARY
        rows = list(self.db["versions"].rows_where("substr(id, 1, ?) = ?", [len(ref), ref], select="id, content"))
        rows = [r for r in rows if r["id"] == ref] or rows
        if not ref or len(rows) != 1:
            raise UnknownVersion(f"no library version {ref!r}" if not rows else f"{ref!r} names {len(rows)} versions")
        return LibraryVersion.model_validate_json(rows[0]["content"])

    def version_row(self, version_id: str) -> dict[str, Any]:
        return self.db["versions"].get(version_id)

    def versions(self, run_id: str | None = None) -> list[dict[str, Any]]:
        where, args = ("run_id = ?", [run_id]) if run_id else (None, None)
        return list(self.db["versions"].rows_where(where, args, order_by="created", select="id, parent, run_id, step, status, created"))

    @_writes
    def commit_step(self, run_id: str, step: int, epoch: int, batch: int, before: LibraryVersion,
                    after: LibraryVersion, verdicts: list[tuple[str, OpVerdict]], status: str, tokens: dict,
                    stats: dict, cfg_hash: str, evaluation: dict | None = None) -> None:
        """Everything a step decided, in one transaction: the new version (`status` promoted or rejected), every op
        verdict, the step row and the run's current version. A crash before COMMIT leaves the store exactly as the
        previous step left it."""
        current = after.id if status == "promoted" else before.id
        with self._immediate():
            if after.id != before.id:
                applied = [json.loads(v.op.model_dump_json()) for stage, v in verdicts if stage == "apply" and v.accepted]
                self.put_version(after, run_id, status, cfg_hash, evaluation, applied)
            self.db["ops"].insert_all(
                [{"run_id": run_id, "step": step, "seq": seq, "stage": stage, "version_id": after.id,
                  "op": v.op.model_dump_json() if isinstance(v.op, BaseModel) else json.dumps(v.op),
                  "accepted": int(v.accepted), "reason": v.reason}
                 for seq, (stage, v) in enumerate(verdicts)],
                replace=True,
            )
            self.db["steps"].insert(
                {"run_id": run_id, "step": step, "epoch": epoch, "batch": batch, "version_before": before.id,
                 "version_after": current, "status": status, "tokens": json.dumps(tokens), "stats": json.dumps(stats),
                 "committed": time.time()},
                replace=True,
            )
            self.db["runs"].update(run_id, {"current_version": current, "updated": time.time()})

    @_writes
    def promote(self, version_id: str, name: str = "default") -> None:
        """Make a version the one `gym-tf serve` answers with (read per request: no restart needed)."""
        self.version(version_id)  # must exist
        with self._immediate():
            self.db["serving"].insert({"name": name, "version_id": version_id, "updated": time.time()}, replace=True)

    def served_version_id(self, name: str = "default") -> str | None:
        # Read on every served request: a plain execute, without sqlite-utils' per-query savepoint.
        row = self.db.conn.execute("select version_id from serving where name = ?", [name]).fetchone()
        return row[0] if row else None

    def put_evaluation(self, report: dict[str, Any], dataset: str, model: str, problems: int, samples: int) -> str:
        """Record an `eval` report (one library or a comparison) so the studio can show it; returns its id."""
        evaluation_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
        with self.db.atomic():
            self.db["evaluations"].insert({"id": evaluation_id, "created": time.time(), "dataset": dataset,
                                           "model": model, "problems": problems, "samples": samples,
                                           "report": json.dumps(report)})
        return evaluation_id

    def steps(self, run_id: str) -> list[dict[str, Any]]:
        return [
            {**s, "tokens": json.loads(s["tokens"]), "stats": json.loads(s["stats"])}
            for s in self.db["steps"].rows_where("run_id = ?", [run_id], order_by="step")
        ]

    def ops(self, run_id: str | None = None, version_id: str | None = None) -> Iterator[dict[str, Any]]:
        where = " and ".join(c for c, v in [("run_id = ?", run_id), ("version_id = ?", version_id)] if v)
        args = [v for v in (run_id, version_id) if v]
        yield from self.db["ops"].rows_where(where or None, args or None, order_by="run_id, step, seq")

    def usage(self, run_id: str) -> dict[str, dict[str, int]]:
        """Prompt and completion tokens per stage, summed from every stored reply."""
        totals: dict[str, dict[str, int]] = {}
        for row in self.db.query(
            f"select {ROLLOUT_STAGE_SQL} as stage, sum(prompt_tokens) p, sum(completion_tokens) c from rollouts "
            "where run_id = ? group by 1 "
            "union all select stage, sum(prompt_tokens), sum(completion_tokens) from learner_calls "
            "where run_id = ? group by stage", [run_id, run_id]
        ):
            if row["p"] is not None:
                totals[row["stage"]] = {"prompt": row["p"], "completion": row["c"]}
        return totals
