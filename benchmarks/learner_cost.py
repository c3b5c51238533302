"""Learner LLM calls and tokens per step, against the reference design's count for the same batch.

The reference design (youtu-agent's training-free GRPO) spends, per step: one summary per rollout of every
non-skipped group, one group-advantage call per non-skipped problem, one consolidation. gym-tf must spend no more,
and nothing on skipped groups.

    python benchmarks/learner_cost.py                 # the scripted fake learner: exact, deterministic counts
    python benchmarks/learner_cost.py --embedded      # the real embedded model (slow: minutes)
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from fakes import ScriptedBackend  # noqa: E402
from gym_tf.config import OptimizeConfig, RolloutConfig  # noqa: E402
from gym_tf.datasets import load_dataset  # noqa: E402
from gym_tf.optimize import Optimizer  # noqa: E402
from gym_tf.store import RunStore  # noqa: E402


def reference_calls(rewards_by_problem: dict[str, list[float]]) -> int:
    """The reference design's learner calls for one step, counted from its published description and the step's
    raw rewards (not from gym-tf's own bookkeeping): homogeneous groups (all 0 or all 1) are skipped; every other
    group costs one summary per rollout and one group-advantage call; the step costs one consolidation if any
    group was used (../shared/research/reference-algorithm.md)."""
    used = [r for r in rewards_by_problem.values() if len(set(r)) > 1]
    return sum(len(r) for r in used) + len(used) + (1 if used else 0)


async def measure(backend, config: OptimizeConfig) -> list[dict]:
    store = RunStore(tempfile.mkdtemp())
    result = await Optimizer(config, store, backend).run()
    rows = []
    for step in store.steps(result.run_id):
        calls = list(store.db["learner_calls"].rows_where("run_id = ? and step = ?", [result.run_id, step["step"]]))
        rows.append({
            "step": step["step"],
            "used": step["stats"]["groups_used"],
            "skipped": step["stats"]["groups_skipped"],
            "calls": len(calls),
            "tokens": sum(c["prompt_tokens"] + c["completion_tokens"] for c in calls),
            "reference": reference_calls(step_rewards(store, result.run_id, step["step"])),
        })
    return rows


def step_rewards(store: RunStore, run_id: str, step: int) -> dict[str, list[float]]:
    groups: dict[str, list[float]] = {}
    for r in store.db["rollouts"].rows_where("run_id = ? and step = ? and problem_id not like 'val/%' "
                                               "and problem_id not like 'learner/%'", [run_id, step]):
        groups.setdefault(r["problem_id"], []).append(r["reward"] or 0.0)
    return groups


def show(title: str, rows: list[dict]) -> None:
    table = Table(title=title)
    for column in ("step", "groups used", "skipped", "learner calls", "reference calls", "ratio", "learner tokens"):
        table.add_column(column)
    for r in rows:
        ratio = f"{r['calls'] / r['reference']:.2f}" if r["reference"] else "-"
        table.add_row(str(r["step"]), str(r["used"]), str(r["skipped"]), str(r["calls"]), str(r["reference"]), ratio,
                      str(r["tokens"]))
    Console().print(table)
    total, ref = sum(r["calls"] for r in rows), sum(r["reference"] for r in rows)
    skipped_only = [r for r in rows if r["used"] == 0]
    Console().print(f"{title}: {total} learner calls vs {ref} in the reference design (ratio {total / max(ref, 1):.2f}); "
                    f"steps with only skipped groups spent {sum(r['calls'] for r in skipped_only)} calls")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--embedded", action="store_true")
    args = parser.parse_args()
    if args.embedded:
        from gym_tf.backends.embedded import EmbeddedBackend

        backend = EmbeddedBackend()
        base = OptimizeConfig(dataset="quickstart", limit=4, batch_size=2, group_size=2, epochs=1, summarize=True,
                              rollout=RolloutConfig(max_completion_tokens=128))
    else:
        answers = {p.problem: p.answer for p in load_dataset("quickstart")}
        backend = ScriptedBackend(answers)
        base = OptimizeConfig(dataset="quickstart", limit=24, batch_size=8, group_size=4, epochs=1,
                              worked_examples=False, summarize=True)
    show("paper design (summaries on)", asyncio.run(measure(backend, base)))
    show("summaries off", asyncio.run(measure(backend, base.model_copy(update={"summarize": False}))))
    if not args.embedded:
        show("all groups homogeneous", asyncio.run(measure(ScriptedBackend(answers, skill=1.0), base)))
