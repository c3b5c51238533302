"""A publication manifest: what was published, where it sits in the log, and who signed it.

Reading is split from checking (`read_manifest`, then `check_signature`) so that a verifier can run every check
in an order where each tampered part is named by its own check.

The published document is `{"manifest": {...}, "signature": "0x..."}` in canonical bytes; the signature is EIP-191
over the canonical bytes of the manifest alone.
"""

from __future__ import annotations

import json
from typing import Any

from eth_account.signers.local import LocalAccount

from ledger import signing
from ledger.cid import canonical
from ledger.errors import SignatureError, TamperedError

FORMAT = "gym-tf-manifest/1"
REQUIRED = ("library_cid", "library_address", "log_entry", "merkle_root", "tree_size", "leaf_index", "inclusion_proof",
            "signer")


def sign_manifest(manifest: dict[str, Any], account: LocalAccount) -> bytes:
    manifest = {**manifest, "format": FORMAT, "signer": account.address}
    return canonical({"manifest": manifest, "signature": signing.sign(account, canonical(manifest))})


def read_manifest(document: bytes) -> tuple[dict[str, Any], str]:
    """Parse a published manifest into (manifest, signature); nothing is trusted yet."""
    try:
        outer = json.loads(document)
        manifest, signature = outer["manifest"], outer["signature"]
    except (json.JSONDecodeError, KeyError, TypeError):
        raise TamperedError("manifest: not a signed gym-tf manifest") from None
    missing = [k for k in REQUIRED if k not in manifest]
    if missing or manifest.get("format") != FORMAT:
        raise TamperedError(f"manifest: missing {missing or 'format'}")
    return manifest, signature


def check_signature(manifest: dict[str, Any], signature: str, expected_signer: str | None = None) -> None:
    """The signature must recover to the signer the manifest names, and to `expected_signer` when given."""
    signer = signing.signer_of(canonical(manifest), signature)
    if signer.lower() != str(manifest["signer"]).lower():
        raise SignatureError(f"signature: made by {signer}, but the manifest names {manifest['signer']}")
    if expected_signer and signer.lower() != expected_signer.lower():
        raise SignatureError(f"signature: made by {signer}, expected {expected_signer}")
