"""Content identifiers exactly as an IPFS node computes them, for any size.

`cid(data)` is the CIDv1 that `ipfs add --cid-version 1 --raw-leaves` gives (one raw block up to 256 KiB, a UnixFS
DAG beyond); `cid_v0(data)` is plain `ipfs add`'s. Both come from aleph-cid, which matches Kubo at every size:
multiformats and py-cid only get the single-block case right.
"""

from __future__ import annotations

import json
from typing import Any

from aleph_cid import CidHasher, compute_cid

from ledger.errors import TamperedError


def cid(data: bytes) -> str:
    hasher = CidHasher.for_ipfs_v1_raw_leaves()
    hasher.update(data)
    return hasher.finalize()


def cid_v0(data: bytes) -> str:
    return compute_cid(data)


def cid_like(address: str, data: bytes) -> str:
    """The CID of `data` in the flavour of `address` (v0 `Qm...` or v1), to check bytes fetched by that address."""
    return cid_v0(data) if address.startswith("Qm") else cid(data)


def check(address: str, data: bytes, what: str) -> None:
    """Raise TamperedError naming `what` unless `data` hashes to `address`."""
    actual = cid_like(address, data)
    if actual != address:
        raise TamperedError(f"{what}: bytes hash to {actual}, expected {address}")


def canonical(document: Any) -> bytes:
    """The one byte encoding of a JSON document: sorted keys, no spaces, UTF-8."""
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
