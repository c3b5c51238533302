"""Plot a run's learning curve: mean train reward per step, and validation reward when the run had a gate.

    python benchmarks/learning_curve.py RUN_ID [-o curve.png] [--workspace .gym-tf]
"""

from __future__ import annotations

import argparse

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from gym_tf.store import RunStore  # noqa: E402


def plot(store: RunStore, run_id: str, output: str) -> str:
    run = store.run(run_id)
    steps = store.steps(run["id"])
    xs = [s["step"] for s in steps]
    figure, axis = plt.subplots(figsize=(7, 4))
    axis.plot(xs, [s["stats"]["mean_reward"] for s in steps], marker="o", label="train: mean reward of the step's rollouts")
    val = [(s["step"], s["stats"]["val_mean"]) for s in steps if s["stats"].get("val_mean") is not None]
    baseline = run["summary"].get("val_baseline")
    if baseline is not None:
        val = [(0, baseline), *val]
    if val:
        axis.plot([x for x, _ in val], [y for _, y in val], marker="s", label="validation: mean reward of the kept library")
    for s in steps:
        if s["status"] == "rejected":
            axis.axvline(s["step"], color="red", alpha=0.2)
    axis.xaxis.set_major_locator(MaxNLocator(integer=True))
    axis.set_xlabel("step")
    axis.set_ylabel("reward")
    axis.set_ylim(-0.05, 1.05)
    axis.set_title(f"run {run['id']} ({run['model']})")
    axis.legend(loc="lower right")
    figure.tight_layout()
    figure.savefig(output, dpi=120)
    return output


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_id")
    parser.add_argument("-o", "--output", default="learning-curve.png")
    parser.add_argument("--workspace", default=None)
    args = parser.parse_args()
    print(plot(RunStore(args.workspace), args.run_id, args.output))
