"""gym-tf: Training-Free GRPO. Learn an experience library for a frozen LLM, record it, and serve it.

The Python API is the library the CLI is built on; runs made here land in the same workspace as CLI runs:

    store = gym_tf.RunStore("my-workspace")                     # the CLI's --workspace
    config = gym_tf.OptimizeConfig(dataset="quickstart", epochs=1)
    backend = await gym_tf.make_backend(config.backend)         # the embedded model when no base_url is set
    result = await gym_tf.Optimizer(config, store, backend).run()
    result.library.messages([{"role": "user", "content": "..."}])  # the library in an app's own request

Names load on first use, so `import gym_tf` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_WHERE = {
    "BackendConfig": "gym_tf.backends", "make_backend": "gym_tf.backends", "Sampling": "gym_tf.backends",
    "OptimizeConfig": "gym_tf.config", "RolloutConfig": "gym_tf.config",
    "Optimizer": "gym_tf.optimize", "RunResult": "gym_tf.optimize",
    "load_dataset": "gym_tf.datasets", "Problem": "gym_tf.datasets",
    "RunStore": "gym_tf.store",
    "LibraryVersion": "gym_tf.library", "EMPTY_LIBRARY": "gym_tf.library",
    "resolve_library": "gym_tf.library_io", "read_library_file": "gym_tf.library_io",
    "export_library": "gym_tf.library_io",
    "evaluate": "gym_tf.evaluate", "compare": "gym_tf.compare",
    "publish": "gym_tf.publishing", "fetch": "gym_tf.publishing", "verify_ledger": "gym_tf.publishing",
    "load_reward": "rewards",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'gym_tf' has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
