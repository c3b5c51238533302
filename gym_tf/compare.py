"""Several libraries on the same problems with the same seeds: does a library beat no library, and does it beat
simply sampling k times and voting (the same model's majority vote at equal samples)? And what does it cost?

Every difference is paired per problem (the same problems and seeds for every library) with a bootstrap 95%
interval. The first library is the baseline, normally `none`.
"""

from __future__ import annotations

import json
import logging
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from gym_tf.backends import Backend, Sampling
from gym_tf.datasets import Problem
from gym_tf.evaluate import EvalReport, evaluate
from gym_tf.library import LibraryVersion, answer_in_problem, copies_example, example_solutions, problems_held_in
from gym_tf.metrics import Estimate, paired_difference
from gym_tf.errors import RewardError
from gym_tf.rollouts import Rollout, score

logger = logging.getLogger(__name__)


@dataclass
class Arm:
    name: str
    report: EvalReport
    learning_tokens: int = 0  # tokens spent learning this library (its run's total), 0 for none
    vs_baseline: Estimate | None = None  # Mean@k difference, per problem, against the baseline's Mean@k
    majority_vs_baseline: Estimate | None = None  # Majority@k against the baseline's Majority@k
    mean_vs_baseline_majority: Estimate | None = None  # this library's Mean@k against the baseline's Majority@k
    mean_vs_constant: Estimate | None = None  # this library's Mean@k against giving every problem the common answer
    # Mean@k against the baseline's on the problems the common answer gets wrong: a gain there is not that answer
    vs_baseline_uncommon: Estimate | None = None
    # Mean@k against the baseline's on the problems that do not state their own answer (`answer_in_problem`), where
    # some do: a gain there is not copying the question (a converged sequence's last term, a palindrome)
    vs_baseline_unstated: Estimate | None = None
    # where the reward pays partial credit, the share of answers given full credit against the baseline's: a gain in
    # partial credit alone (a legal move that is not the answer, the answer's form) is not more right answers
    full_credit_vs_baseline: Estimate | None = None
    # Mean@k of this arm's answers given instead to other problems (`swapped_means`), and, per problem, its Mean@k
    # less that against the baseline's: a gain there is answers fitted to their own problems, not a prior over answers
    swapped_mean: float | None = None
    vs_baseline_beyond_swapped: Estimate | None = None
    held_in_library: list[str] = field(default_factory=list)  # problems the library holds verbatim: not held out
    copies: Copies | None = None  # the answers that repeat a worked example shown to them (None: no examples shown)
    same_as: str | None = None  # an earlier arm that sends the same prompts, whose samples this one shares
    library_version: str = ""  # this arm's own version (not its report's where it shares an earlier arm's samples)

    def to_dict(self) -> dict[str, Any]:
        def est(e: Estimate | None) -> dict | None:
            return None if e is None else {"value": e.value, "low": e.low, "high": e.high}

        return {"name": self.name, "library_version": self.library_version,
                "library_items": self.report.library_items, "metrics": self.report.metrics.to_dict(),
                "tokens": {"prompt": self.report.prompt_tokens, "completion": self.report.completion_tokens,
                           "prompt_per_call": self.report.prompt_tokens_per_call(), "learning": self.learning_tokens},
                "mean_vs_baseline": est(self.vs_baseline), "majority_vs_baseline": est(self.majority_vs_baseline),
                "mean_vs_baseline_majority": est(self.mean_vs_baseline_majority),
                "mean_vs_constant": est(self.mean_vs_constant),
                "mean_vs_baseline_uncommon": est(self.vs_baseline_uncommon),
                "mean_vs_baseline_unstated": est(self.vs_baseline_unstated),
                "full_credit_vs_baseline": est(self.full_credit_vs_baseline),
                "swapped_mean": self.swapped_mean,
                "mean_vs_baseline_beyond_swapped": est(self.vs_baseline_beyond_swapped),
                "copies": self.copies and self.copies.to_dict(),
                "problems_held_in_library": self.held_in_library, "same_as": self.same_as}


