"""Training-Free GRPO, one step after another. Read `run_step` top to bottom: it is the whole algorithm.

    rollout -> reward -> worked examples from verified answers -> skip homogeneous groups -> summarize each rollout
            (with `summarize`, the paper's design; off by default) -> group advantage per problem
            -> consolidate the batch -> apply ops -> validate -> record a new version

and, after the last step of a gated run, `prune_step`: each item left out in turn on validation (its credit), the
lessons that showed no help dropped, the result gated like any candidate (`gym_tf.credit`).

Model weights never change; the "policy update" is a set of typed ops on the experience library.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator

from gym_tf.backends import Backend
from gym_tf.backends.base import gather_or_cancel
from gym_tf.config import OptimizeConfig
from gym_tf.credit import ablation, leave_out, shown_to
from gym_tf.datasets import Problem, load_dataset, open_dataset
from gym_tf.errors import BudgetExhausted, ConfigError, StoreError
from gym_tf.evaluate import evaluate
from gym_tf.learner import (JudgeCalls, LearnerCalls, OpRules, StageReply, consolidate_prompt, group_prompt,
                             summarize_prompt)
from gym_tf.library import (MAX_EXAMPLE_CHARS, DeleteOp, ExampleOp, Experience, LibraryVersion, OpVerdict,
                             Provenance, answer_in_problem, apply_ops, copies_example, example_parts, example_solutions,
                             example_text, labeled_solution, mentions_hint, problems_held_in, shows_unrun_output,
                             solution_steps, with_policy)
from gym_tf.metrics import canonical_answer, paired_difference
from gym_tf.prompts import render
from gym_tf.python_tool import PythonTool
from gym_tf.rollouts import Rollout, build_messages, rollout_many, score
from gym_tf.store import (HINTED_ANSWER, LEARNER_ANSWER, REFERENCE_ANSWER, RunStore, config_hash,
                          rollout_key)
from rewards import ANSWER_FREE, load_reward
from rewards.answers import extract_answer
from rewards.feedback import FeedbackReward
from rewards.judge import FeedbackJudge

GATE_TOLERANCE = 1e-9  # float noise in mean differences: a tie is not below


@dataclass
class Progress:
    """Live counters of a run; the CLI draws them, tests read them."""

    epoch: int = 0
    step: int = 0
    total_steps: int = 0
    rollouts: int = 0
    reward_sum: float = 0.0
    groups_used: int = 0
    groups_skipped: int = 0
    groups_all_wrong: int = 0  # skipped groups with no right answer: the method has nothing to copy or contrast
    groups_all_right: int = 0  # skipped groups with every answer right: already solved
    ops_applied: int = 0
    ops_rejected: int = 0
    library_size: int = 0
    tokens: int = 0
    last_val: float | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def mean_reward(self) -> float:
        return self.reward_sum / self.rollouts if self.rollouts else 0.0


@dataclass(frozen=True)
class RunResult:
    run_id: str
    status: str
    library: LibraryVersion
    progress: Progress


class Optimizer:
    def __init__(self, config: OptimizeConfig, store: RunStore, backend: Backend, learner_backend: Backend | None = None,
                 run_id: str | None = None, on_progress: Callable[[Progress], None] | None = None):
        if config.learner_examples and learner_backend in (None, backend):
            raise ConfigError("learner_examples needs a learner model of its own (--learner-model-file or "
                              "--learner-base-url): with none, the learner's answers are the same model's")
        self.config = config
        self.store = store
        self.learner_backend = learner_backend or backend  # the learner runs no code
        self.backend = PythonTool(backend) if config.python_tool else backend
        self.on_progress = on_progress or (lambda p: None)
        self.progress = Progress()
        self.val_baseline: float | None = None  # validation mean of the starting library, when gated
        self._references: dict[str, str | None] | None = None  # reference answers by problem id, read when needed
        self._answers_given: bool | None = None  # whether most problems state their own answer, read when needed
        # recorded traffic has answers only where users gave feedback: the feedback reward handles the rest
        self.problems = open_dataset(config.dataset, config.problem_field, config.answer_field,
                                     require_answer=config.reward not in ANSWER_FREE and config.traffic is None,
                                     limit=config.limit, index_dir=store.root / "dataset-index")
        self.val_problems = (
            load_dataset(config.val_dataset, config.problem_field, config.answer_field,
                         require_answer=config.reward not in ANSWER_FREE)
            if config.val_dataset else []
        )
        self.cfg_hash = config_hash(config.recorded())
        if run_id is None:
            # the run's render policy is part of every version it makes, so eval and serve render them the same way
            start = with_policy(store.version(config.start_library), config.render_policy())
            store.put_version(start, run_id="", status="start")  # recorded, but never `latest` by itself
            self.run_id = store.new_run("optimize", config.recorded(), backend.model, config.dataset, start.id)
        else:
            self.run_id = store.run(run_id)["id"]
        # stored rollouts and replies are keyed by problem id: a resume must see the same problems
        store.check_dataset(self.run_id, self.problems)
        if self.val_problems:
            store.check_dataset(self.run_id, self.val_problems, split="val")
        if run_id is not None:
            store.claim_run(self.run_id)  # refuses while another live process holds the run
        self.reward = load_reward(config.reward, judge_backend=JudgeCalls(self.learner_backend, store, self.run_id))
        if config.traffic is not None:  # user feedback where it exists, the configured fallback where it does not
            fallback = config.traffic.fallback_reward
            judge = JudgeCalls(self.learner_backend, store, self.run_id)
            self.reward = FeedbackReward(self.reward, FeedbackJudge(judge) if fallback == "judge" else load_reward(fallback))
        self.learner = LearnerCalls(self.learner_backend, store, self.run_id, config.learner_sampling(),
                                    config.max_attempts)

    # --- the run --------------------------------------------------------------------------------------------------

    async def run(self) -> RunResult:
        cfg = self.config
        run = self.store.run(self.run_id)
        library = self.store.version(run["current_version"])
        steps = self.store.steps(self.run_id)
        done = {s["step"] for s in steps}
        self.progress.total_steps = self.learning_steps + int(self._ends_with_prune)
        # the time limit counts this process's time and what the steps before a resume recorded (not the pause)
        self._learning_since = time.monotonic() - next((s["stats"]["learned_s"] for s in reversed(steps)
                                                        if s["stats"].get("learned_s") is not None), 0.0)
        pruned = self._ends_with_prune and self.learning_steps + 1 in done  # learning ended, by the time limit
        self.progress.library_size = len(library.items)
        self._count_tokens()
        status = "finished"
        try:
            best_scores = None
            if self.val_problems:
                # the gate's baseline is the run's start library, whose step-0 rollouts a resumed run finds stored;
                # after that, the best scores so far, as the last committed step recorded them
                start = self.store.version(steps[0]["version_before"]) if steps else library
                best_scores = await self._validate(start, step=0)
                self.val_baseline = self.progress.last_val
                best_scores = next((s["stats"]["best_scores"] for s in reversed(steps)
                                    if s["stats"].get("best_scores") is not None), best_scores)
            for epoch, batch_index, step, batch in () if pruned else self._schedule():
                if step not in done and self._out_of_time():
                    self.progress.notes.append(f"learning stopped at its time limit ({cfg.learn_minutes:g} min): "
                                               f"{step - 1} of {self.learning_steps} steps run")
                    break
                self.progress.epoch, self.progress.step = epoch + 1, step
                if step in done:
                    continue  # committed before a crash: its rollouts, replies and version are in the store
                library, best_scores = await self.run_step(epoch, batch_index, step, batch, library, best_scores)
            if self._ends_with_prune:
                step = self.learning_steps + 1  # its number whether or not the time limit cut the steps short
                self.progress.step = step
                if step not in done:
                    library, best_scores = await self.prune_step(step, library, best_scores)
        except BudgetExhausted as stop:
            status = "budget"
            self.progress.notes.append(str(stop))
        except BaseException:
            # a workspace that cannot be written (disk full) cannot record this either: the first error is the one
            # to report, and the run then shows as crashed, ready for --resume
            with contextlib.suppress(StoreError):
                self.store.finish_run(self.run_id, "failed", self._summary(library))
            raise
        if status == "finished" and not library.items and (reason := self._why_nothing_learned()):
            self.progress.notes.append(reason)
        held = problems_held_in(library, self.val_problems)
        if held:
            self.progress.notes.append(f"not held out: the library holds worked examples of {len(held)} of the "
                                       f"{len(self.val_problems)} validation problems: the gate's scores on them can "
                                       "be copied answers")
        self.store.finish_run(self.run_id, status, {**self._summary(library), "val_held_in_library": held})
        return RunResult(self.run_id, status, library, self.progress)

    async def run_step(self, epoch: int, batch_index: int, step: int, batch: list[Problem], library: LibraryVersion,
                       best_scores: list[float] | None) -> tuple[LibraryVersion, list[float] | None]:
        cfg = self.config
        self._check_budget()

        # --- rollout and reward: G answers per problem, each group stored the moment it is scored
        groups = await self._rollouts(epoch, step, batch, library)

        # --- worked examples: a verified answer of the model's own, for problems the library has none for yet; where
        # the model answered none right, optionally one of the learner's (a stronger model's), or one of the model's
        # told the reference answer, verified the same way
        examples = []
        if cfg.worked_examples:
            learners = await self._learner_answers(epoch, step, batch, groups, library) if cfg.learner_examples else {}
            hinted = (await self._hinted_answers(epoch, step, batch, [groups, learners], library)
                      if cfg.hinted_examples else {})
            labels = await self._labels(batch, [groups, learners, hinted], library) if cfg.labeled_examples else {}
            examples = self._worked_examples(step, batch, [(groups, ""), (learners, LEARNER_ANSWER),
                                                           (hinted, HINTED_ANSWER), (labels, REFERENCE_ANSWER)],
                                             library)

        # --- skip homogeneous groups: all-equal rewards carry no relative signal (unless hard_groups says otherwise)
        used, hard, all_wrong, all_right = [], [], 0, 0
        for problem in batch:
            rewards = {r.reward for r in groups[problem.id] if r.reward is not None}
            if len(rewards) > 1:
                used.append(problem)
            elif rewards == {0.0} and cfg.hard_groups == "reference" and problem.answer is not None:
                hard.append(problem)
            elif rewards == {0.0}:
                all_wrong += 1
            elif rewards == {1.0}:
                all_right += 1
        self.progress.groups_all_wrong += all_wrong
        self.progress.groups_all_right += all_right
        self.progress.groups_used += len(used) + len(hard)
        self.progress.groups_skipped += len(batch) - len(used) - len(hard)
        self._notify()
        learn_from = used + hard
        self._check_budget()

        # --- summarize each rollout of the groups we learn from (one learner call per rollout)
        summaries = await self._summaries(step, learn_from, groups, library)
        self._check_budget()

        # --- group advantage: one call per problem compares its good and bad attempts and proposes ops
        replies = await gather_or_cancel(*(
            self.learner.ask(step, "extract", p.id,
                             group_prompt(p, summaries[p.id], library, cfg.max_ops_per_group, hard=p in hard),
                             cfg.max_ops_per_group, OpRules.of(library, [p], batch))
            for p in learn_from
        ))
        rejected = [("extract", OpVerdict({"problem": p.id, "reply": r.text}, False, r.error or ""))
                    for p, r in zip(learn_from, replies) if r.error]
        proposals = [(p.id, op) for p, r in zip(learn_from, replies) for op in r.ops if op.op != "none"]
        self._count_tokens()
        self._check_budget()

        # --- consolidate the batch: one call reconciles every proposal with the library
        ops, provenance = [], {}
        if proposals:
            proposing = {pid for pid, _ in proposals}
            merged = await self.learner.ask(step, "consolidate", "batch", consolidate_prompt(proposals, library),
                                            max_ops=min(16, len(proposals) + len(library.items)),
                                            rules=OpRules.of(library, [p for p in learn_from if p.id in proposing],
                                                             batch))
            if merged.error:
                # The consolidation reply is unusable: keep it on record, and fall back to the proposals themselves,
                # each still checked by apply_ops, rather than losing the step's lessons.
                rejected.append(("consolidate", OpVerdict({"reply": merged.text}, False, merged.error)))
                ops = [op for _, op in proposals]
                sources = [[i + 1] for i in range(len(proposals))]
            else:
                ops = [op for op in merged.ops if op.op != "none"]
                sources = [list(op.sources) for op in ops]
            provenance = {i: self._provenance(step, src, proposals, groups) for i, src in enumerate(sources)}

        # --- apply ops: a new immutable version; ops naming unknown ids are rejected with a reason
        provenance.update({len(ops) + i: origin for i, (_, origin) in enumerate(examples)})
        candidate, verdicts = apply_ops(library, ops + [op for op, _ in examples], step, provenance)
        all_verdicts = rejected + [("apply", v) for v in verdicts]
        self.progress.ops_applied += sum(v.accepted for v in verdicts)
        self.progress.ops_rejected += sum(not v.accepted for _, v in all_verdicts)

        # --- validate: keep the candidate only if it scores at least as well as the best so far
        status, evaluation, best_scores = await self._gate(candidate, library, step, best_scores)

        # --- record: version, op verdicts, step row and token counts in one transaction
        self._count_tokens()
        stats = {"groups_used": len(learn_from), "groups_skipped": len(batch) - len(learn_from),
                 "groups_all_wrong": all_wrong, "groups_all_right": all_right,
                 "mean_reward": _mean(r.reward for g in groups.values() for r in g),
                 "ops_applied": sum(v.accepted for v in verdicts), "ops_rejected": sum(not v.accepted for _, v in all_verdicts),
                 "val_mean": evaluation["val_mean"] if evaluation else None, "best_scores": best_scores,
                 "learned_s": round(time.monotonic() - self._learning_since, 1)}
        self.store.commit_step(self.run_id, step, epoch, batch_index, library, candidate, all_verdicts, status,
                               self.store.usage(self.run_id), stats, self.cfg_hash, evaluation)
        new_library = candidate if status == "promoted" else library
        self.progress.library_size = len(new_library.items)
        self._notify()
        return new_library, best_scores

    async def prune_step(self, step: int, library: LibraryVersion,
                         best_scores: list[float] | None) -> tuple[LibraryVersion, list[float] | None]:
        """Credit per item, after the last step: leave each item out in turn, rerun only the validation problems
        whose prompt showed it, and drop the lessons that did not help there (examples are measured, never dropped:
        see `gym_tf.credit`).

        The gate then compares the pruned library with the best so far, reusing every validation group whose prompt
        it already measured; since the drops were chosen on these same groups, that check is lenient by design:
        held-out problems (the benchmark's `unpruned` arm) are the honest measure of what pruning did."""
        if not library.items:
            return library, best_scores
        self._check_budget()  # the items are measured together: the budget can be overshot by one prune pass
        by_id = dict(zip((p.id for p in self.val_problems), await self._validate(library, step)))

        async def credit(item):
            problems = shown_to(library, item, self.val_problems)
            scores = (await self._validate(leave_out(library, [item.id], step), step, problems, (library.step,))
                      if problems else [])
            return ablation(item, problems, [by_id[p.id] for p in problems], scores)

        ablations = await gather_or_cancel(*(credit(item) for item in library.items))
        dropped = [a for a in ablations if not a.keep]
        candidate = leave_out(library, [a.item for a in dropped], step) if dropped else library
        verdicts = [("apply", OpVerdict(DeleteOp(op="delete", id=a.item), True,
                                        f"ablation: {a.verdict} on {len(a.problems)} validation problems "
                                        f"({a.with_item:.3f} with it, {a.without_item:.3f} without)"))
                    for a in dropped]
        status, evaluation, best_scores = await self._gate(candidate, library, step, best_scores, (library.step,))
        self.progress.ops_applied += len(dropped)
        self._count_tokens()
        stats = {"groups_used": 0, "groups_skipped": 0, "mean_reward": None, "ops_applied": len(dropped),
                 "ops_rejected": 0, "val_mean": evaluation["val_mean"] if evaluation else None,
                 "best_scores": best_scores, "ablation": [a.to_dict() for a in ablations]}
        no_batch = -1  # the prune step samples no training batch
        self.store.commit_step(self.run_id, step, self.config.epochs - 1, no_batch, library, candidate, verdicts,
                               status, self.store.usage(self.run_id), stats, self.cfg_hash, evaluation)
        kept = candidate if status == "promoted" else library
        self.progress.library_size = len(kept.items)
        self.progress.notes.append(f"pruned {len(dropped)} of {len(library.items)} items ({status})"
                                   if dropped else f"pruned none of {len(library.items)} items")
        self._notify()
        return kept, best_scores

    # --- the pieces ---------------------------------------------------------------------------------------------

    @property
    def learning_steps(self) -> int:
        """The learning steps the run plans: a batch each, every epoch (the prune step not counted)."""
        return self.config.epochs * -(-len(self.problems) // self.config.batch_size)

    def _schedule(self) -> Iterator[tuple[int, int, int, list[Problem]]]:
        """Every learning step in order: (epoch, batch index, step number from 1, the batch)."""
        step = 0
        for epoch in range(self.config.epochs):
            for batch_index, batch in enumerate(self._batches(epoch)):
                step += 1
                yield epoch, batch_index, step, batch

    def _out_of_time(self) -> bool:
        """Whether the run has learned for its `learn_minutes` (checked before each step: the step under way when
        the limit passes finishes and is kept)."""
        limit = self.config.learn_minutes
        return limit is not None and time.monotonic() - self._learning_since >= limit * 60

    @property
    def _ends_with_prune(self) -> bool:
        """Whether the run ends with a prune step (it needs validation problems to measure on)."""
        return self.config.prune and bool(self.val_problems)

    async def _gate(self, candidate: LibraryVersion, library: LibraryVersion, step: int,
                    best_scores: list[float] | None,
                    reuse_from: tuple[int, ...] = ()) -> tuple[str, dict | None, list[float] | None]:
        """Promote the candidate only if it scores at least as well as the best version so far, on the same
        validation problems and seeds; it then becomes the best. The paired 95% interval is recorded beside the
        verdict. (The gate used to promote anything not worse beyond noise: on basic_arithmetic seed 13 it let a
        library through at 0.72 against no library's 0.89 on validation; on test its vote lost to the
        no-library vote.)"""
        if candidate.id == library.id or best_scores is None:
            return "promoted", None, best_scores
        self._check_budget()
        scores = await self._validate(candidate, step, reuse_from=reuse_from)
        diff = paired_difference(scores, best_scores, seed=self.config.seed)
        evaluation = {"val_mean": sum(scores) / len(scores), "diff": diff.value, "low": diff.low, "high": diff.high}
        if diff.value < -GATE_TOLERANCE:
            return "rejected", evaluation, best_scores
        return "promoted", evaluation, scores

    def _summary(self, library: LibraryVersion) -> dict[str, Any]:
        # the steps committed, learning and prune: a run the time limit cut has fewer than its last step's number
        return {"steps": len(self.store.steps(self.run_id)), "library_items": len(library.items), "val_baseline": self.val_baseline,
                "tokens": self.store.usage(self.run_id), "groups_used": self.progress.groups_used,
                "groups_skipped": self.progress.groups_skipped}

    def _batches(self, epoch: int) -> Iterator[list[Problem]]:
        """This epoch's batches in a seeded order, each read from the dataset when its step comes."""
        order = list(range(len(self.problems)))
        random.Random(f"{self.config.seed}:{epoch}").shuffle(order)
        size = self.config.batch_size
        for start in range(0, len(order), size):
            yield [self.problems[i] for i in order[start : start + size]]

    async def _rollouts(self, epoch: int, step: int, batch: list[Problem], library: LibraryVersion) -> dict[str, list[Rollout]]:
        """The model's groups: reuse every group already stored for this step (a resumed run), sample the rest."""
        return await self._stored_or_sampled(epoch, step, batch, library, self.backend, self.config.group_size,
                                             f"train:{epoch}", given=self._served_answer, seen=self._saw)

    async def _stored_or_sampled(self, epoch: int, step: int, problems: list[Problem], library: LibraryVersion,
                                 backend: Backend, size: int, seed_key: str, prefix: str = "",
                                 given: Callable[[Problem], tuple[str, ...]] = lambda problem: (),
                                 seen: Callable[[list[Rollout]], None] = lambda group: None
                                 ) -> dict[str, list[Rollout]]:
        """Each problem's group of `size` answers by `backend`: the one stored for this step under the problem id
        `prefix + id` if complete, else sampled, scored and stored the moment it is scored; `seen` counts each.
        A training problem is never shown its own worked example: it would copy it (`library_messages`)."""
        stored: dict[str, list[Rollout]] = {}
        for r in self.store.rollouts(self.run_id, step):
            if r.problem_id.startswith(prefix):
                stored.setdefault(r.problem_id.removeprefix(prefix), []).append(r)
        complete = {p.id: stored[p.id] for p in problems if len(stored.get(p.id, [])) == size}
        for group in complete.values():
            seen(group)

        def keep(problem: Problem, group: list[Rollout]) -> None:
            self.store.put_rollouts(self.run_id, epoch, step,
                                    [replace(r, problem_id=prefix + r.problem_id) for r in group])
            seen(group)

        fresh = await rollout_many(backend, [p for p in problems if p.id not in complete], library, size,
                                   self.config.rollout.sampling(), self.reward, self.config.seed, seed_key,
                                   on_group=keep, given=given, own_example=False)
        return {**complete, **fresh}

    def _served_answer(self, problem: Problem) -> tuple[str, ...]:
        """From traffic, the answer a user judged is one member of its group (scored by what the user said)."""
        row = problem.row
        if self.config.traffic is None or row.get("label") in (None, "none") or not row.get("served_answer"):
            return ()
        return (row["served_answer"],)

    async def _summaries(self, step: int, problems: list[Problem], groups: dict[str, list[Rollout]],
                         library: LibraryVersion) -> dict[str, list[tuple[Rollout, str]]]:
        if not self.config.summarize:
            return {p.id: [(r, r.completion) for r in groups[p.id]] for p in problems}
        jobs = [(p, r) for p in problems for r in groups[p.id]]
        replies: list[StageReply] = await gather_or_cancel(*(
            self.learner.ask(step, "summarize", f"{p.id}/{r.sample}", summarize_prompt(p, r, library), None)
            for p, r in jobs
        ))
        out: dict[str, list[tuple[Rollout, str]]] = {p.id: [] for p in problems}
        for (p, r), reply in zip(jobs, replies):
            out[p.id].append((r, reply.text))
        return out

    async def _validate(self, library: LibraryVersion, step: int, problems: list[Problem] | None = None,
                        reuse_from: tuple[int, ...] = ()) -> list[float]:
        """Per-problem mean reward on the validation set (or these of its problems); the same seeds for every
        version (paired comparison). A group already stored with the very prompt this version gives a problem (by
        this step, the step that made the version, the run's first validation, or the steps in `reuse_from`) is
        reused, not paid again: the same prompt and seed are the same draw, whichever version asked."""
        subset = problems is not None
        problems = self.val_problems if problems is None else problems
        prompts = {p.id: build_messages(p, library)[0] for p in problems}
        found: dict[str, dict[int, Rollout]] = {}
        for stored_step in sorted({0, library.step, step, *reuse_from}):
            for r in self.store.rollouts(self.run_id, stored_step, validation=True):
                pid = r.problem_id.removeprefix("val/")
                if r.messages == prompts.get(pid):
                    found.setdefault(pid, {})[r.sample] = r
        cached = {pid: list(group.values()) for pid, group in found.items()}
        todo = [p for p in problems if len(cached.get(p.id, [])) != self.config.val_samples]

        def keep(problem: Problem, group: list[Rollout]) -> None:
            renamed = [Rollout(**{**r.__dict__, "problem_id": f"val/{r.problem_id}"}) for r in group]
            self.store.put_rollouts(self.run_id, -1, step, renamed)

        report = await evaluate(self.backend, todo, self.reward, self.config.val_samples, self.config.rollout.sampling(),
                                library, seed=self.config.seed, on_group=keep) if todo else None
        groups = {**cached, **(report.rollouts if report else {})}
        scores = [_mean(r.reward for r in groups[p.id]) for p in problems]
        if not subset:
            self.progress.last_val = _mean(scores)
        self._count_tokens()
        return scores

    def _showable(self, problem: Problem, group: list[Rollout], solutions: list[str]) -> list[Rollout]:
        """The answers fit to be a worked example: scored correct by the verifier, ended on their own (not cut off),
        showing no output of code they never ran, and short enough to show; with `refuse_copied_examples`, not a
        copy of one of these worked examples' solutions (`copies_example`): the copy works another problem and is
        right where its answer happens to be this one's, so it verifies nothing and shows the same solution twice.
        The cap is on the solution, not on the problem's statement, which in many task families is long boilerplate;
        the whole item is still bounded."""
        if not self.config.refuse_copied_examples:
            solutions = []
        return [r for r in group if (r.reward or 0) >= 1 and r.finish_reason != "length"
                and not shows_unrun_output(r.completion) and len(r.completion.strip()) <= self.config.max_example_chars
                and len(example_text(problem.problem, r.completion)) <= MAX_EXAMPLE_CHARS
                and not copies_example(r.completion, solutions)]

    async def _learner_answers(self, epoch: int, step: int, batch: list[Problem], groups: dict[str, list[Rollout]],
                               library: LibraryVersion) -> dict[str, list[Rollout]]:
        """`learner_examples` answers by the learner to each problem that has no worked example yet and none of the
        model's answers fit to be one, graded by the same reward and stored like rollouts (problem id `learner/...`),
        so a resumed run pays for none twice. A small model that solves almost nothing gets someone's verified
        working to read."""
        self._check_budget()
        todo = self._unexampled(batch, [groups], library)
        return await self._stored_or_sampled(epoch, step, todo, library, self.learner_backend,
                                             self.config.learner_examples, f"learner:{epoch}", prefix=LEARNER_ANSWER)

    async def _hinted_answers(self, epoch: int, step: int, batch: list[Problem],
                              answered: list[dict[str, list[Rollout]]],
                              library: LibraryVersion) -> dict[str, list[Rollout]]:
        """`hinted_examples` answers by the model to each problem that has no worked example yet and no answer in
        `answered` (the model's, the learner's) fit to be one, asked with the problem's reference answer shown
        (`hint.txt`; STaR's rationalization, arXiv 2203.14465), graded by the same reward and stored like rollouts
        (problem id `hinted/...`), their prompts showing the hint. Those that say they were told (`mentions_hint`)
        are left out. The grader checks the final answer only: the working may still be wrong, as the model's own
        right answers' may, and the validation gate judges whether such examples help."""
        self._check_budget()
        told = [replace(p, problem=f"{p.problem}\n\n{render('hint', answer=p.answer)}")
                for p in self._unexampled(batch, answered, library) if p.conversation is None]
        groups = await self._stored_or_sampled(epoch, step, told, library, self.backend, self.config.hinted_examples,
                                               f"hinted:{epoch}", prefix=HINTED_ANSWER)
        return {pid: [r for r in group if not mentions_hint(r.completion)] for pid, group in groups.items()}

    async def _labels(self, batch: list[Problem], answered: list[dict[str, list[Rollout]]],
                      library: LibraryVersion) -> dict[str, list[Rollout]]:
        """With `labeled_examples`: for each problem that has no worked example yet and no answer in `answered` fit
        to be one, its reference answer as the whole solution (`\\boxed{answer}`, no working), graded by the same
        reward so that only a label the grader reads back as right can be shown. Nothing is sampled or stored: the
        dataset row is the record, and the example's rollout key (`reference/<problem id>`) says so."""
        self._check_budget()  # a judge reward pays for its grades
        todo = [p for p in self._unexampled(batch, answered, library) if p.conversation is None]
        graded = await gather_or_cancel(*(score(self.reward, p, [labeled_solution(p.answer)]) for p in todo))
        return {p.id: [Rollout(problem_id=p.id, sample=0, messages=[], completion=labeled_solution(p.answer),
                               finish_reason="stop", prompt_tokens=0, completion_tokens=0, latency_s=0.0,
                               reward=grade[0], library_version="reference")]
                for p, grade in zip(todo, graded)}

    def _unexampled(self, batch: list[Problem], answered: list[dict[str, list[Rollout]]],
                    library: LibraryVersion) -> list[Problem]:
        """The problems of the batch with a reference answer and no worked example yet, none of whose answers in
        `answered` is fit to be one (and, with `refuse_answer_in_problem`, that do not state their answer)."""
        have, solutions = _examples_held(library), list(example_solutions(library).values())
        return [p for p in batch if p.answer is not None and p.id not in have and not self._gives_its_answer(p)
                and not any(self._showable(p, group.get(p.id, []), solutions) for group in answered)]

    def _worked_examples(self, step: int, batch: list[Problem], sources: list[tuple[dict[str, list[Rollout]], str]],
                         library: LibraryVersion) -> list[tuple[ExampleOp, Provenance]]:
        """One worked example per problem that has none yet: of its showable answers, those of the first source
        (the model's own, then the learner's, then the model's told the answer, then the reference answer alone;
        each with its rollout id prefix)
        that has any, the one that shows the most steps (then the shortest). An answer that only states the
        result demonstrates nothing. With `examples_per_answer`, none whose final answer the library already shows
        that many times; with `refuse_answer_in_problem`, none of a problem that states its own answer."""
        have, solutions = _examples_held(library), list(example_solutions(library).values())
        cap = self.config.examples_per_answer
        answers = Counter(self._answer_shown(i) for i in library.items if i.kind == "example") if cap else Counter()
        out = []
        for problem in batch:
            if problem.id in have or problem.answer is None or self._gives_its_answer(problem):
                continue
            showable, prefix = next(((fit, prefix) for answers, prefix in sources
                                     if (fit := self._showable(problem, answers.get(problem.id, []), solutions))),
                                    ([], ""))
            if not showable:
                continue
            best = min(showable, key=lambda r: (-solution_steps(r.completion), len(r.completion), r.sample))
            answer = canonical_answer(problem.answer)
            if cap is not None and answers[answer] >= cap:
                continue
            answers[answer] += 1
            solutions.append(best.completion)
            origin = Provenance(step=step, op="example", problem_ids=(problem.id,),
                                rollout_ids=(rollout_key(self.run_id, step, prefix + problem.id, best.sample),))
            out.append((ExampleOp(op="example", text=example_text(problem.problem, best.completion)), origin))
        return out

    def _gives_its_answer(self, problem: Problem) -> bool:
        """With `refuse_answer_in_problem`: whether this problem's answer stands in its statement while most problems
        of the dataset (up to 1000 of them, evenly spaced) do not state theirs. Where most do, the answers are options
        the question names, and the rule would leave the family no example."""
        if not self.config.refuse_answer_in_problem or not answer_in_problem(problem.problem, problem.answer):
            return False
        if self._answers_given is None:
            step = max(1, len(self.problems) // 1000)
            sample = [self.problems[i] for i in range(0, len(self.problems), step)]
            given = sum(answer_in_problem(p.problem, p.answer) for p in sample)
            self._answers_given = 2 * given >= len(sample)
        return not self._answers_given

    def _answer_shown(self, example: Experience) -> object:
        """The final answer a worked example shows: its problem's reference answer (a verified solution's answer is
        that answer, however it is written: `0`, `0.0`, `0, \\pm 0`), read as majority voting reads answers; for an
        example of a problem not in this dataset, the answer its solution boxes."""
        if self._references is None:
            self._references = {p.id: p.answer for p in self.problems}
        ids = example.provenance.problem_ids
        reference = self._references.get(ids[0]) if len(ids) == 1 else None
        if reference is not None:
            return canonical_answer(reference)
        answer = extract_answer(example_parts(example.text)[1])
        return None if answer is None else canonical_answer(answer)

    def _provenance(self, step: int, sources: list[int], proposals: list[tuple[str, Any]],
                    groups: dict[str, list[Rollout]]) -> Provenance:
        problem_ids = sorted({proposals[s - 1][0] for s in sources if 1 <= s <= len(proposals)})
        rollout_ids = [rollout_key(self.run_id, step, pid, r.sample) for pid in problem_ids for r in groups[pid]]
        return Provenance(step=step, op="", problem_ids=tuple(problem_ids), rollout_ids=tuple(rollout_ids))

    def _why_nothing_learned(self) -> str | None:
        """Why a run's library stayed empty, from its committed learning steps (a resumed run's included): every
        group all wrong (no verified answer to keep, no contrast), every group all right (nothing left to learn),
        or groups learned from whose proposals were all refused. None where a step kept something that a later
        delete or the prune step removed (the prune step's note says so)."""
        steps = [s for s in self.store.steps(self.run_id) if s["batch"] >= 0]
        if not steps or any(s["version_after"] != s["version_before"] for s in steps):
            return None

        def count(key: str) -> int:
            return sum(s["stats"].get(key, 0) for s in steps)

        used, skipped = count("groups_used"), count("groups_skipped")
        answers = skipped * self.config.group_size
        if used:
            gate = (f"; the validation gate refused {sum(s['status'] == 'rejected' for s in steps)} candidate "
                    "versions (below the best version so far)" if self.val_problems else "")
            return (f"nothing learned: {used} groups were learned from, yet nothing proposed was kept: "
                    f"{count('ops_rejected')} proposals refused by the op rules or as unreadable replies{gate}. "
                    "Try a stronger learner (--learner-model-file, --learner-base-url) or more training problems")
        if skipped and count("groups_all_wrong") == skipped:
            return (f"nothing learned: the model answered none of its {answers} training answers right, and the "
                    "method learns from verified answers and from groups with right and wrong ones. "
                    + self._remedies_untried(count("ops_applied"), sum(s["status"] == "rejected" for s in steps)))
        if skipped and count("groups_all_right") == skipped:
            return (f"nothing learned: the model answered all of its {answers} training answers right; these "
                    "problems are already solved without a library")
        return None

    def _remedies_untried(self, examples_offered: int, versions_refused: int) -> str:
        """For a run whose every answer was wrong: the remedies its settings did not already use, and where it used
        some, why they left nothing (the gate refused the examples they gave, or none they gave was fit to show)."""
        cfg = self.config
        if not cfg.worked_examples:
            return ("Try easier problems, a larger model (--model-file, --base-url) or --worked-examples (on by "
                    "default; with it, verified answers, or with --labeled-examples the reference answers, are shown)")
        untried = [name for name, on in (
            ("a learner model whose verified answers become examples (--learner-examples with --learner-model-file)",
             cfg.learner_examples), ("--hard-groups reference", cfg.hard_groups == "reference"),
            ("the model's answers told the reference answer as worked examples (--hinted-examples)",
             cfg.hinted_examples),
            ("the reference answers as worked examples shown as earlier chat turns (--labeled-examples "
             "--examples-as-turns: they teach the answer's form, not the skill)", cfg.labeled_examples)) if not on]
        tries = ["easier problems", "a larger model (--model-file, --base-url)", *untried]
        used = [name for name, on in (("--learner-examples", cfg.learner_examples),
                                      ("--hinted-examples", cfg.hinted_examples),
                                      ("--labeled-examples", cfg.labeled_examples)) if on]
        why = ""
        if used and examples_offered:
            why = (f" {' and '.join(used)} gave worked examples ({examples_offered} offered), and the validation "
                   f"gate refused the candidate versions that held them ({versions_refused}, below the best so far).")
        elif used:
            label = (" (a task with no single reference answer, whose reward checks an answer by the task's own rules, "
                     "has no label to show)" if cfg.labeled_examples else "")
            why = (f" {' and '.join(used)} gave no worked example: none of their answers was fit to show (graded "
                   f"wrong, or refused by the example rules){label}.")
        return f"Try {', '.join(tries[:-1])} or {tries[-1]}.{why}"

    def _saw(self, group: list[Rollout]) -> None:
        self.progress.rollouts += len(group)
        self.progress.reward_sum += sum(r.reward or 0.0 for r in group)
        self.progress.tokens += sum(r.prompt_tokens + r.completion_tokens for r in group)
        self._notify()

    def _count_tokens(self) -> None:
        self.progress.tokens = sum(u["prompt"] + u["completion"] for u in self.store.usage(self.run_id).values())
        self._notify()

    def _check_budget(self) -> None:
        budget = self.config.max_tokens
        if budget is not None:
            self._count_tokens()
            if self.progress.tokens >= budget:
                raise BudgetExhausted(f"token budget reached: {self.progress.tokens} of {budget} tokens spent")

    def _notify(self) -> None:
        self.on_progress(self.progress)


def _examples_held(library: LibraryVersion) -> set[str]:
    """The problems the library already holds a worked example of."""
    return {pid for item in library.items if item.kind == "example" for pid in item.provenance.problem_ids}


def _mean(values: Any) -> float:
    items = [v or 0.0 for v in values]
    return sum(items) / len(items) if items else 0.0


def resume_config(store: RunStore, run_id: str, max_tokens: int | None = None,
                  learn_minutes: float | None = None) -> tuple[str, OptimizeConfig]:
    """The stored config of a run, so a resumed run repeats exactly what was started (its token budget and time
    limit may be raised)."""
    return store.run_config(run_id, "optimize", OptimizeConfig, max_tokens=max_tokens, learn_minutes=learn_minutes)
