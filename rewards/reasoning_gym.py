"""Scoring reasoning-gym tasks with their own graders: `--reward rewards.reasoning_gym:score`.

Rows carry `rg_task` (the generator's name) and `rg_entry` (the generated entry as JSON, as
`benchmarks/learning_effect.py` writes them). The model's answer is its last `\\boxed{}`, else its last line.
The solve prompt asks for `\\boxed{}`, so models answer in LaTeX, which some graders cannot read: coin_flip's grader
takes "1/8" or "0.125" but scores `\\frac{1}{8}` 0. An answer is graded as written and as plain text (`plain`), and
keeps the better grade: the grader still decides what is right.
"""

from __future__ import annotations

import json
import re
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


_FRACTION = re.compile(r"\\[dt]?frac\{([^{}]*)\}\{([^{}]*)\}")
_WRAPPER = re.compile(r"\\(?:text|mathrm|mathbf)\{([^{}]*)\}")
_SPACING = re.compile(r"\\[,;!]|\\left|\\right|\$|\\\(|\\\)")


def plain(answer: str) -> str:
    """An answer's LaTeX as plain text: fractions as a/b, text wrappers and spacing dropped.

    >>> plain(r"\\dfrac{3}{8}"), plain(r"\\text{Tuesday}"), plain(r"-\\frac{1}{2}")
    ('3/8', 'Tuesday', '-1/2')
    """
    text = _WRAPPER.sub(r"\1", answer)
    while (simpler := _FRACTION.sub(lambda m: f"{_grouped(m[1])}/{_grouped(m[2])}", text)) != text:
        text = simpler
    return _SPACING.sub("", text).replace("\\%", "%").strip()


def _grouped(term: str) -> str:
    term = term.strip()
    return term if re.fullmatch(r"[\w.]+", term) else f"({term})"


def score(completions: list[str], rg_task: str, rg_entry: str, **_: Any) -> list[float]:
    """Each completion's grade. The row must grade its own reference answer: a failure there is the row's (or the
    grader's) and is raised. An answer the grader fails to read scores 0: some graders raise on free text instead of
    scoring it (prime_factorization's int() of "So, the prime factorization ..." stopped a whole run)."""
    entry = json.loads(rg_entry)
    grade = _grader(rg_task)
    grade(str(entry["answer"]), entry)
    return [_graded(grade, final_answer(c), entry) for c in completions]


def _graded(grade: Callable[[str, dict], float], answer: str, entry: dict) -> float:
    readings = {answer, plain(answer)}
    return max(_grade(grade, reading, entry) for reading in readings)


def _grade(grade: Callable[[str, dict], float], answer: str, entry: dict) -> float:
    try:
        return float(grade(answer, entry))
    except Exception:  # the grader's own code on the model's text: an unreadable answer is a wrong one
        return 0.0
