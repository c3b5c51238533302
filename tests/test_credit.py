"""Credit per item: the ablation rules, which validation problems an item reaches, and the prune step of a run."""

import asyncio
import json

import pytest

from fakes import ScriptedBackend, default_learner
from gym_tf.config import OptimizeConfig
from gym_tf.credit import Ablation, ablation, leave_out, shown_to
from gym_tf.datasets import Problem
from gym_tf.library import EMPTY_LIBRARY, AddOp, ExampleOp, RenderPolicy, apply_ops, with_policy
from gym_tf.optimize import Optimizer, resume_config
from gym_tf.store import RunStore

HELPS = "Write each intermediate result down before the next operation."
HARMS = "Answer from memory without working anything out."


@pytest.mark.parametrize("kind, with_item, without_item, keep, verdict", [
    ("lesson", 0.75, 0.5, True, "helps"),
    ("lesson", 0.5, 0.5, False, "no effect"),  # paid in every prompt for nothing
    ("lesson", 0.25, 0.5, False, "harms"),
    ("example", 0.75, 0.5, True, "helps"),
    ("example", 0.5, 0.5, True, "no effect"),  # examples are measured, never dropped (see gym_tf/credit.py)
    ("example", 0.25, 0.5, True, "harms"),
    ("lesson", None, None, True, "not shown on validation"),
    ("example", None, None, True, "not shown on validation"),
])
def test_what_an_ablation_keeps(kind, with_item, without_item, keep, verdict):
    result = Ablation("E1", kind, ("p",) if with_item is not None else (), with_item, without_item)
    assert (result.keep, result.verdict) == (keep, verdict)
    assert result.to_dict()["keep"] == keep


def test_an_ablation_averages_its_problems_scores():
    library, _ = apply_ops(EMPTY_LIBRARY, [AddOp(op="add", text=HELPS)], step=1)
    problems = [Problem(id=str(i), problem=f"q{i}", answer="1", row={}) for i in range(3)]
    result = ablation(library.items[0], problems, [1.0, 0.5, 0.0], [0.5, 0.5, 0.5])
    assert result.problems == ("0", "1", "2") and result.with_item == 0.5 and result.without_item == 0.5
    assert ablation(library.items[0], [], [], []).effect is None


def test_an_example_is_judged_on_the_problems_it_is_retrieved_for():
    """With one example per prompt, the apples example is shown to the apples problems only."""
    examples = [ExampleOp(op="example", text="Problem: How many apples are in 3 baskets of 4 apples?\nSolution: 12"),
                ExampleOp(op="example", text="Problem: A train runs 60 km in 2 hours; its speed?\nSolution: 30")]
    library, _ = apply_ops(with_policy(EMPTY_LIBRARY, RenderPolicy(examples=1)), examples, step=1)
    problems = [Problem(id="a", problem="How many apples in 5 baskets of 2 apples?", answer="10", row={}),
                Problem(id="t", problem="A train runs 90 km in 3 hours. Its speed?", answer="30", row={}),
                Problem(id="b", problem="Apples: 7 baskets of 3 apples, how many apples?", answer="21", row={})]
    apples, train = library.items
    assert [p.id for p in shown_to(library, apples, problems)] == ["a", "b"]
    assert [p.id for p in shown_to(library, train, problems)] == ["t"]
    pruned = leave_out(library, [apples.id], 2)
    assert [i.id for i in pruned.items] == [train.id] and pruned.parent == library.id
    assert pruned.policy == library.policy and pruned.next_number == library.next_number


class ReadsLessons(ScriptedBackend):
    """Right 30% of the time alone; one lesson helps (+60 points), the other harms (-30 points)."""

    def skill_for(self, messages):
        system = str(messages[0]["content"])
        return 0.3 + 0.6 * (HELPS in system) - 0.3 * (HARMS in system)


def both_lessons(stage, prompt, attempt=0):
    if stage == "extract":
        return json.dumps({"operations": [{"op": "add", "text": HELPS}, {"op": "add", "text": HARMS}]})
    return default_learner(stage, prompt, attempt)


