"""Publishing library versions, fetching and verifying others', auditing the ledger, anchoring its root.

The checks themselves are `ledger/`'s; this module decides what is checked, in which order, and what is stored.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import dataclass
from typing import Any

from eth_account.signers.local import LocalAccount
from pydantic import ValidationError

from gym_tf.errors import LibraryError
from gym_tf.library import LibraryVersion
from gym_tf.library_io import check_library
from gym_tf.store import RunStore
from ledger.cid import canonical, check, cid
from ledger.errors import AnchorError, SignatureError, TamperedError, TransportError
from ledger.ipfs import Ipfs
from ledger.log import verify_append_only, verify_entry
from ledger.manifest import check_signature, read_manifest, sign_manifest


@dataclass(frozen=True)
class Publication:
    manifest_address: str
    library_address: str
    manifest: dict[str, Any]


def publish(store: RunStore, version_id: str, account: LocalAccount, ipfs: Ipfs) -> Publication:
    """Put a version and its signed manifest (CID, parent, log root and inclusion proof, config hash, evaluation,
    model) on IPFS. Returns the manifest's address: what others `fetch`."""
    log = store.ledger
    version = store.version(version_id)
    row = store.version_row(version.id)
    size = log.size
    run = store.run(row["run_id"]) if row["run_id"] else None
    manifest = {
        "library_cid": version.id,
        "library_address": ipfs.add(version.canonical_bytes()),
        "parent_cid": version.parent,
        "log_entry": log.entry(row["leaf_index"]).decode(),
        "leaf_index": row["leaf_index"],
        "tree_size": size,
        "merkle_root": log.root(size),
        "inclusion_proof": log.prove(row["leaf_index"], size),
        "config_hash": row["config_hash"],
        "evaluation": json.loads(row["evaluation"] or "{}"),
        "model": run["model"] if run else None,
        "created": int(time.time()),
    }
    document = sign_manifest(manifest, account)
    address = ipfs.add(document)
    store.db["publications"].insert({"manifest": address, "version_id": version.id, "transport": ipfs.name,
                                     "signer": account.address, "created": time.time(), "direction": "out"},
                                    replace=True)
    return Publication(address, manifest["library_address"], json.loads(document)["manifest"])


def fetch(store: RunStore, address: str, ipfs: Ipfs, signer: str | None = None, *, trust_any_signer: bool = False,
          w3: Any = None, anchor_tx: str | None = None) -> tuple[LibraryVersion, dict]:
    """Fetch a published library and import it only if every check passes, each naming what it checks: manifest
    bytes against the address and its fields' types, library bytes against their CID, the log entry (version and
    parent) and its inclusion proof against the manifest's root, the signature against `signer`, the library's
    canonical form and item rules, and, with `anchor_tx`, that the manifest's root is the one the signer anchored
    in that transaction on the chain `w3`. A signer must be named unless `trust_any_signer` says, explicitly,
    that anyone's signature will do."""
    if signer is None and not trust_any_signer:
        raise SignatureError("signature: name the expected signer (--signer 0x...), or accept anyone's signature "
                             "explicitly (--trust-any-signer)")
    if signer is not None and not re.fullmatch(r"0x[0-9a-fA-F]{40}", signer):
        raise SignatureError(f"signature: the expected signer {signer!r} is not an address (0x and 40 hex digits)")
    document = _cat(ipfs, address, "manifest")
    check(address, document, "manifest")
    manifest, signature = read_manifest(document)
    library_bytes = _cat(ipfs, manifest["library_address"], "library")
    check(manifest["library_address"], library_bytes, "library")
    if cid(library_bytes) != manifest["library_cid"]:
        raise TamperedError(f"library: bytes hash to {cid(library_bytes)}, the manifest says {manifest['library_cid']}")
    entry = manifest["log_entry"].encode()
    recorded = _parse_entry(entry, "log entry")
    if recorded.get("version") != manifest["library_cid"]:
        raise TamperedError("log entry: names another version than the manifest's library")
    if recorded.get("parent") != manifest["parent_cid"]:
        raise TamperedError(f"parent: the manifest names {manifest['parent_cid']}, "
                            f"its log entry {recorded.get('parent')}")
    verify_entry(entry, manifest["merkle_root"], manifest["inclusion_proof"])
    check_signature(manifest, signature, signer)
    try:
        version = LibraryVersion.model_validate_json(library_bytes)
    except ValidationError:
        raise TamperedError("library: bytes are not a gym-tf library version") from None
    if version.id != manifest["library_cid"]:
        raise TamperedError("library: not in canonical form (re-encoding changes its CID)")
    if version.parent != manifest["parent_cid"]:
        raise TamperedError(f"parent: the manifest names {manifest['parent_cid']}, the library {version.parent}")
    try:
        check_library(version)
    except LibraryError as exc:
        raise LibraryError(f"library: {exc}") from None
    if anchor_tx:
        from ledger.chain import read_anchor

        root, block = read_anchor(w3, anchor_tx, sender=manifest["signer"])
        if root != manifest["merkle_root"]:
            raise AnchorError(f"anchor: transaction {anchor_tx} anchors root {root}, the manifest's root is "
                              f"{manifest['merkle_root']}")
    store.put_version(version, run_id="", status="imported", evaluation=manifest.get("evaluation"))
    store.db["publications"].insert({"manifest": address, "version_id": version.id, "transport": ipfs.name,
                                     "signer": manifest["signer"], "created": time.time(), "direction": "in"},
                                    replace=True)
    return version, manifest


