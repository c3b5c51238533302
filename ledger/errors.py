"""The ledger's errors; the tree is drawn in `ledger/__init__.py`."""


class LedgerError(Exception):
    pass


class TamperedError(LedgerError):
    pass


class ProofError(LedgerError):
    pass


class SignatureError(LedgerError):
    pass


class KeyError_(LedgerError):  # noqa: N801 - the builtin KeyError means something else
    pass


class TransportError(LedgerError):
    pass


class AnchorError(LedgerError):
    pass
