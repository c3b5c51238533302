"""String, number, regex and multiple-choice rewards. Each reads the final answer with `extract_answer`."""

from __future__ import annotations

import re
from fractions import Fraction

from rewards.answers import extract_answer, normalize


def exact_match(completions: list[str], answer: str, **_: object) -> list[float | None]:
    """1.0 where the extracted answer equals `answer` character for character."""
    return [1.0 if extract_answer(c) == str(answer).strip() else 0.0 for c in completions]


def normalized_match(completions: list[str], answer: str, **_: object) -> list[float | None]:
    """1.0 where the answers match after `normalize` (case, spaces, `$`, thousands separators)."""
    gold = normalize(str(answer))
    return [1.0 if (a := extract_answer(c)) is not None and normalize(a) == gold else 0.0 for c in completions]


def _number(text: str | None) -> float | None:
    if text is None:
        return None
    text = normalize(text).replace("\\frac{", "").replace("}{", "/").rstrip("}").rstrip("%")
    try:
        return float(Fraction(text))
    except (ValueError, ZeroDivisionError):
        return None


def numeric_match(
    completions: list[str], answer: str, rel_tol: float = 1e-6, abs_tol: float = 1e-9, **_: object
) -> list[float | None]:
    """1.0 where the extracted number is within `rel_tol` (relative) or `abs_tol` (absolute) of `answer`.

    Returns None for every completion when the gold answer itself is not a number.
    """
    gold = _number(str(answer))
    if gold is None:
        return [None] * len(completions)
    scores: list[float | None] = []
    for completion in completions:
        value = _number(extract_answer(completion))
        close = value is not None and abs(value - gold) <= max(abs_tol, rel_tol * abs(gold))
        scores.append(1.0 if close else 0.0)
    return scores


def regex_match(completions: list[str], pattern: str, **_: object) -> list[float | None]:
    """1.0 where the regular expression `pattern` (a dataset column) matches anywhere in the completion."""
    compiled = re.compile(pattern, re.IGNORECASE | re.DOTALL)
    return [1.0 if compiled.search(c) else 0.0 for c in completions]


# Where a multiple-choice answer is stated, strongest first. A bare letter counts only alone on its line ("B", "(B)",
# "B."): the start of any line would read "I hope this helps" as option I. Letters are capitals unless boxed or in
# parentheses, so the article in "the answer is a bit subtle" is not option A.
_LETTER = r"(?:\(([A-Ja-j])\)|([A-J])\b)"
_CHOICE_FORMS = [
    re.compile(r"\\boxed\{\s*\(?([A-Ja-j])\)?\s*\}"),
    re.compile(r"(?i:answer)\s*(?:is|:)\s*" + _LETTER),
    re.compile(r"^\s*" + _LETTER + r"\s*[.:]?\s*$", re.MULTILINE),
]


def chosen_letter(text: str) -> str | None:
    """The multiple-choice letter a completion states: the last boxed one, else the last "answer is X", else the
    last letter standing alone on a line.

    >>> chosen_letter("The answer is (B).\\nI hope this helps.")
    'B'
    """
    for form in _CHOICE_FORMS:
        found = form.findall(text)
        if found:
            return "".join(found[-1]).upper()
    return None


def choice_letter(completions: list[str], answer: str, **_: object) -> list[float | None]:
    """1.0 where the chosen multiple-choice letter (A-J, see `chosen_letter`) equals `answer`."""
    gold = str(answer).strip().strip("()").upper()
    return [1.0 if chosen_letter(c) == gold else 0.0 for c in completions]
