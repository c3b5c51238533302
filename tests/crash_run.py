"""Runs an optimize with the scripted fake in a child process, so a test can kill -9 it at any moment."""

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from fakes import ScriptedBackend  # noqa: E402
from gym_tf.config import OptimizeConfig  # noqa: E402
from gym_tf.datasets import load_dataset  # noqa: E402
from gym_tf.optimize import Optimizer  # noqa: E402
from gym_tf.store import RunStore  # noqa: E402

CONFIG = OptimizeConfig(dataset="quickstart", limit=12, batch_size=4, group_size=4, epochs=2, seed=7)


def scripted(delay: float = 0.0) -> ScriptedBackend:
    return ScriptedBackend({p.problem: p.answer for p in load_dataset("quickstart")}, delay=delay)


if __name__ == "__main__":
    store = RunStore(sys.argv[1])
    optimizer = Optimizer(CONFIG, store, scripted(delay=float(sys.argv[2])))
    print(optimizer.run_id, flush=True)
    asyncio.run(optimizer.run())
