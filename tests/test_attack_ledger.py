"""Single flipped bytes, at random positions, in everything the ledger vouches for (issue #17): a stored version row,
a log row, a published manifest, its inclusion proof, the library bytes it points to. Each flip must make
`ledger verify` or `fetch` fail with a named error whose message names the part flipped, and `fetch` must import
nothing; after each flip the byte is put back and the ledger verifies again.

Quick tier: 300 flips. `pytest -m soak`: GYM_TF_SOAK_FLIPS (default 2,000).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sqlite3
from collections import Counter
from pathlib import Path

import pytest
from eth_account import Account

from conftest import run_cli
from fakes import ScriptedBackend
from gym_tf.config import OptimizeConfig
from gym_tf.datasets import load_dataset
from gym_tf.errors import LibraryError
from gym_tf.optimize import Optimizer
from gym_tf.publishing import fetch, publish, verify_ledger
from gym_tf.store import RunStore
from ledger.errors import LedgerError
from fakes import MemoryIpfs

QUICK, SOAK = 300, int(os.environ.get("GYM_TF_SOAK_FLIPS", "2000"))
VERSION_COLUMNS = ["id", "parent", "run_id", "step", "created", "content", "status", "config_hash", "evaluation",
                   "leaf_index"]
LEAF_COLUMNS = ["id", "entry", "hash"]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A workspace with a finished optimize run (several versions, a rejected one among them) and a publication."""
    root = tmp_path_factory.mktemp("attack-ledger") / "ws"
    store = RunStore(root)
    backend = ScriptedBackend({p.problem: p.answer for p in load_dataset("quickstart")})
    config = OptimizeConfig(dataset="quickstart", limit=8, batch_size=4, epochs=2, seed=2, val_dataset="quickstart",
                            val_samples=1)
    result = asyncio.run(Optimizer(config, store, backend).run())
    key, ipfs = Account.create(), MemoryIpfs()
    publication = publish(store, result.library.id, key, ipfs)
    verify_ledger(RunStore(root))
    return root, ipfs, publication, key.address


# --- flipping a byte of a stored value, and putting it back ---------------------------------------------------------


def _flip(raw: bytes, rng: random.Random) -> tuple[bytes, int]:
    at = rng.randrange(len(raw))
    return raw[:at] + bytes([raw[at] ^ rng.randint(1, 255)]) + raw[at + 1:], at


def _as_bytes(value) -> bytes:
    if isinstance(value, bytes):
        return value
    return (value if isinstance(value, str) else repr(value)).encode("utf-8")


def _unguarded(con: sqlite3.Connection) -> None:
    # pymerkle's append-only trigger, dropped as someone holding the file would (each RunStore puts it back)
    con.execute("drop trigger if exists leaf_no_update")


def flip_row(con: sqlite3.Connection, table: str, rowid: int, column: str, rng: random.Random):
    """Flip one byte of `column` in one row, kept in its storage class where the bytes still allow it. Returns the
    original value (to put back), the byte position and the row's rowid now, or None where there is no byte to flip
    (NULL) or SQLite refuses the flipped value."""
    _unguarded(con)
    original = con.execute(f"select {column} from {table} where rowid = ?", [rowid]).fetchone()[0]
    if original is None or _as_bytes(original) == b"":
        return None
    flipped, at = _flip(_as_bytes(original), rng)
    if isinstance(original, bytes):
        value, cast = flipped, "?"
    elif isinstance(original, (int, float)):
        text = flipped.decode("utf-8", "replace")
        try:
            value, cast = type(original)(text), "?"
        except ValueError:
            value, cast = flipped, "cast(? as text)"
    else:
        value, cast = flipped, "cast(? as text)"  # stored as TEXT even where the bytes are no longer UTF-8
    try:
        con.execute(f"update {table} set {column} = {cast} where rowid = ?", [value, rowid])
    except sqlite3.IntegrityError:  # a leaf id is the table's integer rowid: SQLite itself refuses text or a duplicate
        return None
    con.commit()
    moved = value if table == "leaf" and column == "id" else rowid
    return original, at, moved


