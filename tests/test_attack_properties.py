"""Property-based attacks on the parsers that read untrusted bytes (issue #17): the learner's op parser, the dataset
loaders, library files and published manifests. Any byte string in, a valid value or a named error out (gym-tf's
domain errors, `gym_tf/errors.py`, or the ledger's, `ledger/errors.py`), never another exception.

Quick tier: a few hundred examples per parser. `pytest -m soak`: GYM_TF_SOAK_EXAMPLES each (default 5,000).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fakes import MemoryIpfs
from gym_tf.datasets import Problem, load_dataset
from gym_tf.errors import DatasetError, GymTFError, LibraryError
from gym_tf.learner import parse_ops
from gym_tf.library import EMPTY_LIBRARY, AddOp, LibraryVersion, apply_ops
from gym_tf.library_io import export_library, read_library_file
from gym_tf.publishing import fetch
from gym_tf.store import RunStore
from ledger.errors import LedgerError
from ledger.manifest import read_manifest

QUICK, SOAK = 300, int(os.environ.get("GYM_TF_SOAK_EXAMPLES", "5000"))

# --- strategies: bytes that are nearly right are the ones that reach deep code ------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
OP_KEYS = ["op", "text", "id", "ids", "sources", "operations", "kind", "reason"]
op_like = st.fixed_dictionaries({"op": st.sampled_from(["add", "update", "delete", "merge", "none", "example", "x"])},
                                optional={k: json_values | st.text(max_size=300) for k in OP_KEYS[1:]})
# a lesson needs 10 letters of advice (gym_tf.library): lead with them so valid replies stay common, then anything
lesson = st.builds(str.__add__, st.text(st.characters(categories=["L"]), min_size=10, max_size=20), st.text(max_size=400))
item_id = st.from_regex(r"E[0-9]{1,3}", fullmatch=True) | st.text(max_size=5)
valid_op = (st.fixed_dictionaries({"op": st.just("add"), "text": lesson})
            | st.fixed_dictionaries({"op": st.just("update"), "id": item_id, "text": lesson})
            | st.fixed_dictionaries({"op": st.just("delete"), "id": item_id})
            | st.fixed_dictionaries({"op": st.just("merge"), "ids": st.lists(item_id, max_size=4), "text": lesson})
            | st.just({"op": "none"}))
ops_reply = st.fixed_dictionaries({"operations": st.lists(valid_op | op_like | json_values, max_size=20)})


def mutations(document: bytes) -> st.SearchStrategy[bytes]:
    @st.composite
    def build(draw):
        raw = bytearray(document)
        for _ in range(draw(st.integers(1, 3))):
            at = draw(st.integers(0, max(len(raw) - 1, 0)))
            action = draw(st.sampled_from(["flip", "insert", "cut"]))
            if action == "flip" and raw:
                raw[at] = (raw[at] + draw(st.integers(1, 255))) % 256
            elif action == "insert":
                raw[at:at] = draw(st.binary(min_size=1, max_size=4))
            else:
                del raw[at:at + draw(st.integers(1, 8))]
        return bytes(raw)
    return build()


def examples(count: int):
    return settings(max_examples=count, deadline=None, database=None, derandomize=True,
                    suppress_health_check=list(HealthCheck))


# --- the op parser ------------------------------------------------------------------------------------------------


def check_parse_ops(reply: str) -> str:
    ops, error = parse_ops(reply, max_ops=8)
    if error is None:
        assert len(ops) <= 8 and all(op.op for op in ops)
        return "value"
    assert ops == [] and isinstance(error, str) and error
    return "named error"


def op_parser_attack(count: int, tmp: Path, tally: Counter):
    replies = (st.binary(max_size=400).map(lambda b: b.decode("utf-8", "replace"))
               | ops_reply.map(json.dumps)
               | ops_reply.map(lambda r: "```json\n" + json.dumps(r) + "\n```")
               | ops_reply.flatmap(lambda r: mutations(json.dumps(r).encode())).map(
                   lambda b: b.decode("utf-8", "replace")))

    @examples(count)
    @given(replies)
    def attack(reply):
        tally[check_parse_ops(reply)] += 1
    return attack


# --- dataset loaders ----------------------------------------------------------------------------------------------

GOOD_JSONL = b'{"problem": "1+1?", "answer": "2", "id": "a"}\n{"question": "2+2?", "solution": 4}\n'
GOOD_CSV = b"problem,answer,id\n1+1?,2,a\n2+2?,4,b\n"


def _parquet_bytes(tmp: Path) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"problem": ["1+1?", "2+2?"], "answer": ["2", "4"]}), tmp / "good.parquet")
    return (tmp / "good.parquet").read_bytes()


def check_load(path: Path, raw: bytes) -> str:
    path.write_bytes(raw)
    try:
        problems = load_dataset(path)
    except DatasetError as exc:
        assert str(path) in str(exc)  # a named error names the file
        return "named error"
    assert problems and all(isinstance(p, Problem) and p.problem.strip() for p in problems)
    assert len({p.id for p in problems}) == len(problems)
    return "value"


def dataset_attack(count: int, tmp: Path, tally: Counter):
    parquet = _parquet_bytes(tmp)
    cases = (st.tuples(st.just(".jsonl"), st.binary(max_size=300) | mutations(GOOD_JSONL))
             | st.tuples(st.just(".csv"), st.binary(max_size=300) | mutations(GOOD_CSV))
             | st.tuples(st.just(".parquet"), st.binary(max_size=300) | mutations(parquet)))

    @examples(count)
    @given(cases)
    def attack(case):
        suffix, raw = case
        tally[check_load(tmp / f"data{suffix}", raw)] += 1
    return attack


# --- library files and published manifests -------------------------------------------------------------------------


def published_manifest(tmp: Path):
    """A real workspace's version, published to memory: (store, ipfs, manifest bytes, signer)."""
    from eth_account import Account

    from gym_tf.publishing import publish

    store = RunStore(tmp / "publisher")
    v1, _ = apply_ops(EMPTY_LIBRARY, [AddOp(op="add", text="Check units before answering.")], step=1)
    store.put_version(v1, run_id="", status="promoted")
    key, ipfs = Account.create(), MemoryIpfs()
    publication = publish(store, v1.id, key, ipfs)
    return ipfs, ipfs.blocks[publication.manifest_address], key.address