def _cat(ipfs: Ipfs, address: str, what: str) -> bytes:
    try:
        return ipfs.cat(address)
    except TransportError as exc:
        raise TransportError(f"{what}: {exc}") from None


def _parse_entry(entry: bytes, what: str) -> dict[str, Any]:
    try:
        recorded = json.loads(entry)
    except (json.JSONDecodeError, UnicodeDecodeError):
        recorded = None
    if not isinstance(recorded, dict):
        raise TamperedError(f"{what}: not a JSON object")
    return recorded


def verify_ledger(store: RunStore) -> tuple[int, str]:
    """Check the store against its log in both directions, and the log against itself; raise TamperedError naming
    the first bad entry. Returns (entries, root).

    Every leaf re-hashes to the root and names the version row that points back to it; every version row hashes to
    its id, points to a leaf about that very version, and agrees with it on parent, run, step and status (and on
    the evaluation and config hash where the entry records their digests); every promotion leaf (gym_tf.learn) has
    its promotion row, agreeing on version, tenant, run and evidence; the serving pointer names a verified version. A row inserted or edited by hand therefore fails, whatever its `leaf_index` says.
    """
    log = store.ledger
    root = log.audit()
    rows = _version_rows(store)
    for row in rows:
        _verify_row(log, row)
    versions = {row["id"]: row["leaf_index"] for row in rows}
    promotions = {row["leaf_index"]: row for row in store.db.query("select * from promotions")} \
        if "promotions" in store.db.table_names() else {}
    for index in range(1, log.size + 1):
        entry = _parse_entry(log.entry(index), f"ledger leaf {index}")
        if entry.get("kind") == "promotion":
            _verify_promotion(entry, promotions.pop(index, None), index, versions)
            continue
        named = entry.get("version")
        if versions.get(named) != index:
            raise TamperedError(f"ledger leaf {index}: names version {named}, which the store does not hold at that leaf")
    if promotions:
        index, row = next(iter(promotions.items()))
        raise TamperedError(f"promotion of {row['version_id']} to {row['tenant']!r}: its leaf_index {index} names "
                            "no promotion leaf")
    for pointer in store.db.query("select name, version_id from serving"):
        if pointer["version_id"] not in versions:
            raise TamperedError(f"serving pointer {pointer['name']!r}: names {pointer['version_id']}, "
                                "which is not a recorded version")
    return log.size, root


def _version_rows(store: RunStore) -> list[dict[str, Any]]:
    """Every version row, its text decoded here rather than by sqlite3: a byte flipped into invalid UTF-8 made the
    read itself fail with an unnamed OperationalError (found by tests/test_attack_ledger.py)."""
    con = store.db.conn
    factory, con.text_factory = con.text_factory, bytes
    try:
        cursor = con.execute("select * from versions order by leaf_index")
        names = [d[0] for d in cursor.description]
        raw_rows = [dict(zip(names, r)) for r in cursor]
    finally:
        con.text_factory = factory
    rows = []
    for raw in raw_rows:
        row = {}
        for column, value in raw.items():
            if isinstance(value, bytes):
                try:
                    value = value.decode("utf-8")
                except UnicodeDecodeError:
                    raise TamperedError(f"version {raw['id'].decode('utf-8', 'replace') if isinstance(raw['id'], bytes) else raw['id']}: "
                                        f"its {column} is not UTF-8 text") from None
            row[column] = value
        rows.append(row)
    return rows


