"""Library files (export / import) and the difference between two versions."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from gym_tf.errors import LibraryError, UnknownVersion
from gym_tf.library import ExampleText, LibraryVersion, StoredLessonText, short
from gym_tf.store import RunStore

FORMAT = "gym-tf-library/1"
_TEXT_RULES = {"lesson": TypeAdapter(StoredLessonText), "example": TypeAdapter(ExampleText)}


def check_library(version: LibraryVersion) -> None:
    """The rules that every version made by ops obeys, checked on a version that comes from outside (a file, a
    fetch): ids `E1`, `E2`, ... distinct and in order, texts as long as the ops allow and not duplicated, and
    `next_number` above every id, so that a later `add` can never take an existing item's id."""
    numbers, seen = [], set()
    for item in version.items:
        if not re.fullmatch(r"E[1-9][0-9]*", item.id):
            raise LibraryError(f"item {item.id!r}: ids are E1, E2, ...")
        try:
            _TEXT_RULES[item.kind].validate_python(item.text)
        except ValidationError as exc:
            raise LibraryError(f"item {item.id}: {exc.errors()[0]['msg'].lower()}") from None
        key = " ".join(item.text.lower().split())
        if key in seen:
            raise LibraryError(f"item {item.id}: duplicates an earlier item")
        seen.add(key)
        numbers.append(int(item.id[1:]))
    if numbers != sorted(set(numbers)):
        raise LibraryError("items: ids must be distinct and in increasing order")
    highest = max(numbers, default=0)
    if version.next_number <= highest:
        raise LibraryError(f"next_number {version.next_number} is not above the highest id E{highest}: "
                           "the next add would overwrite that item")


def export_library(version: LibraryVersion, path: str | Path) -> None:
    document = {"format": FORMAT, "id": version.id, "library": version.model_dump(mode="json")}
    Path(path).write_text(json.dumps(document, indent=2, sort_keys=True), encoding="utf-8")


def read_library_file(path: str | Path) -> LibraryVersion:
    """Read an exported library; its recorded id must match its content, and it must obey the item rules."""
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
        version = LibraryVersion.model_validate(document["library"])
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValidationError) as exc:
        raise LibraryError(f"{path}: not a gym-tf library file ({str(exc).splitlines()[0]})") from None
    if document.get("id") != version.id:
        raise LibraryError(f"{path}: content hashes to {short(version.id)}, but the file claims {short(str(document.get('id')))}")
    try:
        check_library(version)
    except LibraryError as exc:
        raise LibraryError(f"{path}: {exc}") from None
    return version


def resolve_library(store: RunStore, ref: str | None) -> LibraryVersion:
    """A library by version id (or prefix), `empty`, `latest` (newest promoted) or an exported file's path."""
    if ref is None or ref == "empty":
        return store.version("empty")
    if Path(ref).is_file():
        return read_library_file(ref)
    if ref == "latest":
        promoted = [v for v in store.versions() if v["status"] == "promoted"]
        return store.version(promoted[-1]["id"])
    return store.version(ref)


@dataclass(frozen=True)
class LibraryDiff:
    added: list[dict[str, Any]]
    removed: list[dict[str, Any]]
    changed: list[tuple[dict[str, Any], dict[str, Any]]]
    ops: list[dict[str, Any]]  # accepted ops recorded on the path from old to new, in order


def diff_versions(store: RunStore, old: LibraryVersion, new: LibraryVersion) -> LibraryDiff:
    before = {i.id: i.model_dump() for i in old.items}
    after = {i.id: i.model_dump() for i in new.items}
    chain, cursor = [], new
    while cursor.id != old.id and cursor.parent:
        chain.append(cursor.id)
        try:
            cursor = store.version(cursor.parent)
        except UnknownVersion:
            break
    ops = []
    if cursor.id == old.id:
        for version_id in reversed(chain):
            ops += [json.loads(o["op"]) for o in store.ops(version_id=version_id) if o["accepted"] and o["stage"] == "apply"]
    return LibraryDiff(
        added=[after[i] for i in after if i not in before],
        removed=[before[i] for i in before if i not in after],
        changed=[(before[i], after[i]) for i in after if i in before and before[i]["text"] != after[i]["text"]],
        ops=ops,
    )
