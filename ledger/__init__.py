"""The experience ledger: bytes, CIDs, an append-only Merkle log, signatures, IPFS and chain anchors.

It knows nothing of experiences: the core hands it canonical bytes. Anything that verifies a published library can
do so with `ledger/` alone.

    LedgerError
    ├── TamperedError        stored or fetched bytes do not match their CID / hash / root (names what)
    ├── ProofError           an inclusion or consistency proof does not verify
    ├── SignatureError       a signature does not recover to the expected signer
    ├── KeyError_            no key, or an unreadable key file
    ├── TransportError       an IPFS node, gateway or chain RPC failed (names which)
    └── AnchorError          a transaction does not carry the expected root, failed, or has another sender
"""

from ledger.errors import AnchorError, KeyError_, LedgerError, ProofError, SignatureError, TamperedError, TransportError

__all__ = ["AnchorError", "KeyError_", "LedgerError", "ProofError", "SignatureError", "TamperedError", "TransportError"]
