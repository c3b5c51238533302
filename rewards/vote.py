"""Majority vote as a pseudo-reward, for data without reference answers (test-time RL style)."""

from __future__ import annotations

from collections import Counter

from rewards.answers import extract_answer, normalize


def majority_vote(completions: list[str], **_: object) -> list[float | None]:
    """1.0 for completions whose answer equals the group's most common answer, 0.0 for the others.

    The group is the G completions of one problem, so this needs G >= 2 to mean anything. Completions with no
    answer get 0.0; a group where no completion has an answer gets None (no signal).
    """
    answers = [extract_answer(c) for c in completions]
    keys = [normalize(a) if a is not None else None for a in answers]
    counts = Counter(k for k in keys if k is not None)
    if not counts:
        return [None] * len(completions)
    winner, _ = counts.most_common(1)[0]
    return [1.0 if k == winner else 0.0 for k in keys]
