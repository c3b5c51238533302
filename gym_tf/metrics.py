"""Mean@k, Pass@k and majority-vote accuracy over groups of k samples, each with a bootstrap 95% interval.

A reward of None (the reward had no signal) counts as 0 here: an answer nobody can credit is not a success.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import asdict, dataclass
from fractions import Fraction

import numpy as np

from rewards.answers import extract_answer, normalize


@dataclass(frozen=True)
class Estimate:
    value: float
    low: float
    high: float

    def __str__(self) -> str:
        return f"{self.value:.3f} [{self.low:.3f}, {self.high:.3f}]"


@dataclass(frozen=True)
class Metrics:
    problems: int
    samples: int
    mean_at_k: Estimate
    pass_at_k: Estimate
    majority: Estimate

    def to_dict(self) -> dict:
        return asdict(self)


def bootstrap(per_problem: np.ndarray, resamples: int = 2000, seed: int = 0) -> Estimate:
    """Mean over problems with a percentile bootstrap interval (problems resampled with replacement)."""
    if len(per_problem) == 0:
        return Estimate(0.0, 0.0, 0.0)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(per_problem), size=(resamples, len(per_problem)))
    means = per_problem[picks].mean(axis=1)
    return Estimate(float(per_problem.mean()), float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5)))


def majority_score(completions: list[str], rewards: list[float]) -> float:
    """Self-consistency: the reward of the most common final answer; 0 when no completion has an answer.

    Answers are grouped by the verifier's own equivalence where it has spoken (every answer it scored correct is the
    same answer as the reference, so `1/2` and `0.5` vote together) and by a canonical form otherwise. A tie is
    scored as the mean over the tied answers, the expected score of a fair coin: no sample order is favoured.
    """
    votes: Counter = Counter()
    worth: dict[object, float] = {}
    for completion, reward in zip(completions, rewards):
        answer = extract_answer(completion)
        if answer is None:
            continue
        key = "correct" if reward >= 1 else canonical_answer(answer)
        votes[key] += 1
        worth[key] = max(worth.get(key, 0.0), reward)
    if not votes:
        return 0.0
    top = max(votes.values())
    tied = [key for key, count in votes.items() if count == top]
    return sum(worth[key] for key in tied) / len(tied)


def canonical_answer(answer: str) -> object:
    """A number as an exact fraction (`0.5`, `1/2` and `\\frac{1}{2}` alike), anything else normalized text."""
    text = normalize(answer)
    text = re.sub(r"\\d?frac\{([^{}]+)\}\{([^{}]+)\}", r"(\1)/(\2)", text)
    try:
        if re.fullmatch(r"\(?-?[\d.]+\)?(/\(?-?[\d.]+\)?)?", text):
            num, _, den = text.replace("(", "").replace(")", "").partition("/")
            return Fraction(num) / Fraction(den or "1")
    except (ValueError, ZeroDivisionError):
        pass
    return text


def compute_metrics(groups: list[tuple[list[str], list[float | None]]], seed: int = 0) -> Metrics:
    """`groups` holds, per problem, the k completions and their rewards."""
    rewards = [[0.0 if r is None else r for r in scores] for _, scores in groups]
    mean = np.array([np.mean(r) for r in rewards])
    best = np.array([max(r) for r in rewards])
    vote = np.array([majority_score(c, r) for (c, _), r in zip(groups, rewards)])
    return Metrics(
        problems=len(groups),
        samples=max((len(r) for r in rewards), default=0),
        mean_at_k=bootstrap(mean, seed=seed),
        pass_at_k=bootstrap(best, seed=seed),
        majority=bootstrap(vote, seed=seed),
    )


def paired_difference(candidate: list[float], baseline: list[float], seed: int = 0) -> Estimate:
    """Mean per-problem difference candidate - baseline, with a bootstrap interval (same problems, same seeds)."""
    return bootstrap(np.array(candidate) - np.array(baseline), seed=seed)
