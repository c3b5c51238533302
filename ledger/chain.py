"""Anchoring a Merkle root on an Ethereum-compatible chain: a data transaction to oneself whose input is
`gym-tf:` followed by the 32-byte root (about 22.6k gas; no contract to deploy or trust).

Anyone can send such a transaction with any root, so an anchor means something only when it was sent by the
expected address and succeeded: `read_anchor` checks both. web3 is the `chain` extra, imported when first needed.
"""

from __future__ import annotations

from typing import Any

from eth_account.signers.local import LocalAccount

from ledger.errors import AnchorError, TransportError

PREFIX = b"gym-tf:"
RECEIPT_TIMEOUT_S = 120


def connect(rpc_url: str, timeout: float = 30.0) -> Any:
    try:
        from web3 import Web3
    except ImportError:
        raise TransportError("anchoring needs web3: pip install 'gym-tf[chain]'") from None
    w3 = Web3(Web3.HTTPProvider(rpc_url, request_kwargs={"timeout": timeout}))
    if not w3.is_connected():
        raise TransportError(f"chain RPC {rpc_url} is unreachable")
    return w3


def anchor(w3: Any, account: LocalAccount, root: str) -> str:
    """Send the anchoring transaction, wait for its receipt, and return its hash (0x...)."""
    from web3.exceptions import TimeExhausted

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
    tx_hash = "0x" + w3.eth.send_raw_transaction(signed.raw_transaction).hex().removeprefix("0x")
    try:
        receipt = w3.eth.wait_for_transaction_receipt(tx_hash, timeout=RECEIPT_TIMEOUT_S)
    except TimeExhausted:
        raise TransportError(f"anchoring transaction {tx_hash}: not mined within {RECEIPT_TIMEOUT_S} s") from None
    if receipt["status"] != 1:
        raise AnchorError(f"anchoring transaction {tx_hash} failed")
    return tx_hash


def read_anchor(w3: Any, tx_hash: str, sender: str) -> tuple[str, int]:
    """(root, block) written by a successful anchoring transaction that `sender` sent; AnchorError otherwise."""
    from web3.exceptions import TransactionNotFound

    try:
        tx = w3.eth.get_transaction(tx_hash)
        receipt = w3.eth.get_transaction_receipt(tx_hash)
    except TransactionNotFound:
        raise AnchorError(f"no mined transaction {tx_hash} on this chain") from None
    data = bytes(tx["input"])
    if not data.startswith(PREFIX) or len(data) != len(PREFIX) + 32:
        raise AnchorError(f"transaction {tx_hash} carries no gym-tf root")
    if receipt["status"] != 1:
        raise AnchorError(f"transaction {tx_hash} failed on chain (receipt status {receipt['status']}): "
                          "it anchors nothing")
    if tx["from"].lower() != sender.lower():
        raise AnchorError(f"transaction {tx_hash} was sent by {tx['from']}, "
                          f"not by the expected anchoring address {sender}")
    return data[len(PREFIX):].hex(), tx["blockNumber"]


def _fees(w3: Any) -> dict[str, int]:
    latest = w3.eth.get_block("latest")
    base = latest.get("baseFeePerGas")
    if base is None:
        return {"gasPrice": w3.eth.gas_price}
    tip = w3.to_wei(1, "gwei")
    return {"maxFeePerGas": base * 2 + tip, "maxPriorityFeePerGas": tip}
