"""Pulling the final answer out of a completion. Shared by the string rewards, majority voting and metrics."""

from __future__ import annotations

import re

_ANSWER_IS = re.compile(r"answer\s*(?:is|:)\s*\$?([^\n$]+?)\$?\s*(?:\.\s|\.$|$)", re.IGNORECASE | re.MULTILINE)
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (braces balanced), or None.

    >>> last_boxed(r"so \\boxed{\\frac{1}{2}}.")
    '\\\\frac{1}{2}'
    """
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j].strip()
    return None


def extract_answer(text: str) -> str | None:
    """The final answer: the last boxed expression, else "the answer is X", else the last number."""
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    stated = _ANSWER_IS.findall(text)
    if stated:
        return stated[-1].strip()
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


def normalize(text: str) -> str:
    """Lower-case, drop `$`, `\\text{}`, thousands separators, surrounding punctuation and extra spaces."""
    text = re.sub(r"\\text\{([^}]*)\}", r"\1", text)
    text = text.replace("$", "").replace("\\,", "").replace("\\!", "")
    text = re.sub(r"(?<=\d),(?=\d{3}\b)", "", text)
    text = re.sub(r"\s+", " ", text).strip().strip(".").strip()
    return text.lower()
