"""An append-only Merkle log (RFC 6962 / Certificate Transparency hashing) on pymerkle's SQLite tree.

The `leaf` table is pymerkle's own (append-only by trigger). `leaf_row(entry)` lets a caller insert a leaf inside
its own transaction, so a library version and its log entry commit together.
"""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path
from typing import Any

from pymerkle import InmemoryTree, InvalidProof, MerkleProof, SqliteTree, verify_consistency, verify_inclusion

from ledger.errors import ProofError, TamperedError

_HASHER = InmemoryTree()


def leaf_hash(entry: bytes) -> bytes:
    return _HASHER.hash_buff(entry)


class MerkleLog:
    def __init__(self, path: str | Path):
        _check_contiguous(path)
        self.tree = SqliteTree(str(path))
        # pymerkle commits every append; WAL + synchronous=NORMAL is what makes >10k appends/s possible.
        self.tree.con.execute("PRAGMA journal_mode=WAL")
        self.tree.con.execute("PRAGMA synchronous=NORMAL")

    @property
    def size(self) -> int:
        return self.tree.get_size()

    def append(self, entry: bytes) -> int:
        return self.tree.append_entry(entry)

    def entry(self, index: int) -> bytes:
        return self.tree.get_entry(index)

    def root(self, size: int | None = None) -> str:
        size = self.size if size is None else size
        return self.tree.get_root(size).hex() if size else ""

    def prove(self, index: int, size: int | None = None) -> dict[str, Any]:
        return self.tree.prove_inclusion(index, size or self.size).serialize()

    def prove_consistency(self, old_size: int, new_size: int | None = None) -> dict[str, Any]:
        return self.tree.prove_consistency(old_size, new_size or self.size).serialize()

    def size_of_root(self, root: str) -> int:
        """The tree size at which the log had this root (roots are looked up, newest first)."""
        for size in range(self.size, 0, -1):
            if self.root(size) == root:
                return size
        raise ProofError(f"root {root[:16]}… never occurred in this log")

    def audit(self) -> str:
        """Re-derive every leaf hash from its stored entry, then the root; name the first bad leaf. Returns the root."""
        with contextlib.closing(sqlite3.connect(self.tree.dbfile)) as con:  # pymerkle's own returns one column
            rows = con.execute("SELECT id, entry, hash FROM leaf ORDER BY id").fetchall()
        fresh = InmemoryTree()
        for index, (row_id, entry, stored) in enumerate(rows, start=1):
            if row_id != index:
                raise TamperedError(f"ledger leaf {index}: missing (ids jump to {row_id})")
            if leaf_hash(entry) != stored:
                raise TamperedError(f"ledger leaf {index}: its entry does not hash to its stored hash")
            fresh.append_entry(entry)
        root = fresh.get_root(len(rows)).hex() if rows else ""
        if rows and root != self.root():
            raise TamperedError("ledger root: recomputed root differs from the stored tree's")
        return root

    def close(self) -> None:
        self.tree.close()


def _check_contiguous(path: str | Path) -> None:
    """Leaf ids run 1, 2, 3, ...: pymerkle refuses to open a log where they do not, with a bare ValueError; this
    names the first leaf out of place instead (a flipped byte in a leaf id, found by tests/test_attack_ledger.py)."""
    with contextlib.closing(sqlite3.connect(path)) as con:
        if not con.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'leaf'").fetchone():
            return
        for index, (row_id,) in enumerate(con.execute("SELECT id FROM leaf ORDER BY id"), start=1):
            if row_id != index:
                raise TamperedError(f"ledger leaf {index}: missing (ids jump to {row_id})")


def verify_entry(entry: bytes, root: str, proof: dict[str, Any]) -> None:
    """Check that `entry` is in the log whose root is `root`; raise ProofError otherwise."""
    try:
        verify_inclusion(leaf_hash(entry), bytes.fromhex(root), MerkleProof.deserialize(proof))
    except (InvalidProof, ValueError, KeyError, TypeError) as exc:
        if "Base hash" in str(exc):  # the proof starts from another leaf than this entry's hash
            raise TamperedError("log entry: does not hash to the leaf its inclusion proof starts from") from None
        raise ProofError(f"inclusion proof: does not verify against root {root[:16]}…: {exc or 'invalid'}") from None


def verify_append_only(old_root: str, new_root: str, proof: dict[str, Any]) -> None:
    """Check that the log with `new_root` extends the one with `old_root` (history only appended to)."""
    try:
        verify_consistency(bytes.fromhex(old_root), bytes.fromhex(new_root), MerkleProof.deserialize(proof))
    except (InvalidProof, ValueError, KeyError, TypeError) as exc:
        raise ProofError(f"consistency proof: {old_root[:16]}… -> {new_root[:16]}… does not verify: {exc or 'invalid'}") from None