@dataclass(frozen=True)
class Copies:
    """How many of an arm's answers repeat the solution of a worked example in their prompt (`copies_example`), and
    how they scored: a library whose gain comes from copies taught the example's answer, not its working."""

    copied: int  # the answers that copy
    of: int  # the arm's answers, shown an example or not
    mean_reward: float | None  # of the copies; None with none

    @property
    def share(self) -> float:
        return self.copied / self.of if self.of else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"copied": self.copied, "of": self.of, "share": self.share, "mean_reward": self.mean_reward}

    def __str__(self) -> str:
        right = f", right {self.mean_reward:.2f}" if self.mean_reward is not None else ""
        return f"{self.copied} of {self.of} ({self.share:.0%}{right})"


def count_copies(report: EvalReport, library: LibraryVersion) -> Copies | None:
    """The answers in `report` that repeat a worked example of `library` shown to them; None where no example was
    shown to any."""
    solutions = example_solutions(library)
    answers = [r for group in report.rollouts.values() for r in group]
    if not any(s in solutions for r in answers for s in r.shown):
        return None
    copied = [r.reward or 0.0 for r in answers
              if copies_example(r.completion, [solutions[s] for s in r.shown if s in solutions])]
    return Copies(len(copied), len(answers), sum(copied) / len(copied) if copied else None)


@dataclass
class ConstantAnswer:
    """The problems' most common reference answer, given to every problem and graded by the same reward: what a
    library scores that taught the model that one answer and nothing else. isomorphic_strings (True or False) went
    from 0.03 to 0.70 with worked examples that all boxed True, on a test split whose answer is True 17 times in 24."""

    answer: str
    scores: dict[str, float]  # per problem id

    @property
    def mean(self) -> float:
        return sum(self.scores.values()) / max(1, len(self.scores))


@dataclass
class Comparison:
    arms: list[Arm]
    problems: int
    samples: int
    seed: int
    constant: ConstantAnswer | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def baseline(self) -> Arm:
        return self.arms[0]

    def extra_prompt_tokens(self, arm: Arm) -> float:
        return arm.report.prompt_tokens_per_call() - self.baseline.report.prompt_tokens_per_call()

    def to_dict(self) -> dict[str, Any]:
        constant = self.constant and {"answer": self.constant.answer, "mean": self.constant.mean}
        return {"problems": self.problems, "samples": self.samples, "seed": self.seed,
                "baseline": self.baseline.name, "arms": [a.to_dict() for a in self.arms], "constant_answer": constant,
                "extra_prompt_tokens_per_call": {a.name: self.extra_prompt_tokens(a) for a in self.arms}, **self.extra}

    def write(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2), encoding="utf-8")

    def record(self, store: Any, dataset: str) -> str:
        """Keep it in the workspace (the studio's evaluations); returns its id."""
        return store.put_evaluation({**self.to_dict(), "per_problem": self.per_problem()}, dataset,
                                    self.baseline.report.model, self.problems, self.samples)

    def per_problem(self) -> dict[str, dict[str, dict[str, Any]]]:
        """Per library, per problem: its mean reward, majority-vote score and each sample's reward."""
        return {a.name: {pid: {"mean": mean, "majority": vote, "rewards": [r.reward for r in group]}
                         for (pid, group), mean, vote in zip(a.report.rollouts.items(), a.report.per_problem_mean(),
                                                             a.report.per_problem_majority())}
                for a in self.arms}


async def constant_answer(problems: list[Problem], reward: Callable[..., Any]) -> ConstantAnswer | None:
    """The most common reference answer (the first of a tie), boxed, scored on every problem; None with no answers,
    where the reward cannot grade it (a measure beside the comparison must not cost the comparison), or where it
    scores 0 on every problem it is the reference of: then it is no answer but a stand-in (a reasoning-gym family
    whose problems have many right answers stores a sentence saying so). Partial credit keeps it."""
    answers = Counter(p.answer for p in problems if p.answer is not None)
    if not answers:
        return None
    answer = answers.most_common(1)[0][0]
    try:
        scores = {p.id: (await score(reward, p, [f"The answer is \\boxed{{{answer}}}."]))[0] or 0.0 for p in problems}
    except RewardError as error:
        logger.warning("the most common answer %r could not be graded, so it is not compared: %s", answer, error)
        return None
    if all(scores[p.id] <= 0 for p in problems if p.answer == answer):
        logger.warning("the most common reference %r is not itself a right answer, so it is not compared", answer)
        return None
    return ConstantAnswer(answer, scores)


SWAP_ROUNDS = 4  # the other problems each problem's answers are given to