def check_fetch(store: RunStore, ipfs: MemoryIpfs, document: bytes, signer: str, genuine: bytes) -> str:
    address = ipfs.add(document)
    before = store.db["versions"].count
    try:
        version, _ = fetch(store, address, ipfs, signer=signer)
    except (LedgerError, LibraryError) as exc:
        assert str(exc).split(":")[0], exc  # names the part
        assert store.db["versions"].count == before  # and imports nothing
        return "named error"
    # only bytes that mean exactly the genuine manifest may pass
    assert json.loads(document) == json.loads(genuine), document[:200]
    assert isinstance(version, LibraryVersion)
    return "value"


def manifest_attack(count: int, tmp: Path, tally: Counter):
    ipfs, genuine, signer = published_manifest(tmp)
    store = RunStore(tmp / "fetcher")

    @examples(count)
    @given(st.binary(max_size=400) | mutations(genuine))
    def attack(document):
        try:
            read_manifest(document)
        except LedgerError:
            pass
        tally[check_fetch(store, ipfs, document, signer, genuine)] += 1
    return attack


def library_file_attack(count: int, tmp: Path, tally: Counter):
    v1, _ = apply_ops(EMPTY_LIBRARY, [AddOp(op="add", text="Check units before answering.")], step=1)
    export_library(v1, tmp / "good.json")
    genuine = (tmp / "good.json").read_bytes()

    @examples(count)
    @given(st.binary(max_size=300) | mutations(genuine))
    def attack(raw):
        path = tmp / "lib.json"
        path.write_bytes(raw)
        try:
            version = read_library_file(path)
        except LibraryError as exc:
            assert str(path) in str(exc)
            tally["named error"] += 1
            return
        assert version.id == v1.id  # a file that still reads must hold exactly the exported library
        tally["value"] += 1
    return attack


# --- the tests: quick tier and soak --------------------------------------------------------------------------------

