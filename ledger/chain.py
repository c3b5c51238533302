"""Anchoring a Merkle root on an Ethereum-compatible chain: a data transaction to oneself whose input is
`gym-tf:` followed by the 32-byte root (about 22.6k gas; no contract to deploy or trust)."""

from __future__ import annotations

from eth_account.signers.local import LocalAccount
from web3 import Web3
from web3.exceptions import TransactionNotFound

from ledger.errors import AnchorError, TransportError

PREFIX = b"gym-tf:"


def connect(rpc_url: str) -> Web3:
    w3 = Web3(Web3.HTTPProvider(rpc_url, request_kwargs={"timeout": 30}))
    if not w3.is_connected():
        raise TransportError(f"chain RPC {rpc_url} is unreachable")
    return w3


def anchor(w3: Web3, account: LocalAccount, root: str) -> str:
    """Send the anchoring transaction, wait for its receipt, and return its hash (0x...)."""
    data = PREFIX + bytes.fromhex(root)
    tx = {
        "from": account.address,
        "to": account.address,
        "value": 0,
        "data": data,
        "nonce": w3.eth.get_transaction_count(account.address),
        "chainId": w3.eth.chain_id,
    }
    tx["gas"] = w3.eth.estimate_gas(tx)
    tx.update(_fees(w3))
    signed = account.sign_transaction(tx)
    tx_hash = w3.eth.send_raw_transaction(signed.raw_transaction)
    receipt = w3.eth.wait_for_transaction_receipt(tx_hash, timeout=60)
    if receipt["status"] != 1:
        raise AnchorError(f"anchoring transaction {tx_hash.hex()} failed")
    return "0x" + tx_hash.hex().removeprefix("0x")


def read_anchor(w3: Web3, tx_hash: str) -> tuple[str, str, int]:
    """(root, sender, block) written by an anchoring transaction."""
    try:
        tx = w3.eth.get_transaction(tx_hash)
    except TransactionNotFound:
        raise AnchorError(f"no transaction {tx_hash} on this chain") from None
    data = bytes(tx["input"])
    if not data.startswith(PREFIX) or len(data) != len(PREFIX) + 32:
        raise AnchorError(f"transaction {tx_hash} carries no gym-tf root")
    return data[len(PREFIX):].hex(), tx["from"], tx["blockNumber"]


def _fees(w3: Web3) -> dict[str, int]:
    latest = w3.eth.get_block("latest")
    base = latest.get("baseFeePerGas")
    if base is None:
        return {"gasPrice": w3.eth.gas_price}
    tip = w3.to_wei(1, "gwei")
    return {"maxFeePerGas": base * 2 + tip, "maxPriorityFeePerGas": tip}