def restore(con: sqlite3.Connection, table: str, rowid: int, column: str, original) -> None:
    """Put the original value back; `rowid` is where the row is now (a flipped leaf id moved it)."""
    _unguarded(con)
    con.execute(f"update {table} set {column} = ? where rowid = ?", [original, rowid])
    con.commit()


def names_version_part(message: str, row: dict) -> bool:
    """A flip in a version row is named by that version (its id, or what its id was flipped to) or its leaf."""
    return message.startswith("version ") or f"ledger leaf {row['leaf_index']}" in message


def store_flips(root: Path, count: int, rng: random.Random, tally: Counter) -> None:
    con = sqlite3.connect(root / "gym-tf.db")
    versions = [dict(zip(["rowid", *VERSION_COLUMNS], r)) for r in
                con.execute(f"select rowid, {', '.join(VERSION_COLUMNS)} from versions")]
    leaves = [r[0] for r in con.execute("select rowid from leaf")]
    while sum(tally[k] for k in ("version row", "leaf row")) < count:
        if rng.random() < 0.6:
            part, row = "version", rng.choice(versions)
            table, rowid, column = "versions", row["rowid"], rng.choice(VERSION_COLUMNS)
        else:
            part, rowid = "leaf", rng.choice(leaves)
            table, row, column = "leaf", {}, rng.choice(LEAF_COLUMNS)
        flipped = flip_row(con, table, rowid, column, rng)
        if flipped is None:
            continue
        original, at, moved = flipped
        try:
            with pytest.raises((LedgerError, LibraryError)) as caught:
                verify_ledger(RunStore(root))
            message = str(caught.value)
            named = names_version_part(message, row) if part == "version" else message.startswith(f"ledger leaf {rowid}")
            assert named, (table, column, at, message)
        except BaseException:
            print(f"flip in {table}.{column} of row {rowid} at byte {at}")
            raise
        finally:
            restore(con, table, moved, column, original)
        tally[f"{part} row"] += 1
    verify_ledger(RunStore(root))  # every byte put back: the ledger verifies again


# --- flipping a byte of what `fetch` reads ------------------------------------------------------------------------

FETCH_PARTS = ("manifest", "library", "signature", "inclusion proof", "log entry", "parent")


def fetch_flips(root: Path, ipfs: MemoryIpfs, publication, signer: str, count: int, rng: random.Random,
                tally: Counter) -> None:
    document = ipfs.cat(publication.manifest_address)
    proof = json.dumps(json.loads(document)["manifest"]["inclusion_proof"], sort_keys=True, separators=(",", ":"))
    proof_at = document.index(proof.encode())
    store = RunStore(root.parent / "fetcher")
    before = store.db["versions"].count
    for _ in range(count):
        part = rng.choice(["manifest as served", "library as served", "manifest re-published", "proof re-published"])
        if part == "library as served":  # the node serves other bytes for the library's address
            original = ipfs.blocks[publication.library_address]
            ipfs.blocks[publication.library_address], at = _flip(original, rng)
            address = publication.manifest_address
        elif part == "manifest as served":
            ipfs.blocks[publication.manifest_address], at = _flip(document, rng)
            address = publication.manifest_address
        else:  # a signer's manifest, changed and put on IPFS again under its own, new address
            start, end = (proof_at, proof_at + len(proof)) if part == "proof re-published" else (0, len(document))
            region, at = _flip(document[start:end], rng)
            address = ipfs.add(document[:start] + region + document[end:])
        try:
            with pytest.raises((LedgerError, LibraryError)) as caught:
                fetch(store, address, ipfs, signer=signer)
            message = str(caught.value)
            assert message.split(":")[0].split(" ")[0] in {p.split(" ")[0] for p in FETCH_PARTS}, (part, at, message)
            if part.endswith("as served"):  # the bytes no longer hash to the address they were asked for by
                assert message.startswith(part.split(" ")[0] + ": bytes hash to"), (part, at, message)
            tally[part] += 1
            tally[f"named {message.split(':')[0].split(' ')[0]}"] += 1
        finally:
            ipfs.blocks[publication.manifest_address] = document
            if part == "library as served":
                ipfs.blocks[publication.library_address] = original
        assert store.db["versions"].count == before, "a tampered library was imported"
    fetch(store, publication.manifest_address, ipfs, signer=signer)  # the genuine one still fetches