GATED = OptimizeConfig(dataset="quickstart", limit=8, batch_size=8, group_size=4, epochs=1, seed=2,
                       worked_examples=False, summarize=False, val_dataset="quickstart", val_samples=4, prune=True)


async def test_a_gated_run_ends_by_dropping_the_lesson_whose_absence_helps(tmp_path, quickstart):
    backend = ReadsLessons({p.problem: p.answer for p in quickstart}, learner=both_lessons)
    store = RunStore(tmp_path / "ws")
    optimizer = Optimizer(GATED, store, backend)
    result = await optimizer.run()

    steps = store.steps(result.run_id)
    assert [s["step"] for s in steps] == [1, 2]  # one learning step, then the prune step
    learned = store.version(steps[0]["version_after"])
    assert sorted(i.text for i in learned.items) == sorted([HELPS, HARMS])  # the gate let both in: 0.6 > 0.3
    credit = {a["item"]: a for a in steps[1]["stats"]["ablation"]}
    harms = next(i.id for i in learned.items if i.text == HARMS)
    helps = next(i.id for i in learned.items if i.text == HELPS)
    assert credit[harms]["verdict"] == "harms" and not credit[harms]["keep"]
    assert credit[helps]["verdict"] == "helps" and credit[helps]["keep"]
    assert len(credit[helps]["problems"]) == 40  # a lesson is in every validation prompt
    assert [i.text for i in result.library.items] == [HELPS]
    assert steps[1]["status"] == "promoted" and steps[1]["stats"]["val_mean"] > steps[0]["stats"]["val_mean"]
    deletes = [o for o in store.ops(result.run_id) if o["step"] == 2]
    assert [(json.loads(o["op"])["op"], json.loads(o["op"])["id"]) for o in deletes] == [("delete", harms)]
    assert deletes[0]["reason"].startswith("ablation: harms on 40 validation problems")
    # paid in the prune step: each item left out, on the problems it was shown to (the learned library's own scores
    # and the pruned version's are the ones already measured: the pruned library is the harmful lesson left out)
    solve_calls = sum(c["stage"] == "solve" for c in backend.calls)
    assert solve_calls == 8 + 40 + 40 + 2 * 40  # step 1's groups, step-0 and step-1 validation, then the prune step
    assert store.db["rollouts"].count_where("step = 2") == 2 * 40 * 4
    assert store.run(result.run_id)["current_version"] == result.library.id


class HurtByOneExample(ScriptedBackend):
    """Worked examples help (+50 points), except the one solved from the muffins problem, which harms (-60)."""

    def skill_for(self, messages):
        system = str(messages[0]["content"])
        examples = system.count("\nSolution: ")
        return max(0.0, min(1.0, 0.3 + 0.5 * (examples > 0) - 0.6 * ("muffins" in system.split("Worked examples")[-1]
                                                                       if examples else False)))


async def test_examples_are_judged_where_shown_kept_and_no_validation_prompt_is_paid_twice(tmp_path, quickstart):
    config = GATED.model_copy(update={"worked_examples": True, "limit": 16, "batch_size": 16})
    backend = HurtByOneExample({p.problem: p.answer for p in quickstart}, learner=lambda *a: '{"operations": []}')
    store = RunStore(tmp_path / "ws")
    result = await Optimizer(config, store, backend).run()
    prune = store.steps(result.run_id)[-1]
    learned = store.version(prune["version_before"])
    examples = [i for i in learned.items if i.kind == "example"]
    assert len(examples) > 2
    val = {p.id: p for p in quickstart}
    for a in prune["stats"]["ablation"]:
        item = learned.get(a["item"])
        # judged on exactly the validation problems whose prompt showed it, a few of the 40
        assert a["problems"] == [p.id for p in shown_to(learned, item, quickstart)]
        assert 0 < len(a["problems"]) < 40 or a["verdict"] == "not shown on validation"
        assert a["keep"]
    muffins = [a for a in prune["stats"]["ablation"] if "muffins" in learned.get(a["item"]).text]
    assert muffins and muffins[0]["problems"] and muffins[0]["verdict"] == "harms"  # measured, and still kept
    assert result.library.id == learned.id and prune["version_after"] == learned.id
    # every (problem, prompt) validated in the prune step is new: nothing measured before was paid again
    earlier = {(r.problem_id, json.dumps(r.messages)) for s in (0, learned.step)
               for r in store.rollouts(result.run_id, s, validation=True)}
    now = [(r.problem_id, json.dumps(r.messages)) for r in store.rollouts(result.run_id, prune["step"], validation=True)]
    assert now and not set(now) & earlier
    assert all(now.count(key) == config.val_samples for key in set(now))
    assert {pid.removeprefix("val/") for pid, _ in now} <= set(val)


