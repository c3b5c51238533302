"""`gym-tf eval`: k samples per problem with a given library, scored, summarized as Mean@k / Pass@k / majority."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from gym_tf.backends import Backend, Sampling
from gym_tf.datasets import Problem
from gym_tf.library import EMPTY_LIBRARY, LibraryVersion
from gym_tf.metrics import Metrics, compute_metrics, majority_score
from gym_tf.rollouts import Rollout, rollout_many


@dataclass
class EvalReport:
    metrics: Metrics
    rollouts: dict[str, list[Rollout]]
    model: str
    library_version: str
    library_items: int
    prompt_tokens: int = 0
    completion_tokens: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def per_problem_mean(self) -> list[float]:
        return [sum(r.reward or 0.0 for r in g) / max(1, len(g)) for g in self.rollouts.values()]

    def per_problem_majority(self) -> list[float]:
        return [majority_score([r.completion for r in g], [r.reward or 0.0 for r in g]) for g in self.rollouts.values()]

    def prompt_tokens_per_call(self) -> float:
        calls = sum(len(g) for g in self.rollouts.values())
        return self.prompt_tokens / calls if calls else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "library_version": self.library_version,
            "library_items": self.library_items,
            "metrics": self.metrics.to_dict(),
            "tokens": {"prompt": self.prompt_tokens, "completion": self.completion_tokens},
            "problems": {
                pid: [{"sample": r.sample, "reward": r.reward, "shown": list(r.shown), "completion": r.completion}
                      for r in group]
                for pid, group in self.rollouts.items()
            },
            **self.extra,
        }

    def write(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2), encoding="utf-8")


async def evaluate(
    backend: Backend,
    problems: list[Problem],
    reward: Callable[..., Any],
    samples: int,
    sampling: Sampling,
    library: LibraryVersion = EMPTY_LIBRARY,
    seed: int = 0,
    on_group: Callable[[Problem, list[Rollout]], None] | None = None,
    stored: dict[str, list[Rollout]] | None = None,
) -> EvalReport:
    """Evaluate `library` (rendered per problem by its own policy) on `problems`. Seeds depend only on (seed,
    problem), so two libraries evaluated with the same seed are compared on the same draws, and a problem's group in
    `stored` (this library's, from an evaluation that stopped) is that problem's draw: it is not sampled again."""
    stored = {pid: group for pid, group in (stored or {}).items() if len(group) == samples}
    todo = [p for p in problems if p.id not in stored]
    groups = stored | await rollout_many(backend, todo, library, samples, sampling, reward, seed, "eval",
                                         on_group=on_group)
    ordered = [groups[p.id] for p in problems]
    metrics = compute_metrics([([r.completion for r in g], [r.reward for r in g]) for g in ordered], seed=seed)
    return EvalReport(
        metrics=metrics,
        rollouts={p.id: groups[p.id] for p in problems},
        model=backend.model,
        library_version=library.id,
        library_items=len(library.items),
        prompt_tokens=sum(r.prompt_tokens for g in ordered for r in g),
        completion_tokens=sum(r.completion_tokens for g in ordered for r in g),
    )
