"""Credit per item: what each library item does on validation, measured by leaving it out.

    ablations = [ablation(item, problems, with_item, without_item) for each item]   # from paired validation scores
    pruned = leave_out(library, [a.item for a in ablations if not a.keep], step)

An item is judged on the validation problems whose prompt showed it: with retrieval, an example is shown to a few
problems (a lesson to all). Those problems are rerun with the item left out, on the same seeds as the library's own
validation, so the comparison is paired. Left out, an example's place goes to the next most relevant one: its
effect is measured against that runner-up, which is the choice a prune makes. (Leaving an item out can change
other problems' prompts too, through BM25's word weights or the token budget; that is not the item's doing, and
the pruned library as a whole is gated on every problem anyway.)

What is dropped: a lesson whose absence does not lower validation (it is paid for in every prompt, and showed no
help). Worked examples are measured and never dropped: the first benchmark run with a rule that dropped examples
whose absence raised validation (decimal_chain_sum, seed 11) dropped 2 of 10, each on one problem's 2 samples, and
the pruned library scored 0.094 [0.031, 0.156] lower on held-out problems than the unpruned one. An example is
shown only where it is relevant, and a few validation samples cannot tell harm from noise. An item no validation
problem saw is kept for the same reason.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from gym_tf.datasets import Problem
from gym_tf.library import Experience, LibraryVersion
from gym_tf.rollouts import build_messages


@dataclass(frozen=True)
class Ablation:
    """One item's credit: its validation problems' mean score with it and without it (same seeds)."""

    item: str
    kind: str
    problems: tuple[str, ...]  # the validation problems whose prompt showed it
    with_item: float | None  # None: no validation problem saw it
    without_item: float | None

    @property
    def effect(self) -> float | None:
        """How much the item adds on its problems (negative: it harms them)."""
        return None if self.with_item is None or self.without_item is None else self.with_item - self.without_item

    @property
    def keep(self) -> bool:
        return self.kind == "example" or self.effect is None or self.effect > 0

    @property
    def verdict(self) -> str:
        if self.effect is None:
            return "not shown on validation"
        return "helps" if self.effect > 0 else "harms" if self.effect < 0 else "no effect"

    def to_dict(self) -> dict:
        return {**asdict(self), "problems": list(self.problems), "effect": self.effect, "verdict": self.verdict,
                "keep": self.keep}


def leave_out(library: LibraryVersion, item_ids: list[str] | tuple[str, ...], step: int) -> LibraryVersion:
    """The library without these items (ids stay as they are, never reused): a new version whose parent is
    `library`, rendered under the same policy."""
    drop = set(item_ids)
    return LibraryVersion(items=tuple(i for i in library.items if i.id not in drop), next_number=library.next_number,
                          parent=library.id, step=step, policy=library.policy)


def shown_to(library: LibraryVersion, item: Experience, problems: list[Problem]) -> list[Problem]:
    """The problems whose solve prompt, under this library, shows the item."""
    return [p for p in problems if item.id in build_messages(p, library)[1]]


def ablation(item: Experience, problems: list[Problem], with_item: list[float], without_item: list[float]) -> Ablation:
    """`with_item[i]` and `without_item[i]`: problem i's mean score with the item and with it left out."""
    if not problems:
        return Ablation(item.id, item.kind, (), None, None)
    return Ablation(item.id, item.kind, tuple(p.id for p in problems), sum(with_item) / len(with_item),
                    sum(without_item) / len(without_item))