async def swapped_means(report: EvalReport, problems: list[Problem], reward: Callable[..., Any],
                        seed: int) -> dict[str, float]:
    """Per problem, the mean reward its answers earn when given instead to `SWAP_ROUNDS` other problems (each round
    shifts a seeded order of the problems by an offset of its own, so no problem's answers meet their own problem,
    and every arm compared with the same seed meets the same others). Answers no more right on their own problems
    than on others are a prior over answers, not solving: the most common answer every time (mahjong_puzzle's
    Pass), partial credit any answer in the form earns (tsumego's 0.05 for a legal move), an answer any problem pays
    (puzzle24's grader takes any expression that makes 24), or a spread of likely answers (rotten_oranges' -1 and
    small counts)."""
    order = [p for p in problems if p.id in report.rollouts]
    random.Random(seed).shuffle(order)
    offsets = random.Random(seed).sample(range(1, len(order)), min(SWAP_ROUNDS, len(order) - 1))
    paid: dict[str, list[float]] = {p.id: [] for p in order}
    for offset in offsets:
        for i, own in enumerate(order):
            other = order[(i + offset) % len(order)]
            answers = [r.completion for r in report.rollouts[own.id]]
            paid[own.id] += [s or 0.0 for s in await score(reward, other, answers)] if answers else []
    return {pid: sum(scores) / max(1, len(scores)) for pid, scores in paid.items()}


def full_credit(report: EvalReport) -> dict[str, float]:
    """Per problem, the share of its answers the reward paid in full."""
    return {pid: sum((r.reward or 0.0) >= 1 for r in group) / max(1, len(group))
            for pid, group in report.rollouts.items()}


def renders_alike(one: LibraryVersion, other: LibraryVersion) -> bool:
    """Whether two versions send every request the same prompts: the same version, or two with no items (whatever
    their render policies say: a run with examples as turns that kept nothing ends on an empty version of its own)."""
    return one.id == other.id or not (one.items or other.items)


