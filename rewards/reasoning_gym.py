"""Scoring reasoning-gym tasks with their own graders: `--reward rewards.reasoning_gym:score`.

Rows carry `rg_task` (the generator's name) and `rg_entry` (the generated entry as JSON, as
`benchmarks/learning_effect.py` writes them). The model's answer is its last `\\boxed{}`, else its last line.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any, Callable

from rewards.answers import last_boxed


@cache
def _grader(task: str) -> Callable[[str, dict], float]:
    import reasoning_gym

    return reasoning_gym.get_score_answer_fn(task)


def final_answer(completion: str) -> str:
    boxed = last_boxed(completion)
    if boxed is not None:
        return boxed
    lines = [line.strip() for line in completion.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def score(completions: list[str], rg_task: str, rg_entry: str, **_: Any) -> list[float]:
    entry = json.loads(rg_entry)
    grade = _grader(rg_task)
    return [float(grade(final_answer(c), entry)) for c in completions]
