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


def reference_calls(groups_used: int, group_size: int) -> int:
    return groups_used * group_size + groups_used + (1 if groups_used else 0)


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
            "reference": reference_calls(step["stats"]["groups_used"], config.group_size),
        })
    return rows


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
        base = OptimizeConfig(dataset="quickstart", limit=4, batch_size=2, group_size=2, epochs=1,
                              rollout=RolloutConfig(max_completion_tokens=128))
    else:
        answers = {p.problem: p.answer for p in load_dataset("quickstart")}
        backend = ScriptedBackend(answers)
        base = OptimizeConfig(dataset="quickstart", limit=24, batch_size=8, group_size=4, epochs=1)
    show("paper design (summaries on)", asyncio.run(measure(backend, base)))
    show("summaries off", asyncio.run(measure(backend, base.model_copy(update={"summarize": False}))))
    if not args.embedded:
        show("all groups homogeneous", asyncio.run(measure(ScriptedBackend(answers, skill=1.0), base)))
