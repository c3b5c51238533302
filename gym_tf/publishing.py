"""Publishing library versions, fetching and verifying others', auditing the ledger, anchoring its root.

The checks themselves are `ledger/`'s; this module decides what is checked, in which order, and what is stored.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from eth_account.signers.local import LocalAccount
from pydantic import ValidationError

from gym_tf.library import LibraryVersion
from gym_tf.store import RunStore
from ledger.cid import check, cid
from ledger.errors import TamperedError
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


def fetch(store: RunStore, address: str, ipfs: Ipfs, signer: str | None = None) -> tuple[LibraryVersion, dict]:
    """Fetch a published library and import it only if every check passes, each naming what it checks: manifest
    bytes against the address, library bytes against their CID, the log entry and its inclusion proof against
    the manifest's root, the signature (against `signer` if given), and the library's canonical form."""
    document = ipfs.cat(address)
    check(address, document, "manifest")
    manifest, signature = read_manifest(document)
    library_bytes = ipfs.cat(manifest["library_address"])
    check(manifest["library_address"], library_bytes, "library")
    if cid(library_bytes) != manifest["library_cid"]:
        raise TamperedError(f"library: bytes hash to {cid(library_bytes)}, the manifest says {manifest['library_cid']}")
    entry = manifest["log_entry"].encode()
    if json.loads(entry).get("version") != manifest["library_cid"]:
        raise TamperedError("log entry: names another version than the manifest's library")
    verify_entry(entry, manifest["merkle_root"], manifest["inclusion_proof"])
    check_signature(manifest, signature, signer)
    try:
        version = LibraryVersion.model_validate_json(library_bytes)
    except ValidationError:
        raise TamperedError("library: bytes are not a gym-tf library version") from None
    if version.id != manifest["library_cid"]:
        raise TamperedError("library: not in canonical form (re-encoding changes its CID)")
    store.put_version(version, run_id="", status="imported", evaluation=manifest.get("evaluation"))
    store.db["publications"].insert({"manifest": address, "version_id": version.id, "transport": ipfs.name,
                                     "signer": manifest["signer"], "created": time.time(), "direction": "in"},
                                    replace=True)
    return version, manifest


def verify_ledger(store: RunStore) -> tuple[int, str]:
    """Re-derive every version's CID from its stored bytes and every leaf and the root from the log; raise
    TamperedError naming the first bad entry. Returns (entries, root)."""
    log = store.ledger
    for row in store.db.query("select id, content, leaf_index from versions order by leaf_index"):
        if cid(row["content"].encode()) != row["id"]:
            raise TamperedError(f"version {row['id']}: stored content no longer hashes to its CID")
    root = log.audit()
    versions = {r["id"]: r["leaf_index"] for r in store.db.query("select id, leaf_index from versions")}
    for index in range(1, log.size + 1):
        named = json.loads(log.entry(index)).get("version")
        if versions.get(named) != index:
            raise TamperedError(f"ledger leaf {index}: names version {named}, which the store does not hold at that leaf")
    return log.size, root


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
    store.db["anchors"].insert({"tx": tx, "root": root, "tree_size": size, "rpc_url": rpc_url, "created": time.time()},
                               replace=True)
    return tx, root, size


def verify_anchor(store: RunStore, w3: Any, tx: str) -> dict[str, Any]:
    """Read a root back from the chain and check it against the log: it occurred in this log's history, and
    today's log extends it (consistency proof)."""
    from ledger.chain import read_anchor

    root, sender, block = read_anchor(w3, tx)
    check = prove_consistency(store, root)
    return {"tx": tx, "root": root, "sender": sender, "block": block, "tree_size": check["old_size"],
            "current_size": check["new_size"]}
