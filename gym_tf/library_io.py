"""Library files (export / import) and the difference between two versions."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gym_tf.errors import LibraryError, UnknownVersion
from gym_tf.library import LibraryVersion, short
from gym_tf.store import RunStore

FORMAT = "gym-tf-library/1"


def export_library(version: LibraryVersion, path: str | Path) -> None:
    document = {"format": FORMAT, "id": version.id, "library": version.model_dump(mode="json")}
    Path(path).write_text(json.dumps(document, indent=2, sort_keys=True), encoding="utf-8")


def read_library_file(path: str | Path) -> LibraryVersion:
    """Read an exported library; its recorded id must match its content."""
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
        version = LibraryVersion.model_validate(document["library"])
    except (OSError, json.JSONDecodeError, KeyError, TypeError, ValidationError) as exc:
        raise LibraryError(f"{path}: not a gym-tf library file ({str(exc).splitlines()[0]})") from None
    if document.get("id") != version.id:
        raise LibraryError(f"{path}: content hashes to {short(version.id)}, but the file claims {short(str(document.get('id')))}")
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