ATTACKS = {
    "op parser": op_parser_attack,
    "dataset loaders": dataset_attack,
    "library files": library_file_attack,
    "manifests": manifest_attack,
}


def run_attack(name: str, count: int, tmp: Path, figures) -> None:
    tally: Counter = Counter()
    ATTACKS[name](count, tmp, tally)()  # an unnamed exception fails the test with its shrunk input
    total = tally["value"] + tally["named error"]
    figures(f"hypothesis {name}", f"{total:,} inputs, {tally['value']:,} valid values, {tally['named error']:,} "
            "named errors, 0 other exceptions")
    assert total >= min(count, 100)


@pytest.mark.parametrize("name", list(ATTACKS))
def test_any_bytes_give_a_value_or_a_named_error(name, tmp_path, figures):
    run_attack(name, QUICK, tmp_path, figures)


@pytest.mark.soak
@pytest.mark.parametrize("name", list(ATTACKS))
def test_any_bytes_give_a_value_or_a_named_error_soak(name, tmp_path, figures):
    run_attack(name, SOAK, tmp_path, figures)


def test_named_errors_are_domain_errors():
    """What these attacks accept as "named": the library's own error trees, not a builtin exception."""
    assert issubclass(DatasetError, GymTFError) and issubclass(LibraryError, GymTFError)
    assert not issubclass(LedgerError, (ValueError, KeyError, TypeError))


# --- what these attacks found, kept as plain regression tests --------------------------------------------------------


@pytest.mark.parametrize("suffix, raw, named", [
    (".jsonl", b'{"problem": "1+1?", "answer": "2"}\n\x80\n', "line 2: not UTF-8"),   # a UnicodeDecodeError, before
    (".csv", b"problem,answer\n1+1?,2\n\xff\xfe,3\n", "line 3: not UTF-8"),
    (".parquet", b"PAR1" + b"\x00" * 40 + b"PAR1", "not a readable Parquet file"),  # pyarrow's OSError, before
])
def test_undecodable_dataset_bytes_are_a_dataset_error_naming_file_and_line(tmp_path, suffix, raw, named):
    path = tmp_path / f"data{suffix}"
    path.write_bytes(raw)
    with pytest.raises(DatasetError, match=named) as caught:
        load_dataset(path)
    assert str(path) in str(caught.value)


def test_a_library_file_that_is_not_utf8_is_a_library_error(tmp_path):
    (tmp_path / "lib.json").write_bytes(b"\x80{}")  # a UnicodeDecodeError, before
    with pytest.raises(LibraryError, match="not a gym-tf library file"):
        read_library_file(tmp_path / "lib.json")


def test_manifest_bytes_json_reads_as_utf32_are_tampered():
    with pytest.raises(LedgerError, match="^manifest: not a signed"):  # a UnicodeDecodeError from json.loads, before
        read_manifest(b"\x00\x00\x00{\x00\x00\x00")


def test_a_re_cased_signature_is_refused(tmp_path):
    """Recovery ignores a signature's case: a re-cased copy of a genuine manifest verified, under a new address."""
    ipfs, genuine, signer = published_manifest(tmp_path)
    outer = json.loads(genuine)
    outer["signature"] = outer["signature"].upper()
    with pytest.raises(LedgerError, match="^signature: must be"):
        fetch(RunStore(tmp_path / "fetcher"), ipfs.add(json.dumps(outer).encode()), ipfs, signer=signer)


def test_a_signature_no_key_recovers_is_a_signature_error():
    """eth_keys' BadSignature escaped `fetch` unnamed, before (found by the soak tier)."""
    from ledger.errors import SignatureError
    from ledger.signing import signer_of

    with pytest.raises(SignatureError, match="^signature is malformed"):
        signer_of(b"x", "00" * 64 + "1b")


def test_a_parquet_column_name_that_is_not_utf8_is_a_dataset_error(tmp_path):
    """pyarrow's UnicodeDecodeError escaped `load_dataset`, before (found by the soak tier)."""
    raw = _parquet_bytes(tmp_path)
    path = tmp_path / "bad.parquet"
    path.write_bytes(raw.replace(b"problem", b"\x80roblem"))
    with pytest.raises(DatasetError, match="not a readable Parquet file"):
        load_dataset(path)
