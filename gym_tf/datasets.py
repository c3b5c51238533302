"""Problems with verifiable answers, loaded from JSONL, CSV, Parquet or a local HuggingFace `datasets` directory.

>>> problems = load_dataset("aime.jsonl")          # {"problem": ..., "answer": ...} per line
>>> problems[0].problem, problems[0].answer
>>> problems = open_dataset("big.jsonl")          # the same problems, read from the file when asked for
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import tempfile
from dataclasses import dataclass, field
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import Any, Sequence

from gym_tf.chat import conversation_error, conversation_text, without_nulls
from gym_tf.errors import DatasetError

# Column names recognised when none is given, in order of preference.
PROBLEM_FIELDS = ("problem", "question", "prompt")
ANSWER_FIELDS = ("answer", "solution", "final_answer")
ID_FIELDS = ("id", "problem_id", "uid")
# A row may carry the chat to answer, as an OpenAI request's messages (recorded traffic, a chat-format dataset): the
# model is then asked those messages, with the library injected as `serve` injects it (`Problem.conversation`); with
# no problem column, they are the problem text too.
CONVERSATION_FIELD = "messages"

BUNDLED = {"quickstart": "quickstart.jsonl"}


@dataclass(frozen=True)
class Problem:
    """One dataset row: the text the model answers, the reference answer, and every other column (for rewards)."""

    id: str
    problem: str
    answer: str | None
    row: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def conversation(self) -> list[dict[str, Any]] | None:
        """The chat to answer: the row's `messages` when they are a conversation that ends with the user's turn (or
        a tool's result), as fresh copies; else None, and the problem text is asked under gym-tf's own solve
        instructions. (`messages` that end with the assistant's reply, as in fine-tuning data, are an ordinary
        column.)"""
        value = self.row.get(CONVERSATION_FIELD)
        return None if value is None or conversation_error(value) else without_nulls(value)

    @cached_property
    def content_hash(self) -> str:
        """sha256 of everything a reward or prompt may read (text, answer, every column): what a resumed run
        checks its dataset against, since ids alone (row numbers by default) shift when a row is deleted."""
        content = {"problem": self.problem, "answer": self.answer, "row": self.row}
        # default=str: a Parquet or `datasets` column may hold values JSON cannot (dates, arrays).
        return hashlib.sha256(json.dumps(content, sort_keys=True, default=str).encode()).hexdigest()


def fingerprints(problems: Sequence[Problem]) -> list[tuple[str, str]]:
    """(id, content hash) of every problem, in order; a lazy set has them without reading its rows again."""
    if isinstance(problems, LazyProblems):
        return problems.fingerprints
    return [(p.id, p.content_hash) for p in problems]


def dataset_hash(problems: Sequence[Problem]) -> str:
    """sha256 of a dataset's problems, ids and contents, in order (the order decides which problems share a step)."""
    return hashlib.sha256(json.dumps([list(f) for f in fingerprints(problems)]).encode()).hexdigest()


class LazyProblems(Sequence[Problem]):
    """A JSONL dataset kept on disk: every row is read and checked once when it is opened (so a bad row still
    stops the load with its line), and what stays in memory is its offset, id and content hash; a problem is
    parsed again when asked for. Memory grows by about 150 bytes a problem, not by the size of the rows.

    With `index_dir`, that index is saved there, and opening the same file again (a resume) while its size,
    modification time and inode are unchanged reads the index instead of every row. A row changed behind an unchanged
    stat is still caught when it is read: its content hash no longer matches."""

    def __init__(self, path: Path, settings: tuple, limit: int | None, index_dir: Path | None = None):
        self.path = path
        self._settings = settings  # problem_field, answer_field, id_field, require_answer
        self._offsets: list[int] = []
        self.fingerprints: list[tuple[str, str]] = []
        stat = path.stat()
        self._stat = [stat.st_size, stat.st_mtime_ns, stat.st_ino]  # before the scan: a write during it shows next time
        key = json.dumps([str(path.resolve()), list(settings), limit])
        index = index_dir / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.json" if index_dir else None
        if index is not None and self._read_index(index):
            return
        self._scan(limit)
        if index is not None:
            self._write_index(index)

    def _scan(self, limit: int | None) -> None:
        seen: set[str] = set()
        with self.path.open("rb") as lines:
            offset, number = 0, 0
            for raw in lines:
                number += 1
                if raw.strip():
                    problem = self._parse(raw, number, len(self._offsets))
                    if problem.id in seen:
                        raise DatasetError(f"{self.path}:line {number}: duplicate id {problem.id!r}")
                    seen.add(problem.id)
                    self._offsets.append(offset)
                    self.fingerprints.append((problem.id, problem.content_hash))
                    if limit is not None and len(self._offsets) >= limit:
                        break
                offset += len(raw)
        if not self._offsets:
            raise DatasetError(f"{self.path}: the dataset has no rows")

    def _write_index(self, index: Path) -> None:
        """Saved whole or not at all (a unique partial file, renamed); where it cannot be written, the next opening
        scans again."""
        try:
            index.parent.mkdir(parents=True, exist_ok=True)
            handle, partial = tempfile.mkstemp(dir=index.parent, suffix=".partial")
        except OSError:
            return
        try:
            with os.fdopen(handle, "w") as out:
                json.dump({"stat": self._stat, "offsets": self._offsets, "fingerprints": self.fingerprints}, out)
            os.replace(partial, index)
        except OSError:
            Path(partial).unlink(missing_ok=True)

    def _read_index(self, index: Path) -> bool:
        """The saved index, if it is for this file as it is now; an unreadable one is scanned over."""
        try:
            saved = json.loads(index.read_text())
            offsets = [int(o) for o in saved["offsets"]]
            fingerprints = [(str(i), str(h)) for i, h in saved["fingerprints"]]
            if saved["stat"] != self._stat or not len(offsets) == len(fingerprints) > 0:
                return False
        except (OSError, ValueError, KeyError, TypeError):
            return False
        self._offsets, self.fingerprints = offsets, fingerprints
        return True

    def _parse(self, raw: bytes, number: int, index: int) -> Problem:
        try:
            row = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise DatasetError(f"{self.path}:line {number}: invalid JSON ({exc})") from None
        return _to_problem(self.path, f"line {number}", row, *self._settings, index)

    def __len__(self) -> int:
        return len(self._offsets)

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        offset = self._offsets[index]
        with self.path.open("rb") as handle:
            handle.seek(offset)
            raw = handle.readline()
        problem = self._parse(raw, 0, index if index >= 0 else len(self) + index)
        if problem.content_hash != self.fingerprints[index][1]:
            raise DatasetError(f"{self.path}: changed while the run reads it (problem {problem.id})")
        return problem


def open_dataset(
    source: str | Path,
    problem_field: str | None = None,
    answer_field: str | None = None,
    id_field: str | None = None,
    require_answer: bool = True,
    limit: int | None = None,
    index_dir: Path | None = None,
) -> Sequence[Problem]:
    """Like `load_dataset`, but a JSONL file stays on disk and rows are read as they are needed (big datasets).
    Other formats load whole (a `datasets` directory is memory-mapped by Arrow already). `index_dir` keeps the JSONL
    file's index for the next opening (see `LazyProblems`)."""
    path = bundled_path(str(source)) if str(source) in BUNDLED else Path(source)
    if path.suffix in (".jsonl", ".json") and path.is_file():
        return LazyProblems(path, (problem_field, answer_field, id_field, require_answer), limit, index_dir)
    return load_dataset(source, problem_field, answer_field, id_field, require_answer, limit)


def bundled_path(name: str) -> Path:
    """Path of a dataset shipped inside the package (`quickstart`)."""
    return Path(str(resources.files("gym_tf") / "data" / BUNDLED[name]))


def load_dataset(
    source: str | Path,
    problem_field: str | None = None,
    answer_field: str | None = None,
    id_field: str | None = None,
    require_answer: bool = True,
    limit: int | None = None,
) -> list[Problem]:
    """Load problems from a file or directory; a bundled name (`quickstart`) is accepted too.

    A malformed row raises DatasetError naming the file, the line (or row) and what is wrong.
    """
    if str(source) in BUNDLED:
        source = bundled_path(str(source))
    path = Path(source)
    if not path.exists():
        raise DatasetError(f"{path}: no such dataset file or directory")
    if path.is_dir():
        rows = _hf_rows(path)
    elif path.suffix == ".jsonl" or path.suffix == ".json":
        rows = _jsonl_rows(path)
    elif path.suffix == ".csv":
        rows = _csv_rows(path)
    elif path.suffix == ".parquet":
        rows = _parquet_rows(path)
    else:
        raise DatasetError(f"{path}: unknown dataset format (use .jsonl, .csv, .parquet or a `datasets` directory)")

    problems: list[Problem] = []
    seen: set[str] = set()
    for where, row in rows:
        problem = _to_problem(path, where, row, problem_field, answer_field, id_field, require_answer, len(problems))
        if problem.id in seen:
            raise DatasetError(f"{path}:{where}: duplicate id {problem.id!r}")
        seen.add(problem.id)
        problems.append(problem)
        if limit is not None and len(problems) >= limit:
            break
    if not problems:
        raise DatasetError(f"{path}: the dataset has no rows")
    return problems


def _pick(row: dict[str, Any], chosen: str | None, defaults: tuple[str, ...]) -> str | None:
    if chosen is not None:
        return chosen if chosen in row else None
    return next((name for name in defaults if name in row), None)


def _to_problem(path, where, row, problem_field, answer_field, id_field, require_answer, index) -> Problem:
    if not isinstance(row, dict):
        raise DatasetError(f"{path}:{where}: expected an object with named fields, got {type(row).__name__}")
    p_name = _pick(row, problem_field, PROBLEM_FIELDS)
    conversation = row.get(CONVERSATION_FIELD)
    if p_name is None and conversation is not None and problem_field is None:  # a chat-format row
        if why := conversation_error(conversation):
            raise DatasetError(f"{path}:{where}: field {CONVERSATION_FIELD!r} {why}")
        text = conversation_text(conversation)
    elif p_name is None:
        wanted = problem_field or " / ".join(PROBLEM_FIELDS)
        raise DatasetError(f"{path}:{where}: no problem field ({wanted}); fields are {sorted(row)}")
    else:
        text = row[p_name]
    if not isinstance(text, str) or not text.strip():
        raise DatasetError(f"{path}:{where}: field {p_name!r} must be a non-empty string")
    a_name = _pick(row, answer_field, ANSWER_FIELDS)
    answer = row.get(a_name) if a_name else None
    if answer is None and require_answer:
        wanted = answer_field or " / ".join(ANSWER_FIELDS)
        raise DatasetError(f"{path}:{where}: no answer field ({wanted}); fields are {sorted(row)}")
    i_name = _pick(row, id_field, ID_FIELDS)
    pid = str(row[i_name]) if i_name else str(index)
    return Problem(id=pid, problem=text, answer=None if answer is None else str(answer), row=dict(row))


def _jsonl_rows(path: Path):
    # read as bytes and decode line by line, so that bytes which are not UTF-8 are named by their line
    with path.open("rb") as lines:
        for number, raw in enumerate(lines, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DatasetError(f"{path}:line {number}: not UTF-8 text (byte {exc.start + 1})") from None
            if not line.strip():
                continue
            try:
                yield f"line {number}", json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{path}:line {number}: invalid JSON ({exc.msg} at column {exc.colno})") from None


def _csv_rows(path: Path):
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise DatasetError(f"{path}:line {line}: not UTF-8 text") from None
    reader = csv.DictReader(io.StringIO(text, newline=""))
    try:
        for row in reader:
            if None in row:
                raise DatasetError(f"{path}:line {reader.line_num}: more cells than the header has columns")
            yield f"line {reader.line_num}", row
    except csv.Error as exc:
        raise DatasetError(f"{path}:line {reader.line_num}: not valid CSV ({exc})") from None


def _parquet_rows(path: Path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        rows = pq.read_table(path).to_pylist()
    except (pa.ArrowException, OSError, UnicodeDecodeError) as exc:  # a corrupt file; a column name not UTF-8
        raise DatasetError(f"{path}: not a readable Parquet file ({str(exc).splitlines()[0][:200]})") from None
    for number, row in enumerate(rows):
        yield f"row {number}", row


def _hf_rows(path: Path):
    try:
        import datasets
    except ImportError:
        raise DatasetError(f"{path}: reading a `datasets` directory needs `pip install gym-tf[hf]`") from None
    try:
        data = datasets.load_from_disk(str(path))
    except FileNotFoundError as exc:
        raise DatasetError(f"{path}: not a directory written by `datasets.save_to_disk` ({exc})") from None
    if isinstance(data, datasets.DatasetDict):
        split = "train" if "train" in data else next(iter(data))
        data = data[split]
    for number, row in enumerate(data):
        yield f"row {number}", row
