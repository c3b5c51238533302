"""Scoring reasoning-gym tasks with their own graders: `--reward rewards.reasoning_gym:score`.

Rows carry `rg_task` (the generator's name) and `rg_entry` (the generated entry as JSON, as
`benchmarks/learning_effect.py` writes them). The model's answer is its last `\\boxed{}`, else its last line.
The solve prompt asks for `\\boxed{}`, so models answer in LaTeX, which some graders cannot read: coin_flip's grader
takes "1/8" or "0.125" but scores `\\frac{1}{8}` 0. An answer is graded as written and as plain text (`plain`), and
keeps the better grade: the grader still decides what is right.

An entry is stored as JSON text, which has no tuples: arc_agi's and rearc's graders compare the answer with a tuple
grid in the entry and scored their own reference answers 0.05 once it came back as lists. `entry_text` keeps a tuple
as `{"__tuple__": [...]}`, and `read_entry` turns it back. A row whose grader does not give its own reference answer
full marks cannot grade the model's: `reference_grade` is what `score` checks (and the benchmark, before sampling).

Some graders read their generator's settings: time_intervals gives partial credit by `1 - error /
max_time_difference_seconds`, word_ladder looks words up in the lengths its settings load, decimal_arithmetic's
tolerance and puzzle24's range of numbers are settings too. A row made at other settings than the family's defaults
carries them in `rg_config` (`settings_text`), and its grader is built with them. Without them, time_intervals at
level 0 (60 s apart at most) paid an answer 10 minutes off 0.99 instead of 0, and word_ladder's grader failed its own
answers of three letters.
"""

from __future__ import annotations

import json
import re
from functools import cache
from typing import Any, Callable

from rewards.answers import last_boxed


@cache
def _grader(task: str, settings: str = "{}") -> Callable[[str, dict], float]:
    """The grader of `task`'s problems made with `settings` (`settings_text`; the defaults where empty)."""
    import reasoning_gym

    return reasoning_gym.create_dataset(task, **read_entry(settings)).score_answer


def settings_text(task: str, settings: dict[str, Any]) -> str:
    """The generator `settings` that differ from `task`'s defaults, in value or type (number_sorting's level 0 sets
    its float bounds as ints), as `rg_config` text (tuples kept, as in `entry_text`). A setting JSON cannot hold is a
    TypeError: a grader built without it could grade wrongly."""
    from reasoning_gym.factory import DATASETS

    if not settings:
        return "{}"  # the defaults (and an unknown family is reasoning-gym's to name, where it makes the problems)
    defaults = vars(DATASETS[task][1]())
    changed = {k: v for k, v in sorted(settings.items())
               if k not in defaults or type(defaults[k]) is not type(v) or defaults[k] != v}
    return json.dumps(_kept(changed))


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


_TUPLE = "__tuple__"


def entry_text(generated: dict) -> str:
    """A generated entry as JSON, its tuples kept (see above); what JSON cannot hold is written as text."""
    return json.dumps(_kept(generated), default=str)


def _kept(value: Any) -> Any:
    if isinstance(value, tuple):
        return {_TUPLE: [_kept(v) for v in value]}
    if isinstance(value, list):
        return [_kept(v) for v in value]
    if isinstance(value, dict):
        return {k: _kept(v) for k, v in value.items()}
    return value


def read_entry(text: str) -> dict:
    """The entry `entry_text` wrote (or plain JSON), as the grader reads it."""
    return json.loads(text, object_hook=lambda d: tuple(d[_TUPLE]) if d.keys() == {_TUPLE} else d)


def reference_grade(rg_task: str, generated: dict, settings: str = "{}") -> float | None:
    """The grade the task's grader gives the entry's own answer; None where the entry has none (graders that check an
    answer's validity, such as graph_color's, have no single answer). An exception is the row's, and is raised."""
    if generated.get("answer") is None:
        return None
    return float(_grader(rg_task, settings)(str(generated["answer"]), generated))


NOT_AN_ANSWER = "gym-tf: this is not an answer"


def accepts_anything(rg_task: str, generated: dict, settings: str = "{}") -> bool:
    """Whether the task's grader gives full marks to text that answers nothing: such a row cannot tell a right answer
    from a wrong one. game_of_life_halting's grader compares `bool(answer)` with `bool("False")`, so every non-empty
    answer scores 1."""
    return _grade(_grader(rg_task, settings), NOT_AN_ANSWER, generated) >= 1


def score(completions: list[str], rg_task: str, rg_entry: str, rg_config: str = "{}", **_: Any) -> list[float]:
    """Each completion's grade, by the grader of the settings the row was made with (`rg_config`; a row without
    it was made at the defaults). The row must grade its own reference answer 1: a failure there is the row's (or the
    grader's) and is raised. An answer the grader fails to read scores 0: some graders raise on free text instead of
    scoring it (prime_factorization's int() of "So, the prime factorization ..." stopped a whole run)."""
    generated = read_entry(rg_entry)
    reference = reference_grade(rg_task, generated, rg_config)
    if reference is not None and reference < 1:
        raise ValueError(f"{rg_task}'s grader gives this row's own answer {reference:.2f}, so it cannot grade others")
    grade = _grader(rg_task, rg_config)
    return [_graded(grade, final_answer(c), generated) for c in completions]


def _graded(grade: Callable[[str, dict], float], answer: str, entry: dict) -> float:
    readings = {answer, plain(answer)}
    return max(_grade(grade, reading, entry) for reading in readings)


def _grade(grade: Callable[[str, dict], float], answer: str, entry: dict) -> float:
    try:
        return float(grade(answer, entry))
    except Exception:  # the grader's own code on the model's text: an unreadable answer is a wrong one
        return 0.0
