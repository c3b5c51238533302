"""Every error gym-tf raises on purpose. Callers catch these; the CLI turns them into one line and a non-zero exit.

    GymTFError
    ├── ConfigError            a setting breaks a stated rule
    ├── DatasetError           a dataset file or row is unusable (names file and line)
    ├── RewardError            a reward name or `module:function` cannot be loaded
    ├── BackendError           the model backend failed
    │   ├── BackendUnreachable     no connection to the server (names the URL)
    │   ├── ModelNotFound          the server does not serve that model / the model file is missing
    │   └── BackendRequestFailed   the server answered with an error (names status and message)
    ├── LibraryError           a library operation or version is invalid
    │   └── UnknownVersion         no library version with that id
    ├── StoreError             the run store cannot satisfy the request
    │   ├── UnknownRun             no run with that id
    │   ├── UnknownRecord          no stored rollout, learner call, item or evaluation with that id
    │   ├── UnknownResponse        no recorded response with that id for that tenant (also a LookupError)
    │   └── UnknownChoice          feedback names a choice the recorded response does not have
    └── BudgetExhausted        the run's token budget is spent (a clean stop, not a failure)
"""

from __future__ import annotations


class GymTFError(Exception):
    """Base of every gym-tf error."""


class ConfigError(GymTFError, ValueError):
    pass


class DatasetError(GymTFError):
    pass


class RewardError(GymTFError):
    pass


class BackendError(GymTFError):
    pass


class BackendUnreachable(BackendError):
    pass


class ModelNotFound(BackendError):
    pass


class BackendRequestFailed(BackendError):
    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status  # the HTTP status the server answered, when there was one


class LibraryError(GymTFError):
    pass


class UnknownVersion(LibraryError):
    pass


class StoreError(GymTFError):
    pass


class UnknownRun(StoreError):
    pass


class UnknownRecord(StoreError):
    pass


class UnknownResponse(StoreError, LookupError):
    pass


class UnknownChoice(StoreError):
    pass


class BudgetExhausted(GymTFError):
    pass
