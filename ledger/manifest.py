"""A publication manifest: what was published, where it sits in the log, and who signed it.

Reading is split from checking (`read_manifest`, then `check_signature`) so that a verifier can run every check
in an order where each tampered part is named by its own check.

The published document is `{"manifest": {...}, "signature": "0x..."}` in canonical bytes; the signature is EIP-191
over the canonical bytes of the manifest alone.
"""

from __future__ import annotations

import json
import re
from typing import Any

from eth_account.signers.local import LocalAccount

from ledger import signing
from ledger.cid import canonical
from ledger.errors import SignatureError, TamperedError

FORMAT = "gym-tf-manifest/1"
# Each required field and the JSON type it must have; a manifest is untrusted input until every check passed.
FIELDS: dict[str, tuple[type, ...]] = {
    "library_cid": (str,), "library_address": (str,), "parent_cid": (str, type(None)), "log_entry": (str,),
    "merkle_root": (str,), "tree_size": (int,), "leaf_index": (int,), "inclusion_proof": (dict,), "signer": (str,),
}
OPTIONAL: dict[str, tuple[type, ...]] = {"evaluation": (dict, type(None)), "config_hash": (str, type(None))}


def sign_manifest(manifest: dict[str, Any], account: LocalAccount) -> bytes:
    manifest = {**manifest, "format": FORMAT, "signer": account.address}
    return canonical({"manifest": manifest, "signature": signing.sign(account, canonical(manifest))})


def read_manifest(document: bytes) -> tuple[dict[str, Any], str]:
    """Parse a published manifest into (manifest, signature); nothing is trusted yet."""
    try:
        outer = json.loads(document)
        manifest, signature = outer["manifest"], outer["signature"]
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError):  # json.loads guesses UTF-16/32 too
        raise TamperedError("manifest: not a signed gym-tf manifest") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise TamperedError(f"manifest: not in the {FORMAT} format")
    missing = [k for k in FIELDS if k not in manifest]
    if missing:
        raise TamperedError(f"manifest: missing {', '.join(missing)}")
    for name, types in [*FIELDS.items(), *OPTIONAL.items()]:
        value = manifest.get(name)
        if name in manifest and (not isinstance(value, types) or isinstance(value, bool)):
            wanted = " or ".join("null" if t is type(None) else _JSON_NAMES[t] for t in types)
            raise TamperedError(f"manifest {name}: must be {wanted}, not {json.dumps(value)[:40]}")
    if not re.fullmatch(r"[0-9a-f]{64}", manifest["merkle_root"]):
        raise TamperedError("manifest merkle_root: must be 64 lowercase hex digits (a SHA-256 root)")
    # one spelling only (what `signing.sign` writes): recovery ignores case and a 0x prefix, so without this rule a
    # re-cased copy of a signed manifest would verify under another address (found by tests/test_attack_ledger.py)
    if not isinstance(signature, str) or not re.fullmatch(r"[0-9a-f]{130}", signature):
        raise TamperedError("signature: must be a hex string of 130 lowercase digits")
    return manifest, signature


_JSON_NAMES = {str: "a string", int: "an integer", dict: "an object"}


def check_signature(manifest: dict[str, Any], signature: str, expected_signer: str | None = None) -> None:
    """The signature must recover to the signer the manifest names, and to `expected_signer` when given."""
    signer = signing.signer_of(canonical(manifest), signature)
    if signer.lower() != str(manifest["signer"]).lower():
        raise SignatureError(f"signature: made by {signer}, but the manifest names {manifest['signer']}")
    if expected_signer and signer.lower() != expected_signer.lower():
        raise SignatureError(f"signature: made by {signer}, expected {expected_signer}")
