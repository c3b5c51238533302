"""Runs an optimize with the scripted fake in a child process, so a test can kill -9 it at any moment."""

import asyncio
import hashlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from fakes import ScriptedBackend  # noqa: E402
from gym_tf.config import OptimizeConfig  # noqa: E402
from gym_tf.datasets import load_dataset  # noqa: E402
from gym_tf.errors import GymTFError  # noqa: E402
from gym_tf.optimize import Optimizer, resume_config  # noqa: E402
from gym_tf.store import RunStore  # noqa: E402

# summaries on (off by default), so a kill can land in every learner stage
CONFIG = OptimizeConfig(dataset="quickstart", limit=12, batch_size=4, group_size=4, epochs=2, seed=7, summarize=True)
# gated: validated on the quickstart set (2 samples, so validation calls are the n=2 ones), by a model that reads
# its library, so the gate promotes some candidates and rejects others; it ends with the prune step
GATED = CONFIG.model_copy(update={"val_dataset": "quickstart", "val_samples": 2, "prune": True})


class LibraryReader(ScriptedBackend):
    """Its skill depends on the library in its prompt (a hash of the system message): candidates differ."""

    def skill_for(self, messages):
        return 0.2 + 0.15 * (int(hashlib.sha256(messages[0]["content"].encode()).hexdigest(), 16) % 5)


def scripted(delay: float = 0.0, gated: bool = False) -> ScriptedBackend:
    kind = LibraryReader if gated else ScriptedBackend
    return kind({p.problem: p.answer for p in load_dataset("quickstart")}, delay=delay)


if __name__ == "__main__":
    # crash_run.py WORKSPACE DELAY [gated] [--resume RUN]: a run, new or resumed; a domain error is one line on
    # stderr and exit status 1, as the CLI prints it
    store = RunStore(sys.argv[1])
    gated = "gated" in sys.argv[3:]
    resume = sys.argv[sys.argv.index("--resume") + 1] if "--resume" in sys.argv else None
    try:
        if resume:
            run_id, config = resume_config(store, resume)
            optimizer = Optimizer(config, store, scripted(delay=float(sys.argv[2]), gated=gated), run_id=run_id)
        else:
            optimizer = Optimizer(GATED if gated else CONFIG, store, scripted(delay=float(sys.argv[2]), gated=gated))
        print(optimizer.run_id, flush=True)
        asyncio.run(optimizer.run())
    except GymTFError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
