"""Ethereum keys and EIP-191 signatures (eth-account). Keys come from a file or an environment variable; they are
never printed and never written to the ledger."""

from __future__ import annotations

import os
from pathlib import Path

from eth_account import Account
from eth_account.messages import encode_defunct
from eth_account.signers.local import LocalAccount
from eth_keys.exceptions import BadSignature

from ledger.errors import KeyError_, SignatureError

KEY_ENV = "GYM_TF_SIGNING_KEY"


def new_key(path: str | Path) -> str:
    """Write a fresh private key to `path` (mode 0600, refusing to overwrite) and return its address."""
    path = Path(path)
    if path.exists():
        raise KeyError_(f"{path} exists: refusing to overwrite a key")
    account = Account.create()
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as out:
        out.write(account.key.hex() + "\n")
    return account.address


def load_key(path: str | Path | None = None) -> LocalAccount:
    """The signing account from `path`, else from $GYM_TF_SIGNING_KEY (a hex private key)."""
    if path is not None:
        try:
            secret = Path(path).read_text().strip()
        except OSError as exc:
            raise KeyError_(f"cannot read key file {path}: {exc.strerror}") from None
    elif os.environ.get(KEY_ENV):
        secret = os.environ[KEY_ENV].strip()
    else:
        raise KeyError_(f"no signing key: pass --key FILE or set {KEY_ENV} (make one with `gym-tf keys new`)")
    try:
        return Account.from_key(secret)
    except (ValueError, TypeError):
        raise KeyError_("the signing key is not a valid private key") from None


def sign(account: LocalAccount, data: bytes) -> str:
    return account.sign_message(encode_defunct(primitive=data)).signature.hex()


def signer_of(data: bytes, signature: str) -> str:
    try:
        return Account.recover_message(encode_defunct(primitive=data), signature=signature)
    except (ValueError, TypeError, BadSignature) as exc:  # BadSignature: no key recovers (found by the attack suite)
        raise SignatureError(f"signature is malformed: {exc}") from None


def verify(data: bytes, signature: str, expected: str) -> None:
    actual = signer_of(data, signature)
    if actual.lower() != expected.lower():
        raise SignatureError(f"signature is by {actual}, expected {expected}")