# --- the tests -------------------------------------------------------------------------------------------------


def run_flips(workspace, count: int, figures) -> None:
    root, ipfs, publication, signer = workspace
    rng, tally = random.Random(count), Counter()
    store_flips(root, count // 2, rng, tally)
    fetch_flips(root, ipfs, publication, signer, count - count // 2, rng, tally)
    caught = sum(v for k, v in tally.items() if not k.startswith("named"))  # a flip not caught fails the test
    figures("ledger flips", f"{caught:,} single-byte flips caught, each naming its part "
            f"({', '.join(f'{k} {v}' for k, v in sorted(tally.items()) if not k.startswith('named'))}); "
            f"fetch named: {', '.join(f'{k[6:]} {v}' for k, v in sorted(tally.items()) if k.startswith('named'))}")
    assert caught == count


def test_any_flipped_byte_fails_verify_or_fetch_naming_the_part(workspace, figures):
    run_flips(workspace, QUICK, figures)


@pytest.mark.soak
def test_any_flipped_byte_fails_verify_or_fetch_naming_the_part_soak(workspace, figures):
    run_flips(workspace, SOAK, figures)


def test_the_cli_names_a_flipped_byte_in_one_line(workspace):
    """The same, through `gym-tf ledger verify`: exit 1 and one line naming the part."""
    root = workspace[0]
    rng = random.Random(3)
    con = sqlite3.connect(root / "gym-tf.db")
    for table, column in [("versions", "content"), ("leaf", "entry"), ("leaf", "hash")]:
        rowid = rng.choice([r[0] for r in con.execute(f"select rowid from {table}")])
        original, _, moved = flip_row(con, table, rowid, column, rng)
        try:
            done = run_cli("ledger", "verify", "--workspace", str(root))
        finally:
            restore(con, table, moved, column, original)
        assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert done.stderr.startswith("error: version " if table == "versions" else f"error: ledger leaf "), done.stderr


# --- what these flips found, kept as plain regression tests ----------------------------------------------------------


def test_a_version_column_flipped_into_invalid_utf8_is_named(workspace):
    """sqlite3 itself failed to read such a row (an unnamed OperationalError out of `ledger verify`), before."""
    root = workspace[0]
    con = sqlite3.connect(root / "gym-tf.db")
    rowid, original = con.execute("select rowid, evaluation from versions where evaluation != '{}'").fetchone()
    con.execute("update versions set evaluation = cast(? as text) where rowid = ?", [b'{"\xff": 1}', rowid])
    con.commit()
    try:
        with pytest.raises(LedgerError, match="^version .*: its evaluation is not UTF-8 text"):
            verify_ledger(RunStore(root))
    finally:
        restore(con, "versions", rowid, "evaluation", original)


def test_a_version_creation_time_is_covered_by_its_leaf(workspace):
    """The one column of a version row the log did not record, before."""
    root = workspace[0]
    con = sqlite3.connect(root / "gym-tf.db")
    rowid, original = con.execute("select rowid, created from versions order by rowid desc").fetchone()
    con.execute("update versions set created = ? where rowid = ?", [original - 86400, rowid])
    con.commit()
    try:
        with pytest.raises(LedgerError, match="^version .*: its creation time is .*, but its ledger leaf"):
            verify_ledger(RunStore(root))
    finally:
        restore(con, "versions", rowid, "created", original)


def test_a_leaf_id_flipped_out_of_sequence_is_named(workspace):
    """pymerkle refused to open such a log with a bare ValueError ("Leaf indices are not contiguous"), before."""
    root = workspace[0]
    con = sqlite3.connect(root / "gym-tf.db")
    last = con.execute("select max(id) from leaf").fetchone()[0]
    _unguarded(con)
    con.execute("update leaf set id = ? where id = ?", [last + 64, last])
    con.commit()
    try:
        with pytest.raises(LedgerError, match=f"^ledger leaf {last}: missing"):
            verify_ledger(RunStore(root))
    finally:
        restore(con, "leaf", last + 64, "id", last)