async def compare(backend: Backend, problems: list[Problem], reward: Callable[..., Any], samples: int,
                  sampling: Sampling, libraries: list[tuple[str, LibraryVersion, int]], seed: int = 0,
                  on_group: Callable[[str, Problem, list[Rollout]], None] | None = None,
                  constant: bool = True, stored: dict[str, dict[str, list[Rollout]]] | None = None) -> Comparison:
    """Evaluate each (name, library, tokens spent learning it) in turn; the first is the baseline. A library version
    already evaluated is not sampled again: the same version renders the same prompts, so its true difference from
    the earlier arm is 0, and sampling it again would measure only the engine's noise (a run whose gate kept nothing
    ends on the empty version, the `none` arm's, or on an empty one under its own render policy: `renders_alike`).
    With `constant`, each arm is also set against the most common answer given to every problem (`ConstantAnswer`;
    leave it off for a reward that asks a model), and against the baseline on the problems that answer gets wrong
    (a library that only taught that answer gains nothing there).
    `stored` holds groups already sampled, by library version and problem (a stopped comparison's): not paid again.
    Where some problems state their own answer and others do not, each arm is also set against the baseline on the
    others: a small model is right mostly where it can copy the question (number_sequence, seed 45: 0.30 on the 7
    test problems that end on a repeated term, 0.02 on the other 17). Where the reward paid partial credit to any
    answer, each arm's share of fully right answers is set against the baseline's (`full_credit`): tsumego pays 0.05
    for any legal move, and a library that taught the 0.5B to answer with a coordinate gained +0.047 with 1 right
    answer in 96. And with `constant`, each arm's answers are given to other problems (`swapped_means`): the
    gain beyond what they earn there is the part fitted to each problem."""
    arms: list[Arm] = []
    for name, library, learning_tokens in libraries:
        earlier = next((arm for arm, (_, done, _) in zip(arms, libraries) if renders_alike(done, library)), None)
        if earlier is None:
            report = await evaluate(backend, problems, reward, samples, sampling, library, seed=seed,
                                    on_group=(lambda p, g, n=name: on_group(n, p, g)) if on_group else None,
                                    stored=(stored or {}).get(library.id))
        else:
            report = earlier.report
        arms.append(Arm(name, report, learning_tokens, held_in_library=problems_held_in(library, problems),
                        same_as=earlier.name if earlier else None, copies=count_copies(report, library),
                        library_version=library.id))
    base = arms[0].report
    for arm in arms[1:]:
        arm.vs_baseline = paired_difference(arm.report.per_problem_mean(), base.per_problem_mean(), seed=seed)
        arm.majority_vs_baseline = paired_difference(arm.report.per_problem_majority(), base.per_problem_majority(),
                                                     seed=seed)
        arm.mean_vs_baseline_majority = paired_difference(arm.report.per_problem_mean(), base.per_problem_majority(),
                                                          seed=seed)
    means = {arm.name: dict(zip(arm.report.rollouts, arm.report.per_problem_mean())) for arm in arms}

    def gain_on(arm: Arm, pids: list[str], per_problem: dict[str, dict[str, float]] = means) -> Estimate:
        """`arm`'s figure against the baseline's on `pids`, paired per problem (Mean@k unless `per_problem`)."""
        return paired_difference([per_problem[arm.name][pid] for pid in pids],
                                 [per_problem[arms[0].name][pid] for pid in pids], seed=seed)

    common = await constant_answer(problems, reward) if constant else None
    if common:
        for arm in arms:
            arm.mean_vs_constant = paired_difference(arm.report.per_problem_mean(),
                                                     [common.scores[pid] for pid in arm.report.rollouts], seed=seed)
        uncommon = [pid for pid in base.rollouts if common.scores[pid] < 1]
        if uncommon:
            for arm in arms[1:]:
                arm.vs_baseline_uncommon = gain_on(arm, uncommon)
    unstated = [p.id for p in problems if not answer_in_problem(p.problem, p.answer)]
    if 0 < len(unstated) < len(problems):
        for arm in arms[1:]:
            arm.vs_baseline_unstated = gain_on(arm, unstated)
    if any(0 < (r.reward or 0.0) < 1 for arm in arms for group in arm.report.rollouts.values() for r in group):
        right = {arm.name: full_credit(arm.report) for arm in arms}
        for arm in arms[1:]:
            arm.full_credit_vs_baseline = gain_on(arm, list(base.rollouts), right)
    swapped = await swapped_by_arm(arms, problems, reward, seed) if constant and len(problems) > 1 else None
    if swapped:
        beyond = {name: {pid: mean - swapped[name][pid] for pid, mean in means[name].items()} for name in swapped}
        for arm in arms:
            arm.swapped_mean = sum(swapped[arm.name].values()) / len(swapped[arm.name])
        for arm in arms[1:]:
            arm.vs_baseline_beyond_swapped = gain_on(arm, list(base.rollouts), beyond)
    return Comparison(arms, len(problems), samples, seed, common)


async def swapped_by_arm(arms: list[Arm], problems: list[Problem], reward: Callable[..., Any],
                         seed: int) -> dict[str, dict[str, float]] | None:
    """Each arm's answers given to other problems (`swapped_means`; an arm sharing an earlier one's samples shares
    its figures), by arm name; None where the reward fails on another problem's row: a measure beside the comparison
    must not cost the comparison, so it is left unmeasured."""
    swapped: dict[str, dict[str, float]] = {}
    try:
        for arm in arms:
            swapped[arm.name] = (swapped[arm.same_as] if arm.same_as else
                                 await swapped_means(arm.report, problems, reward, seed))
    except Exception as error:  # noqa: BLE001  see the docstring
        logger.warning("answers given to other problems could not be graded, so they are not compared: %s", error)
        return None
    return swapped


def plot(comparison: Comparison, path: str | Path, title: str = "") -> None:
    """Mean@k and Majority@k of every library with their 95% intervals, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    k = comparison.samples
    names = [a.name for a in comparison.arms]
    fig, ax = plt.subplots(figsize=(1.8 + 1.6 * len(names), 3.6))
    for offset, (label, attr) in enumerate([(f"Mean@{k}", "mean_at_k"), (f"Majority@{k}", "majority")]):
        values = [getattr(a.report.metrics, attr) for a in comparison.arms]
        xs = [i + (offset - 0.5) * 0.38 for i in range(len(names))]
        ax.bar(xs, [v.value for v in values], width=0.36, label=label,
               yerr=[[v.value - v.low for v in values], [v.high - v.value for v in values]], capsize=3)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylim(0, 1)
    ax.set_ylabel("accuracy")
    ax.set_title(title or f"{comparison.problems} problems x {k} samples, 95% intervals")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
