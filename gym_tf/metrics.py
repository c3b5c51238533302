"""Mean@k, Pass@k and majority-vote accuracy over groups of k samples, each with a bootstrap 95% interval.

A reward of None (the reward had no signal) counts as 0 here: an answer nobody can credit is not a success.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass

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
    """The reward of the most common final answer (self-consistency); 0 when no completion has an answer."""
    keys = [normalize(a) if (a := extract_answer(c)) is not None else None for c in completions]
    counts = Counter(k for k in keys if k is not None)
    if not counts:
        return 0.0
    winner = counts.most_common(1)[0][0]
    return rewards[keys.index(winner)]


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
