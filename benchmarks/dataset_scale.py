"""Big datasets: peak memory to start a run against problem count, rollout rows written per second, resume time.

    python benchmarks/dataset_scale.py                    # 1,000 / 10,000 / 50,000 problems
    python benchmarks/dataset_scale.py --sizes 50000 --row-chars 4000

For each size it writes a JSONL dataset (problems of `--row-chars` characters), then, each in a fresh process:
- `lazy`: what `optimize` does before its first step: `open_dataset` (rows stay on disk), the dataset recorded in
  a real run store, and the first batch read;
- `whole`: the same with `load_dataset` (every row in memory): the baseline, measured in the same run.
It prints each one's peak RSS (the process's own, interpreter and imports included) and the ratio lazy / whole.
Then, on the largest size: rollout rows per second through `RunStore.put_rollouts` (the path optimize stores
groups by, one step of 8 groups x 4 samples per transaction), and the time to resume: opening the run again and
checking its dataset against what was recorded.
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
import resource, sys, time
from gym_tf.datasets import load_dataset, open_dataset
from gym_tf.store import RunStore
path, mode, workspace = sys.argv[1:4]
start = time.perf_counter()
problems = (open_dataset if mode == "lazy" else load_dataset)(path)
store = RunStore(workspace)
run = store.new_run("optimize", {"dataset": path}, "m", path, "empty")
store.check_dataset(run, problems)
first = [problems[i] for i in range(8)]
print(len(problems), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.perf_counter() - start)
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


def store_speed(path: Path, workspace: Path, steps: int) -> tuple[float, float]:
    from gym_tf.datasets import open_dataset
    from gym_tf.rollouts import Rollout
    from gym_tf.store import RunStore

    problems = open_dataset(path)
    store = RunStore(workspace)
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
    RunStore(workspace).check_dataset(run, open_dataset(path))  # a resume: open again, compare with the record
    return written, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,10000,50000")
    parser.add_argument("--row-chars", type=int, default=2000, help="characters per problem")
    parser.add_argument("--steps", type=int, default=200, help="steps of rollouts written for the store's speed")
    args = parser.parse_args()
    console = Console()
    table = Table(title=f"starting a run on N problems of {args.row_chars} characters: peak RSS")
    for column in ("problems", "file MiB", "lazy MiB", "whole MiB", "lazy / whole", "lazy start s", "whole start s"):
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
        written, resume = store_speed(root / f"d{sizes[-1]}.jsonl", root / "speed", args.steps)
        console.print(f"run store: {written:,.0f} rollout rows/s written (8 groups x 4 per step); resume check on "
                      f"{sizes[-1]:,} problems: {resume:.2f} s", highlight=False)


if __name__ == "__main__":
    main()
