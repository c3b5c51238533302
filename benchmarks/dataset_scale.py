"""Big datasets: peak memory to start a run against problem count, rollout rows written per second, resume time.

    python benchmarks/dataset_scale.py                    # 1,000 / 10,000 / 50,000 problems
    python benchmarks/dataset_scale.py --sizes 50000 --row-chars 4000

For each size it writes a JSONL dataset (problems of `--row-chars` characters), then, each in a fresh process, runs
`optimize`'s first step on it (a real `Optimizer` and run store; a constant model, so optimize's own memory is what
is measured) and stops:
- `lazy`: as optimize runs now (`open_dataset`: rows stay on disk, a batch is read when its step comes);
- `whole`: the same after `load_dataset` has read every row into memory: the baseline, measured in the same run.
It prints each one's peak RSS (the process's own, interpreter and imports included) and the ratio lazy / whole.
Then, on the largest size: rollout rows per second through `RunStore.put_rollouts` (the path optimize stores
groups by, one step of 8 groups x 4 samples per transaction), and the time to resume (opening the dataset again,
from the index the first opening saved, and checking it against what the run recorded) against the first opening.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

CHILD = """
import asyncio, resource, sys, time
from gym_tf.backends import Choice, Generation
from gym_tf.config import OptimizeConfig
from gym_tf.datasets import load_dataset
from gym_tf.optimize import Optimizer
from gym_tf.store import RunStore
path, mode, workspace = sys.argv[1:4]


class Constant:  # a model that always answers 1: optimize's own work, not a model's, is what is measured
    model = "constant"
    def describe(self): return "constant"
    async def generate(self, messages, n=1, **sampling):
        return Generation([Choice("so \\\\boxed{1}", "stop", 3) for _ in range(n)], 20 * n, 3 * n, 0.0)
    async def aclose(self): pass


class FirstStepDone(Exception):
    pass


def stop_after_first(progress):
    if progress.step > 1:
        raise FirstStepDone


start = time.perf_counter()
if mode == "whole":  # the baseline: every row in memory first, as before
    problems = load_dataset(path)
store = RunStore(workspace)
config = OptimizeConfig(dataset=path, epochs=1, batch_size=8, group_size=2, summarize=False)
optimizer = Optimizer(config, store, Constant(), on_progress=stop_after_first)
try:
    asyncio.run(optimizer.run())
except FirstStepDone:
    pass
assert len(store.steps(optimizer.run_id)) == 1, "the first step did not commit"
print(len(optimizer.problems), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.perf_counter() - start)
"""


def write_dataset(path: Path, count: int, chars: int) -> None:
    filler = ("Consider the quantities carefully. " * (chars // 35 + 1))[:chars]
    with path.open("w") as out:
        for i in range(count):
            out.write(json.dumps({"problem": f"Problem {i}: {filler} What is {i} + 1?", "answer": str(i + 1)}) + "\n")


def child(path: Path, mode: str, workspace: Path) -> tuple[int, float, float]:
    result = subprocess.run([sys.executable, "-c", CHILD, str(path), mode, str(workspace)], capture_output=True,
                            text=True, check=True)
    count, rss_kib, seconds = result.stdout.split()
    return int(count), int(rss_kib) / 1024, float(seconds)


def store_speed(path: Path, workspace: Path, steps: int) -> tuple[float, float, float]:
    from gym_tf.datasets import open_dataset
    from gym_tf.rollouts import Rollout
    from gym_tf.store import RunStore

    store = RunStore(workspace)
    index_dir = store.root / "dataset-index"  # where optimize keeps it
    start = time.perf_counter()
    problems = open_dataset(path, index_dir=index_dir)
    first_open = time.perf_counter() - start
    run = store.new_run("optimize", {"dataset": str(path)}, "m", str(path), "empty")
    store.check_dataset(run, problems)
    rows = 0
    start = time.perf_counter()
    for step in range(1, steps + 1):
        batch = [problems[(step * 8 + g) % len(problems)] for g in range(8)]
        rollouts = [Rollout(problem_id=p.id, sample=s, messages=[{"role": "user", "content": p.problem}],
                            completion=f"The answer is {s}.", finish_reason="stop", prompt_tokens=300,
                            completion_tokens=40, latency_s=1.0, reward=float(s == 0)) for p in batch for s in range(4)]
        store.put_rollouts(run, 0, step, rollouts)
        rows += len(rollouts)
    written = rows / (time.perf_counter() - start)
    start = time.perf_counter()
    # a resume: open again (the file unchanged: its saved index), compare with the record
    RunStore(workspace).check_dataset(run, open_dataset(path, index_dir=index_dir))
    return written, first_open, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,10000,50000")
    parser.add_argument("--row-chars", type=int, default=2000, help="characters per problem")
    parser.add_argument("--steps", type=int, default=200, help="steps of rollouts written for the store's speed")
    args = parser.parse_args()
    console = Console()
    table = Table(title=f"the first optimize step on N problems of {args.row_chars} characters: peak RSS")
    for column in ("problems", "file MiB", "lazy MiB", "whole MiB", "lazy / whole", "lazy first step s", "whole first step s"):
        table.add_column(column, justify="right")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        sizes = [int(s) for s in args.sizes.split(",")]
        for size in sizes:
            path = root / f"d{size}.jsonl"
            write_dataset(path, size, args.row_chars)
            n1, lazy, lazy_s = child(path, "lazy", root / f"wl{size}")
            n2, whole, whole_s = child(path, "whole", root / f"ww{size}")
            assert n1 == n2 == size
            table.add_row(str(size), f"{path.stat().st_size / 2**20:.0f}", f"{lazy:.0f}", f"{whole:.0f}",
                          f"{lazy / whole:.2f}", f"{lazy_s:.2f}", f"{whole_s:.2f}")
            console.print(f"{size} problems: lazy {lazy:.0f} MiB, whole {whole:.0f} MiB", highlight=False)
        console.print(table)
        written, first_open, resume = store_speed(root / f"d{sizes[-1]}.jsonl", root / "speed", args.steps)
        console.print(f"run store: {written:,.0f} rollout rows/s written (8 groups x 4 per step). On {sizes[-1]:,} "
                      f"problems: first opening (every row read and checked) {first_open:.2f} s; resume (opened "
                      f"again and checked) {resume:.2f} s, {resume / first_open:.3f}x", highlight=False)


if __name__ == "__main__":
    main()