def _verify_row(log: Any, row: dict[str, Any]) -> None:
    name = f"version {row['id']}"
    if cid(row["content"].encode()) != row["id"]:
        raise TamperedError(f"{name}: stored content no longer hashes to its CID")
    index = row["leaf_index"]
    if not isinstance(index, int) or not 1 <= index <= log.size:
        raise TamperedError(f"{name}: its leaf_index {index} names no ledger leaf")
    entry = _parse_entry(log.entry(index), f"ledger leaf {index}")
    if entry.get("version") != row["id"]:
        raise TamperedError(f"{name}: its leaf_index {index} names a leaf about version {entry.get('version')}")
    content = json.loads(row["content"])
    if (row["parent"], row["step"]) != (content.get("parent"), content.get("step")):
        raise TamperedError(f"{name}: its parent or step column differs from its content")
    checks = [("parent", row["parent"], entry.get("parent")), ("run", row["run_id"], entry.get("run")),
              ("step", row["step"], entry.get("step")), ("status", row["status"], entry.get("status"))]
    if "config_hash" in entry:
        checks.append(("config hash", row["config_hash"], entry["config_hash"]))
    if entry.get("created") is not None:  # entries from before the creation time was logged do not record it
        checks.append(("creation time", row["created"], entry["created"]))
    for field, stored, logged in checks:
        if stored != logged:
            raise TamperedError(f"{name}: its {field} is {stored!r}, but its ledger leaf {index} records {logged!r}")
    if "evaluation_sha256" in entry and _digest(row["evaluation"]) != entry["evaluation_sha256"]:
        raise TamperedError(f"{name}: its evaluation is not the one its ledger leaf {index} records")


def _verify_promotion(entry: dict[str, Any], row: dict[str, Any] | None, index: int, versions: dict[str, int]) -> None:
    """A promotion leaf has its row (gym_tf.learn), agreeing on what, to whom, by which run, and on the evidence."""
    if row is None:
        raise TamperedError(f"ledger leaf {index}: a promotion the store does not hold at that leaf")
    checks = [("version", row["version_id"], entry.get("version")), ("tenant", row["tenant"], entry.get("tenant")),
              ("run", row["run_id"], entry.get("run")), ("replaced", row["replaced"], entry.get("replaced"))]
    for field, stored, logged in checks:
        if stored != logged:
            raise TamperedError(f"promotion at ledger leaf {index}: its {field} is {stored!r}, the leaf records {logged!r}")
    if _digest(row["evidence"]) != entry.get("evidence_sha256"):
        raise TamperedError(f"promotion at ledger leaf {index}: its evidence is not the one the leaf records")
    if entry.get("version") not in versions:
        raise TamperedError(f"promotion at ledger leaf {index}: names {entry.get('version')}, not a recorded version")


def _digest(stored_json: str | None) -> str:
    try:
        return hashlib.sha256(canonical(json.loads(stored_json or "{}"))).hexdigest()
    except json.JSONDecodeError:
        return ""


def prove_version(store: RunStore, version_id: str) -> dict[str, Any]:
    log = store.ledger
    version = store.version(version_id)
    index = store.version_row(version.id)["leaf_index"]
    return {"version": version.id, "leaf_index": index, "log_entry": log.entry(index).decode(), "tree_size": log.size,
            "merkle_root": log.root(), "proof": log.prove(index)}


def prove_consistency(store: RunStore, old_root: str) -> dict[str, Any]:
    """Proof that today's log extends the one that had `old_root`; verified here before it is returned."""
    log = store.ledger
    old_size = log.size_of_root(old_root)
    proof = log.prove_consistency(old_size)
    verify_append_only(old_root, log.root(), proof)
    return {"old_root": old_root, "old_size": old_size, "new_root": log.root(), "new_size": log.size, "proof": proof}


def anchor_root(store: RunStore, w3: Any, account: LocalAccount, rpc_url: str = "") -> tuple[str, str, int]:
    """Write the log's current root to the chain. Returns (transaction hash, root, tree size)."""
    from ledger.chain import anchor

    log = store.ledger
    root, size = log.root(), log.size
    tx = anchor(w3, account, root)
    store.db["anchors"].insert({"tx": tx, "root": root, "tree_size": size, "rpc_url": rpc_url, "created": time.time(),
                                "sender": account.address}, replace=True, alter=True)
    return tx, root, size


def verify_anchor(store: RunStore, w3: Any, tx: str, sender: str | None = None) -> dict[str, Any]:
    """Read a root back from the chain and check it against the log: the transaction succeeded, was sent by
    `sender` (default: the address this workspace anchored it from), and its root occurred in this log's history,
    which today's log extends (consistency proof)."""
    from ledger.chain import read_anchor

    if sender is None:
        recorded = [r for r in store.db["anchors"].rows_where("tx = ?", [tx]) if r.get("sender")]
        if not recorded:
            raise AnchorError(f"transaction {tx} was not anchored from this workspace: name the expected anchoring "
                              "address (--sender 0x...)")
        sender = recorded[0]["sender"]
    root, block = read_anchor(w3, tx, sender)
    check = prove_consistency(store, root)
    return {"tx": tx, "root": root, "sender": sender, "block": block, "tree_size": check["old_size"],
            "current_size": check["new_size"]}