async def test_no_prune_step_without_validation_or_when_switched_off(tmp_path, quickstart):
    answers = {p.problem: p.answer for p in quickstart}
    for config in (GATED.model_copy(update={"prune": False}), GATED.model_copy(update={"val_dataset": None})):
        store = RunStore(tmp_path / str(config.prune))
        result = await Optimizer(config, store, ReadsLessons(answers, learner=both_lessons)).run()
        assert [s["step"] for s in store.steps(result.run_id)] == [1]
        assert len(result.library.items) == 2


async def test_a_prune_step_cut_short_resumes_without_paying_twice(tmp_path, quickstart):
    answers = {p.problem: p.answer for p in quickstart}
    clean_store = RunStore(tmp_path / "clean")
    clean = await Optimizer(GATED, clean_store, ReadsLessons(answers, learner=both_lessons)).run()

    class Crash(Exception):
        pass

    store = RunStore(tmp_path / "crash")

    class Stops(ReadsLessons):
        """In the prune step, answers one after another, and fails once 5 of its groups are stored."""

        started = 0

        async def generate(self, messages, n=1, **sampling):
            self.started += messages[0]["role"] == "system"  # a solve call
            order = self.started
            if order > 8 + 40 + 40:
                await asyncio.sleep(0.02 * (order - 88))
                if store.db["rollouts"].count_where("step = 2") >= 5 * 4:
                    raise Crash
            return await super().generate(messages, n, **sampling)

    optimizer = Optimizer(GATED, store, Stops(answers, learner=both_lessons))
    with pytest.raises(Crash):
        await optimizer.run()
    assert [s["step"] for s in store.steps(optimizer.run_id)] == [1]
    stored = store.db["rollouts"].count_where("step = 2")
    assert stored > 0

    run_id, config = resume_config(store, optimizer.run_id)
    backend = ReadsLessons(answers, learner=both_lessons)
    result = await Optimizer(config, store, backend, run_id=run_id).run()
    assert [i.text for i in result.library.items] == [i.text for i in clean.library.items] == [HELPS]
    assert store.steps(run_id)[1]["stats"]["ablation"] == clean_store.steps(clean.run_id)[1]["stats"]["ablation"]
    paid = sum(c["n"] for c in backend.calls if c["stage"] == "solve")
    assert paid == 2 * 40 * 4 - stored


async def test_a_library_the_prune_step_empties_is_not_called_nothing_learned(tmp_path, quickstart):
    """A lesson the gate lets in on a tie and the prune step drops for no effect leaves the library empty; the run's
    notes say it was pruned, not that nothing was learned."""
    neutral = "Read the question once more before you answer it."

    def one_neutral_lesson(stage, prompt, attempt=0):
        if stage == "extract":
            return json.dumps({"operations": [{"op": "add", "text": neutral}]})
        return default_learner(stage, prompt, attempt)

    store = RunStore(tmp_path / "ws")
    result = await Optimizer(GATED, store, ReadsLessons({p.problem: p.answer for p in quickstart},
                                                        learner=one_neutral_lesson)).run()
    learned = store.version(store.steps(result.run_id)[0]["version_after"])
    assert [i.text for i in learned.items] == [neutral] and result.library.items == ()
    assert any(n.startswith("pruned 1 of 1") for n in result.progress.notes)
    assert not any(n.startswith("nothing learned") for n in result.progress.notes)
