"""The optimize loop against the scripted fake: what it learns, records, skips, rejects and resumes."""

import dataclasses
import hashlib
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from pydantic import ValidationError

from crash_run import CONFIG, GATED, LibraryReader, scripted
from fakes import ScriptedBackend, default_learner, solve_text
from gym_tf.backends import Choice, Generation
from gym_tf.config import OptimizeConfig
from gym_tf.datasets import Problem, load_dataset
from gym_tf.errors import ConfigError
from gym_tf.display import library_table, progress_line
from gym_tf.learner import OpRules, numbers_of, repeats_problem, summarize_prompt
from gym_tf.library import (EMPTY_LIBRARY, AddOp, ExampleOp, LibraryVersion, apply_ops, copies_example, example_parts,
                            example_text)
from gym_tf.library_io import diff_versions
from gym_tf.metrics import canonical_answer
from gym_tf.optimize import Optimizer, resume_config
from gym_tf.rollouts import Rollout, build_messages
from gym_tf.prompts import template
from gym_tf.store import RunStore, hinted_answer, learner_answer, reference_answer
from gym_tf.studio import queries as studio_queries

# the paper's design, summaries included (off by default): these tests cover every learner stage
SMALL = OptimizeConfig(dataset="quickstart", limit=8, batch_size=4, group_size=4, epochs=2, seed=3,
                       worked_examples=False, summarize=True)


async def run(store, backend, config=SMALL, **kwargs):
    optimizer = Optimizer(config, store, backend, **kwargs)
    return optimizer, await optimizer.run()


async def test_loop_learns_records_and_keeps_provenance(store, scripted):
    optimizer, result = await run(store, scripted)
    assert result.status == "finished"
    steps = store.steps(result.run_id)
    assert [s["step"] for s in steps] == [1, 2, 3, 4]
    assert len(result.library.items) > 0
    assert store.run(result.run_id)["current_version"] == result.library.id
    assert len(store.rollouts(result.run_id)) == 8 * 4 * 2
    rollout_keys = {r["key"] for r in store.db["rollouts"].rows}
    for item in result.library.items:
        assert item.provenance.problem_ids and set(item.provenance.rollout_ids) <= rollout_keys
    # every accepted op of every step is recorded with the version it produced
    applied = [o for o in store.ops(result.run_id) if o["accepted"]]
    assert len(applied) == result.progress.ops_applied > 0
    # the learner asked for the ops schema (constrained decoding where the backend supports it)
    assert all(c["json_schema"] for c in scripted.calls if c["stage"] in ("extract", "consolidate"))


async def test_learner_calls_match_the_reference_design(store, scripted):
    _, result = await run(store, scripted, SMALL.model_copy(update={"epochs": 1}))
    by_stage = {}
    for call in scripted.calls:
        by_stage[call["stage"]] = by_stage.get(call["stage"], 0) + 1
    used = result.progress.groups_used
    assert by_stage["summarize"] == used * SMALL.group_size
    assert by_stage["extract"] == used
    assert by_stage["consolidate"] == 2  # one per step


def test_the_summary_prompt_lists_the_lessons_an_attempt_was_shown_not_its_worked_examples():
    library, _ = apply_ops(EMPTY_LIBRARY, [
        AddOp(op="add", text="Convert every quantity to the same unit first."),
        ExampleOp(op="example", text=example_text("How many legs do 3 spiders have?", "3 x 8 = 24. \\boxed{24}"))],
        step=1)
    problem = Problem(id="p", problem="How many minutes are there in 3.5 hours?", answer="210")
    messages, shown = build_messages(problem, library)
    assert shown == ("E1", "E2")  # the solver saw both
    attempt = Rollout("p", 0, messages, "3.5 x 60 = 210. \\boxed{210}", "stop", 10, 10, 0.0, reward=1.0, shown=shown)
    prompt = summarize_prompt(problem, attempt, library)
    assert "[E1] Convert every quantity to the same unit first." in prompt
    assert "spiders" not in prompt and "[E2]" not in prompt


async def test_homogeneous_groups_cost_no_learner_calls(store, quickstart):
    perfect = ScriptedBackend({p.problem: p.answer for p in quickstart}, skill=1.0)
    _, result = await run(store, perfect, SMALL.model_copy(update={"worked_examples": True}))
    assert result.progress.groups_skipped == 16 and result.progress.groups_used == 0
    assert {c["stage"] for c in perfect.calls} == {"solve"}
    # no lesson and no learner call; each solved problem left one worked example of its verified answers
    assert {i.kind for i in result.library.items} == {"example"}
    assert len(result.library.items) == len({i.provenance.problem_ids for i in result.library.items}) == 8


ZEROES = {"Solve 2x = 0.": "0", "Solve x + 1 = 1.": "0.0", "Solve 3x = 0.": "0", "Solve x - 7 = 0.": "7",
          "Solve 5x = 0.": "0/5", "Solve x - 8 = 0.": "8"}


@pytest.mark.parametrize("cap, zeroes", [(None, 4), (1, 1), (2, 2)])
async def test_examples_per_answer_keeps_a_final_answer_from_filling_the_library(tmp_path, cap, zeroes):
    """Most answers of a family can be one value (0 in polynomial_equations); examples that all end on it teach a
    small model to answer it. With a cap, a solution whose answer (as voting reads it: 0, 0.0 and 0/5 alike) is
    shown that many times already, in the library or earlier in the step, is not kept."""
    rows = [{"id": f"p{i}", "problem": problem, "answer": answer} for i, (problem, answer) in enumerate(ZEROES.items())]
    (tmp_path / "zeroes.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = OptimizeConfig(dataset=str(tmp_path / "zeroes.jsonl"), batch_size=3, group_size=2, epochs=1,
                            examples_per_answer=cap)
    _, result = await run(RunStore(tmp_path / "ws"), ScriptedBackend(ZEROES, skill=1.0), config)
    kept = Counter(canonical_answer(re.search(r"\\boxed\{(.*)\}$", i.text).group(1))
                   for i in result.library.items if i.kind == "example")
    assert kept == {0: zeroes, 7: 1, 8: 1}
    assert ("examples_per_answer" in config.recorded()) == (cap is not None)  # runs without it keep their hash


class Working(ScriptedBackend):
    """Every answer right, with `work(sample, answer)` written before its boxed result."""

    def __init__(self, answers, work):
        super().__init__(answers, skill=1.0)
        self.work = work

    async def generate(self, messages, n=1, **sampling):
        generation = await super().generate(messages, n, **sampling)
        return dataclasses.replace(generation, choices=[dataclasses.replace(c, text=self.work(i, c.text) + c.text)
                                                        for i, c in enumerate(generation.choices)])


def wordy(length):
    """Every answer padded to `length` characters."""
    return lambda sample, answer: "w" * max(0, length - len(answer))


def stepwise(width):
    """Sample i shows i + 1 lines of working, each `width` characters wide."""
    return lambda sample, answer: "".join(f"line {j} ".ljust(width, ".") + "\n" for j in range(sample + 1))


@pytest.mark.parametrize("statement, solution, kept", [
    (600, 400, True),  # a long statement (task families' boilerplate) does not cost a short solution its place
    (100, 600, False),  # a solution over the cap is not shown, however short its problem
    (1565, 300, True),  # string_splitting's statements: a whole item past 1,600 characters is still shown
    (3800, 300, False),  # the whole item stays within a worked example's bound (MAX_EXAMPLE_CHARS)
])
async def test_a_worked_example_is_capped_on_its_solution_not_its_statement(tmp_path, statement, solution, kept):
    problem = ("Read the rules. " * 300)[:statement - 11] + "What is 2+3?"
    (tmp_path / "long.jsonl").write_text(json.dumps({"id": "p", "problem": problem, "answer": "5"}) + "\n")
    config = OptimizeConfig(dataset=str(tmp_path / "long.jsonl"), batch_size=1, group_size=2, epochs=1,
                            max_example_chars=500)
    _, result = await run(RunStore(tmp_path / "ws"), Working({problem: "5"}, wordy(solution)), config)
    examples = [i for i in result.library.items if i.kind == "example"]
    assert len(problem) == statement + 1
    assert len(examples) == int(kept)
    if kept:
        assert examples[0].text.endswith("\\boxed{5}") and problem in examples[0].text


async def kept_solution(tmp_path, work):
    """The solution of the one worked example kept from four right answers to "What is 2+3?", each written by
    `work` (as in `Working`), within a 500-character cap."""
    problem = "What is 2+3?"
    (tmp_path / "one.jsonl").write_text(json.dumps({"id": "p", "problem": problem, "answer": "5"}) + "\n")
    config = OptimizeConfig(dataset=str(tmp_path / "one.jsonl"), batch_size=1, group_size=4, epochs=1,
                            max_example_chars=500)
    _, result = await run(RunStore(tmp_path / "ws"), Working({problem: "5"}, work), config)
    [example] = [i for i in result.library.items if i.kind == "example"]
    return example.text.split("\nSolution: ", 1)[1]


@pytest.mark.parametrize("width, steps", [(20, 5), (150, 4)])  # at 150 wide, 4 lines of working pass the 500 cap
async def test_a_worked_example_is_the_answer_showing_the_most_steps_within_the_cap(tmp_path, width, steps):
    solution = await kept_solution(tmp_path, stepwise(width))
    assert len(solution.splitlines()) == steps and solution.endswith("\\boxed{5}")


CODE = "Compute it in Python.\n```python\n" + "x = 2\n" * 8 + "print(x + 3)\n```\n"
ANSWERS_WITH_CODE = [
    "First 2.\nThen 3.\n",  # 2 lines of working in prose
    CODE + "```output\n5\n```\n",  # the most lines, but an output block the model wrote itself: never shown
    CODE,  # a program nobody ran: its code is not working the reader can follow (1 line)
    "Start from 2.\nAdd 3.\nThat is 5.\n",  # 3 lines in prose: kept
]


async def test_a_worked_example_shows_working_in_prose_not_code_or_its_invented_output(tmp_path):
    solution = await kept_solution(tmp_path, lambda sample, answer: ANSWERS_WITH_CODE[sample])
    assert solution.startswith(ANSWERS_WITH_CODE[3])


class CutOff(ScriptedBackend):
    """Right answers, every one cut off at the token limit: none is fit to be a worked example."""

    async def generate(self, messages, n=1, **sampling):
        generation = await super().generate(messages, n, **sampling)
        return dataclasses.replace(generation, choices=[dataclasses.replace(c, finish_reason="length")
                                                        for c in generation.choices])


@pytest.mark.parametrize("policy", ["wrong", "cut off", "right"])
async def test_the_learner_answers_what_the_model_could_not_show_and_its_verified_answer_becomes_the_example(
        store, quickstart, policy):
    """`learner_examples`: a small model that solves nothing reads a stronger model's verified working; a model that
    solves a problem keeps its own, and the learner is not asked. The learner's wrong answers are never shown."""
    answers = {p.problem: p.answer for p in quickstart}
    model = {"wrong": ScriptedBackend(answers, skill=0.0), "cut off": CutOff(answers, skill=1.0),
             "right": ScriptedBackend(answers, skill=1.0)}[policy]
    learner = ScriptedBackend(answers, skill=0.5)
    config = SMALL.model_copy(update={"epochs": 1, "worked_examples": True, "learner_examples": 2})
    with pytest.raises(ConfigError, match="needs a learner model of its own"):
        Optimizer(config, store, model)
    _, result = await run(store, model, config, learner_backend=learner)
    examples = [i for i in result.library.items if i.kind == "example"]
    stored = {r["key"]: r for r in store.db["rollouts"].rows_where("problem_id like 'learner/%'")}
    if policy == "right":
        assert len(examples) == 8 and not stored and not [c for c in learner.calls if c["stage"] == "solve"]
        assert not any(learner_answer(key) for i in examples for key in i.provenance.rollout_ids)
        return
    assert len(stored) == 8 * 2  # every problem, twice
    solved = {r["problem_id"].removeprefix("learner/") for r in stored.values() if r["reward"] == 1.0}
    assert 0 < len(solved) < 8  # the learner is right on some problems only
    assert {i.provenance.problem_ids[0] for i in examples} == solved
    for item in examples:
        [key] = item.provenance.rollout_ids
        assert stored[key]["reward"] == 1.0 and stored[key]["completion"] in item.text
    assert store.usage(result.run_id)["learner-answer"]["completion"] > 0
    assert result.progress.rollouts == 8 * 4  # the learner's answers are not counted as the model's rollouts
    shown = {row[3] for row in zip(*(c.cells for c in library_table(result.library).columns))}
    assert shown and all(" example by the learner " in cell for cell in shown)
    with sqlite3.connect(store.root / "gym-tf.db") as con:  # the studio's item page names the problem the learner answered
        page = studio_queries.item(con, result.library.id, examples[0].id)
    assert page["problems"][0]["text"] in answers and page["problems"][0]["text"] in examples[0].text
    # a resumed run finds them stored: the same answers, and not one call paid again
    paid = sum(c["n"] for c in learner.calls if c["stage"] == "solve")
    step = examples[0].provenance.step
    batch = [p for p in quickstart if any(k.startswith(f"{result.run_id}/{step}/learner/{p.id}/") for k in stored)]
    groups = {p.id: [r for r in store.rollouts(result.run_id, step) if r.problem_id == p.id] for p in batch}
    again = Optimizer(config, store, model, learner_backend=learner, run_id=result.run_id)
    found = await again._learner_answers(0, step, batch, groups, LibraryVersion())
    assert sum(c["n"] for c in learner.calls if c["stage"] == "solve") == paid == 16
    assert len(batch) == 4 and {pid: len(g) for pid, g in found.items()} == {p.id: 2 for p in batch}


HINT_OPENING = template("hint").split("{answer}")[0]


class Told(ScriptedBackend):
    """Wrong on every problem asked plainly; told its answer, right in two of three answers, and in one of those two
    it says it was told."""

    async def generate(self, messages, n=1, **sampling):
        user = messages[-1]["content"]
        if HINT_OPENING not in user:
            return await super().generate(messages, n, **sampling)
        problem, hint = user.split("\n\n" + HINT_OPENING)
        assert hint.startswith(self.answers[problem] + ".")  # the reference answer, as the dataset has it
        choices = []
        for i in range(n):
            draw = int(hashlib.sha256(f"{problem}:{sampling.get('seed')}:{i}".encode()).hexdigest(), 16) % 3
            text = solve_text(problem, "wrong" if draw == 2 else self.answers[problem])
            text = f"As I was told, the correct answer is {self.answers[problem]}. {text}" if draw == 1 else text
            choices.append(Choice(text=text, finish_reason="stop", completion_tokens=len(text.split())))
        self.calls.append({"stage": "solve told", "n": n, "problem": problem})
        return Generation(choices, 10 * n, sum(c.completion_tokens for c in choices), 0.0)


@pytest.mark.parametrize("policy", ["wrong", "right"])
async def test_told_the_answer_the_model_s_verified_answer_that_does_not_say_so_becomes_the_example(
        store, quickstart, policy):
    """`hinted_examples` (STaR's rationalization): where none of the model's answers is fit to show, it answers told
    the reference answer; a right one that does not say it was told is the worked example, of the problem as asked.
    A model that solves its problems is never told."""
    answers = {p.problem: p.answer for p in quickstart}
    model = Told(answers, skill=0.0 if policy == "wrong" else 1.0)
    config = SMALL.model_copy(update={"epochs": 1, "worked_examples": True, "hinted_examples": 2})
    _, result = await run(store, model, config)
    examples = [i for i in result.library.items if i.kind == "example"]
    stored = {r["key"]: r for r in store.db["rollouts"].rows_where("problem_id like 'hinted/%'")}
    if policy == "right":
        assert len(examples) == 8 and not stored and not [c for c in model.calls if c["stage"] == "solve told"]
        return
    assert len(stored) == 8 * 2 and all(HINT_OPENING in r["messages"] for r in stored.values())
    completions = {}
    for r in stored.values():
        completions.setdefault(r["problem_id"].removeprefix("hinted/"), []).append(r)
    fit = {pid for pid, rs in completions.items()
           if any(r["reward"] == 1.0 and not r["completion"].startswith("As I was told") for r in rs)}
    told_only = {pid for pid, rs in completions.items() if pid not in fit and any(r["reward"] == 1.0 for r in rs)}
    assert fit and told_only  # the scripted draws give both kinds: the test sees the filter work
    assert {i.provenance.problem_ids[0] for i in examples} == fit
    for item in examples:
        [key] = item.provenance.rollout_ids
        assert hinted_answer(key) and stored[key]["reward"] == 1.0 and stored[key]["completion"] in item.text
        assert HINT_OPENING not in item.text and "told" not in item.text
        assert example_parts(item.text)[0] in answers  # the problem as the dataset asks it
    assert store.usage(result.run_id)["hinted-answer"]["completion"] > 0
    assert result.progress.rollouts == 8 * 4  # answers told the answer are not counted as the model's rollouts
    shown = {row[3] for row in zip(*(c.cells for c in library_table(result.library).columns))}
    assert shown and all(" example told the answer " in cell for cell in shown)
    with sqlite3.connect(store.root / "gym-tf.db") as con:  # the item page names the problem, the hint shown
        page = studio_queries.item(con, result.library.id, examples[0].id)
    assert page["problems"][0]["id"] == examples[0].provenance.problem_ids[0]
    assert HINT_OPENING in page["problems"][0]["text"]
    # a resumed run finds them stored: not one call paid again
    paid = len([c for c in model.calls if c["stage"] == "solve told"])
    step = examples[0].provenance.step
    batch = [p for p in quickstart if any(k.startswith(f"{result.run_id}/{step}/hinted/{p.id}/") for k in stored)]
    groups = {p.id: [r for r in store.rollouts(result.run_id, step) if r.problem_id == p.id] for p in batch}
    again = Optimizer(config, store, model, run_id=result.run_id)
    found = await again._hinted_answers(0, step, batch, [groups], LibraryVersion())
    assert len([c for c in model.calls if c["stage"] == "solve told"]) == paid == 8
    assert len(batch) == 4 and set(found) == {p.id for p in batch}
    assert all(not r.completion.startswith("As I was told") for g in found.values() for r in g)


CUBES = {"A cube's top is white; turn it over. What is on the bottom?": "white",
         "A cube's front is white; turn it left. What is on the right?": "white"}


class Copying(ScriptedBackend):
    """Every right answer is the working of the first cube problem again: a copy that is right on the second only
    because both answers are white (the 0.5B on color_cube_rotation)."""

    async def generate(self, messages, n=1, **sampling):
        generation = await super().generate(messages, n, **sampling)
        copy = solve_text(next(iter(CUBES)), "white")
        return dataclasses.replace(generation, choices=[dataclasses.replace(c, text=copy)
                                                        for c in generation.choices])


@pytest.mark.parametrize("batch_size", [1, 2])  # the example held in the library, or kept earlier in the same step
@pytest.mark.parametrize("backend, refuse, kept", [(ScriptedBackend, True, 2), (Copying, True, 1), (Copying, False, 2)])
async def test_an_answer_copying_a_worked_example_is_not_kept_as_another(tmp_path, batch_size, backend, refuse, kept):
    rows = [{"id": f"c{i}", "problem": problem, "answer": answer} for i, (problem, answer) in enumerate(CUBES.items())]
    (tmp_path / "cubes.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = OptimizeConfig(dataset=str(tmp_path / "cubes.jsonl"), batch_size=batch_size, group_size=2, epochs=1,
                            refuse_copied_examples=refuse)
    assert ("refuse_copied_examples" in config.recorded()) == refuse  # runs without it keep their hash
    store = RunStore(tmp_path / "ws")
    _, result = await run(store, backend(CUBES, skill=1.0), config)
    examples = [i for i in result.library.items if i.kind == "example"]
    assert len(examples) == kept and all(i.text.endswith("\\boxed{white}") for i in examples)
    if kept == 1:  # the other problem's answers were all right, and all copies of the example's solution
        [shown] = examples[0].provenance.problem_ids
        refused = [r for r in store.db["rollouts"].rows if r["problem_id"] != shown]
        assert len(refused) == 2 and all(r["reward"] == 1.0 for r in refused)
        assert all(copies_example(r["completion"], [example_parts(examples[0].text)[1]]) for r in refused)


WORDS = {"Spell this word backward: eye": "eye", "Spell this word backward: cat": "tac",
         "Spell this word backward: dog": "god", "Spell this word backward: sun": "nus"}
OPTIONS = {"Is 3 odd? Answer Yes or No.": "Yes", "Is 4 odd? Answer Yes or No.": "No",
           "Is 5 odd? Answer Yes or No.": "Yes", "Is 6 prime? Answer Yes or No.": "No"}


@pytest.mark.parametrize("problems, refuse, kept", [
    (WORDS, True, {"tac", "god", "nus"}),  # the palindrome states its answer: right by copying the question
    (WORDS, False, {"eye", "tac", "god", "nus"}),
    (OPTIONS, True, {"Yes", "No"}),  # every answer is an option the question names: the rule leaves them all
])
async def test_no_worked_example_of_a_problem_that_states_its_own_answer(tmp_path, problems, refuse, kept):
    rows = [{"id": f"w{i}", "problem": problem, "answer": answer} for i, (problem, answer) in enumerate(problems.items())]
    (tmp_path / "words.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = OptimizeConfig(dataset=str(tmp_path / "words.jsonl"), batch_size=4, group_size=2, epochs=1,
                            refuse_answer_in_problem=refuse)
    assert ("refuse_answer_in_problem" in config.recorded()) == refuse  # runs without it keep their hash
    _, result = await run(RunStore(tmp_path / "ws"), ScriptedBackend(problems, skill=1.0), config)
    examples = [i for i in result.library.items if i.kind == "example"]
    boxed = [re.search(r"\\boxed\{(.*)\}", i.text).group(1) for i in examples]
    assert len(boxed) == len(problems) - len(set(problems.values()) - kept)  # one per problem not refused
    assert set(boxed) == kept


async def test_hard_groups_learn_from_the_reference_answer(store, quickstart):
    hopeless = ScriptedBackend({p.problem: p.answer for p in quickstart}, skill=0.0)
    _, result = await run(store, hopeless, SMALL.model_copy(update={"hard_groups": "reference", "epochs": 1}))
    assert result.progress.groups_used == 8 and result.library.items
    prompts = [r["messages"] for r in store.db["learner_calls"].rows_where("stage = 'extract'")]
    assert all("Every attempt at this problem failed" in p for p in prompts)


async def test_token_totals_equal_the_backend_reported_usage(store, scripted):
    _, result = await run(store, scripted)
    usage = store.usage(result.run_id)
    stored = sum(u["prompt"] + u["completion"] for u in usage.values())
    reported = sum(c["prompt_tokens"] + c["completion_tokens"] for c in scripted.calls)
    assert stored == reported == result.progress.tokens
    assert set(usage) == {"rollout", "summarize", "extract", "consolidate"}


async def test_garbage_learner_yields_no_version_and_an_audit(store, quickstart):
    garbage = ScriptedBackend({p.problem: p.answer for p in quickstart}, learner=lambda stage, prompt, attempt: "lol {")
    _, result = await run(store, garbage, SMALL.model_copy(update={"epochs": 1}))
    assert result.library.items == ()
    assert [v["step"] for v in store.versions(result.run_id)] == []  # no corrupt version written
    rejected = [o for o in store.ops(result.run_id) if not o["accepted"]]
    assert rejected and all("Invalid JSON" in o["reason"] for o in rejected)
    attempts = [c for c in garbage.calls if c["stage"] == "extract"]
    assert max(c["attempt"] for c in attempts) == SMALL.max_attempts - 1
    invalid = list(store.db["learner_calls"].rows_where("stage = 'extract' and valid = 0"))
    assert len(invalid) == len(attempts)


async def asked_again(store, quickstart, stage, first_reply):
    """A run whose learner answers `first_reply(prompt)` first in `stage` (None: as usual) and well after that: the
    result, the message that asked again, and the backend."""
    def learner(this_stage, prompt, attempt):
        reply = first_reply(prompt) if this_stage == stage and attempt == 0 else None
        return reply if reply is not None else default_learner(this_stage, prompt, attempt)

    backend = ScriptedBackend({p.problem: p.answer for p in quickstart}, learner=learner)
    _, result = await run(store, backend, SMALL.model_copy(update={"epochs": 1}))  # two steps of 4
    retry = next(json.loads(r["messages"]) for r in store.db["learner_calls"].rows_where(
        "stage = ? and attempt = 1", [stage]))
    return result, retry[-1]["content"], backend


async def test_retry_shows_the_error_and_then_applies(store, quickstart):
    result, retry, _ = await asked_again(store, quickstart, "extract", lambda _: '{"operations": [{"op": "add"}]}')
    assert result.library.items
    assert "Field required at operations.0.add.text" in retry


async def test_a_lesson_that_is_one_problems_result_is_refused_and_asked_again(store, quickstart):
    """The lesson rule (10 letters of advice) is the learner's to hold, by retry: what the embedded 0.5B wrote."""
    result, retry, _ = await asked_again(store, quickstart, "extract",
                                         lambda _: '{"operations": [{"op": "add", "text": "8 + 32 = 40"}]}')
    assert result.library.items and all("8 + 32" not in item.text for item in result.library.items)
    assert "a lesson needs at least 10 letters of advice" in retry


async def test_an_op_may_name_only_the_librarys_lessons(store, quickstart):
    """A 1.5B learner facing an empty library answered `update` of ids it made up ("attempt2", "library_1"). The
    schema offers only add and none until there are lessons, then only their ids; a reply naming another id is asked
    again with the ids there are."""
    sloppy = json.dumps({"operations": [{"op": "update", "id": "E99", "text": "Improve something here."},
                                        {"op": "add", "text": "Always verify the final arithmetic.", "sources": [1]}]})
    result, retry, backend = await asked_again(store, quickstart, "consolidate", lambda _: sloppy)
    assert "unknown id E99 at operations.0: the library's lessons are none yet: use add or none" in retry
    assert result.library.items and all("Improve something" not in i.text for i in result.library.items)

    schemas = [c["json_schema"] for c in backend.calls if c["stage"] in ("extract", "consolidate")]
    offered = [set(s["properties"]["operations"]["items"]["discriminator"]["mapping"]) for s in schemas]
    assert offered[0] == {"add", "none"}  # step 1: the library is empty
    lessons = [i.id for i in result.library.items if i.kind == "lesson"]
    later = [s for s, ops in zip(schemas, offered) if "update" in ops]
    assert later and set(later[-1]["$defs"]["UpdateOp"]["properties"]["id"]["enum"]) <= set(lessons)


async def test_a_lesson_carrying_the_problems_numbers_is_refused_and_asked_again(store, quickstart):
    """"To solve the arithmetic problem 49 + 32, ..." (a 1.5B learner) is a note about one problem."""
    def specific(prompt):
        problem = re.search(r"Problem:\n(.*)\n", prompt).group(1)
        number = next((n for n in re.findall(r"\d+", problem) if len(n) >= 2), None)
        if number:
            return json.dumps({"operations": [{"op": "add", "text": f"When a problem says {number}, add it up twice."}]})
        return None

    result, retry, _ = await asked_again(store, quickstart, "extract", specific)
    assert result.library.items and all("add it up twice" not in item.text for item in result.library.items)
    assert "repeats the problem's numbers" in retry


async def test_a_reply_that_keeps_naming_unknown_ids_is_recorded_as_rejected(store, quickstart):
    def stubborn(stage, prompt, attempt):
        if stage == "consolidate":
            return json.dumps({"operations": [{"op": "update", "id": "E99", "text": "Improve something here."}]})
        return default_learner(stage, prompt, attempt)

    backend = ScriptedBackend({p.problem: p.answer for p in quickstart}, learner=stubborn)
    _, result = await run(store, backend, SMALL.model_copy(update={"epochs": 1, "batch_size": 8}))
    [refused] = [o for o in store.ops(result.run_id) if o["stage"] == "consolidate"]
    assert not refused["accepted"] and refused["reason"].startswith("unknown id E99")
    # the step's own proposals are applied instead, each checked again by apply_ops (nothing half-way)
    lessons = [i.text for i in result.library.items if i.kind == "lesson"]
    assert lessons and all(t.startswith("Re-check each arithmetic step (lesson ") for t in lessons)


@pytest.mark.parametrize("lesson, refused", [
    ("To solve the arithmetic problem 49 + 32, align the digits.", ["32", "49"]),
    ("Start with 3 - 7 = -4, then add 3.", ["3", "7"]),
    ("Add two numbers at a time, left to right.", []),
    ("Keep 2 decimal places until the last step.", []),  # one small number: not this problem's
    ("The answer has 1,200 in it.", ["1,200"]),
])
def test_a_lesson_is_refused_for_repeating_a_problems_numbers(lesson, refused):
    problem = Problem(id="p", problem="Compute 49 + 32 - 3 + 7 + 2 and 1,200.", answer="1287")
    assert repeats_problem(lesson, numbers_of(problem)) == refused


@pytest.mark.parametrize("lesson, problem, refused", [
    ("The approach is to use Python's built-in functions to handle calculations.", "Add 3 and 4.", "use Python"),
    ("Write a short program, then read off its output.", "Add 3 and 4.", "Write a short program"),
    ("Check each step with a calculator.", "Add 3 and 4.", "with a calculator"),
    ("Instead of guessing, use the built-in functions.", "Add 3 and 4.", "use the built-in functions"),
    # advice against code, and everyday words, are not advice to use it
    ("Do not write code; work the arithmetic out in words.", "Add 3 and 4.", None),
    ("Never use a calculator: add the digits column by column.", "Add 3 and 4.", None),
    ("Count the paths with dynamic programming, one cell at a time.", "Count grid paths.", None),
    ("Count the pandas in each enclosure before adding.", "Count the animals.", None),
    # where the problems are about code, advice about code is welcome
    ("In Python, build the result with a list comprehension.", "Write a Python function that squares a list.", None),
])
def test_a_lesson_naming_code_is_refused_unless_the_problems_are_about_code(lesson, problem, refused):
    """The README's main command learned four lessons like the first (0.5B learner); a solver asked in text runs no
    code, and answers that write one and invent its output are right half as often."""
    broken = OpRules.of(LibraryVersion(), [Problem(id="p", problem=problem, answer="7")]).broken_by(
        [AddOp(op="add", text=lesson)])
    if refused:
        assert broken and f'says "{refused}", but the solver runs no code' in broken
    else:
        assert broken is None


async def test_a_lesson_advising_code_is_refused_and_asked_again(store, quickstart):
    python = json.dumps({"operations": [{"op": "add", "text": "The approach is to use Python's built-in functions "
                                                             "to handle calculations."}]})
    result, retry, _ = await asked_again(store, quickstart, "extract", lambda _: python)
    assert result.library.items and all("Python" not in item.text for item in result.library.items)
    assert 'says "use Python", but the solver runs no code' in retry


async def test_library_diff_shows_exactly_the_ops_applied(store, scripted):
    _, result = await run(store, scripted)
    first = store.version("empty")
    diff = diff_versions(store, first, result.library)
    applied = [json.loads(o["op"]) for o in store.ops(result.run_id) if o["accepted"] and o["stage"] == "apply"]
    assert diff.ops == applied
    assert {i["id"] for i in diff.added} == {i.id for i in result.library.items}


async def test_budget_stops_cleanly_with_everything_committed(store, scripted):
    _, result = await run(store, scripted, SMALL.model_copy(update={"max_tokens": 1500}))
    assert result.status == "budget"
    record = store.run(result.run_id)
    assert record["status"] == "budget"
    committed = store.steps(result.run_id)
    assert len(committed) < 4
    assert record["current_version"] == (result.library.id if committed else store.version("empty").id)


class Clock:
    """A monotonic clock that moves only when the model answers: a minute per call."""

    def __init__(self):
        self.now = 0.0

    def monotonic(self):
        return self.now


def timed(clock):
    class Timed(LibraryReader):
        async def generate(self, messages, n=1, **sampling):
            clock.now += 60.0
            return await super().generate(messages, n, **sampling)

    return Timed({p.problem: p.answer for p in load_dataset("quickstart")})


@pytest.fixture
def clock(monkeypatch):
    clock = Clock()
    monkeypatch.setattr("gym_tf.optimize.time", clock)
    return clock


async def test_the_time_limit_stops_learning_between_steps_and_the_run_still_ends_pruned(store, clock):
    _, whole = await run(store, timed(clock), GATED)
    learning = [s for s in store.steps(whole.run_id) if s["batch"] >= 0]
    assert [s["step"] for s in store.steps(whole.run_id)] == [1, 2, 3, 4, 5, 6, 7]
    minutes = [s["stats"]["learned_s"] / 60 for s in learning]
    assert minutes == sorted(minutes) and minutes[0] > 0
    limit = (minutes[1] + minutes[2]) / 2  # passes during step 3: step 3 finishes, step 4 never starts
    _, cut = await run(store, timed(clock), GATED.model_copy(update={"learn_minutes": limit}))
    steps = store.steps(cut.run_id)
    assert [s["step"] for s in steps] == [1, 2, 3, 7]  # the prune step keeps its number
    assert steps[-1]["batch"] == -1 and steps[-1]["stats"]["ablation"]
    assert cut.status == "finished" and store.run(cut.run_id)["current_version"] == cut.library.id
    assert f"learning stopped at its time limit ({limit:g} min): 3 of 6 steps run" in cut.progress.notes
    assert store.run(cut.run_id)["summary"]["steps"] == 4 and store.run(whole.run_id)["summary"]["steps"] == 7
    assert store.run(cut.run_id)["config"]["learn_minutes"] == limit
    assert "learn_minutes" not in store.run(whole.run_id)["config"]  # runs without a limit keep their config hash


async def test_a_resumed_run_counts_the_time_its_earlier_steps_took_not_the_pause(store, clock):
    """A run stopped by its token budget, resumed much later with a time limit a minute past what its steps took:
    one more learning step starts (the pause is not counted; a step takes the fake clock far past a minute), then
    the prune step; resumed again with a raised limit, a pruned run learns no more."""
    _, first = await run(store, timed(clock), GATED.model_copy(update={"max_tokens": 6000}))
    assert first.status == "budget"
    learned = store.steps(first.run_id)
    assert learned and all(s["batch"] >= 0 for s in learned) and len(learned) < 5
    spent = learned[-1]["stats"]["learned_s"] / 60
    clock.now += 10**6  # the resume comes much later
    run_id, config = resume_config(store, first.run_id, max_tokens=10**9, learn_minutes=spent + 1)
    _, resumed = await run(store, timed(clock), config, run_id=run_id)
    steps = store.steps(run_id)
    assert [s["step"] for s in steps] == [s["step"] for s in learned] + [len(learned) + 1, 7]
    assert f"{len(learned) + 1} of 6 steps run" in resumed.progress.notes[0]
    rollouts = store.db["rollouts"].count
    run_id, config = resume_config(store, run_id, learn_minutes=10**6)
    _, again = await run(store, timed(clock), config, run_id=run_id)
    assert [s["step"] for s in store.steps(run_id)] == [s["step"] for s in steps]
    assert store.db["rollouts"].count == rollouts and again.library.id == resumed.library.id
    with pytest.raises(ValidationError, match="learn_minutes"):  # a limit is checked like the rest of the config
        resume_config(store, run_id, learn_minutes=-1)


async def test_validation_gate_rejects_a_worse_library(store, quickstart):
    class Worse(ScriptedBackend):
        """Answers get worse once any library is in the prompt."""

        async def generate(self, messages, n=1, **sampling):
            self.skill = 0.1 if "Experiences learned" in str(messages[0]["content"]) else 0.8
            return await super().generate(messages, n, **sampling)

    backend = Worse({p.problem: p.answer for p in quickstart})
    config = SMALL.model_copy(update={"epochs": 1, "val_dataset": "quickstart", "val_samples": 4})
    _, result = await run(store, backend, config)
    statuses = [v["status"] for v in store.versions(result.run_id)]
    assert statuses and set(statuses) == {"rejected"}
    assert result.library.items == ()
    assert "validate" in store.usage(result.run_id)
    # the run says why its library is empty although it had groups to learn from: the gate refused every candidate
    why = [n for n in result.progress.notes if n.startswith("nothing learned")]
    assert result.progress.groups_used and len(why) == 1
    assert f"; the validation gate refused {len(statuses)} candidate versions" in why[0]



@pytest.mark.parametrize("costs_one_problem", [True, False])
async def test_the_gate_keeps_a_candidate_only_if_it_scores_at_least_as_well_as_the_best(store, tmp_path,
                                                                                         costs_one_problem):
    """A library that costs one validation problem of 12 is worse by 1/12, inside the noise: the gate used to keep
    it (its interval reaches 0); now it is rejected. A library that changes nothing on validation is kept (a tie)."""
    problems = load_dataset("quickstart")
    val = problems[20:32]
    path = tmp_path / "val.jsonl"
    path.write_text("".join(json.dumps({"problem": p.problem, "answer": p.answer}) + "\n" for p in val))

    class CostsOne(ScriptedBackend):
        def skill_for(self, messages):
            problem = messages[-1]["content"]
            shown = "Experiences learned" in str(messages[0]["content"])
            if problem == val[0].problem and shown and costs_one_problem:
                return 0.0
            return 1.0 if problem in {p.problem for p in val} else 0.5

    config = SMALL.model_copy(update={"epochs": 1, "val_dataset": str(path), "val_samples": 2})
    _, result = await run(store, CostsOne({p.problem: p.answer for p in problems}), config)
    gated = [store.version_row(v["id"]) for v in store.versions(result.run_id) if v["status"] != "start"]
    assert gated, "a candidate reached the gate"
    for row in gated:
        evaluation = json.loads(row["evaluation"])
        if costs_one_problem:
            assert evaluation["diff"] == pytest.approx(-1 / 12) and evaluation["high"] >= 0  # inside the noise
            assert row["status"] == "rejected"
        else:
            assert evaluation["diff"] == 0 and row["status"] == "promoted"
    assert bool(result.library.items) is not costs_one_problem

def _outcome(store, run_id):
    run = store.run(run_id)
    library = store.version(run["current_version"])
    rollouts = sorted((r.problem_id, r.sample, r.completion, r.reward) for r in store.rollouts(run_id))
    return [(i.id, i.text, i.provenance.problem_ids) for i in library.items], rollouts


def _calls_by_stage(store, run_id):
    stages = {}
    for r in store.db["rollouts"].rows_where("run_id = ?", [run_id]):
        stage = "validate" if r["problem_id"].startswith("val/") else "solve"
        stages[stage] = stages.get(stage, 0) + 1
    for c in store.db["learner_calls"].rows_where("run_id = ?", [run_id]):
        stages[c["stage"]] = stages.get(c["stage"], 0) + 1
    return stages


def _verdicts(store, run_id):
    return [(s["step"], s["status"], s["stats"]["val_mean"]) for s in store.steps(run_id)]


@pytest.mark.parametrize("kill_after_rows", [3, 60, 200])
async def test_kill_9_of_a_gated_run_then_resume_matches_an_uninterrupted_run(tmp_path, kill_after_rows):
    """The gate's baseline and best scores survive a crash: no validation is paid twice, every verdict repeats."""
    clean_store = RunStore(tmp_path / "clean")
    clean = Optimizer(GATED, clean_store, scripted(gated=True))
    await clean.run()
    assert {s for _, s, _ in _verdicts(clean_store, clean.run_id)} >= {"promoted", "rejected"}

    crash_dir = tmp_path / "crash"
    child = subprocess.Popen([sys.executable, str(Path(__file__).parent / "crash_run.py"), str(crash_dir), "0.005",
                              "gated"], stdout=subprocess.PIPE, text=True)
    run_id = child.stdout.readline().strip()
    crash_store = RunStore(crash_dir)
    deadline = time.time() + 60
    while time.time() < deadline and child.poll() is None:
        if crash_store.db["rollouts"].count + crash_store.db["learner_calls"].count >= kill_after_rows:
            break
        time.sleep(0.005)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert len(crash_store.steps(run_id)) < 6, "the child finished before it was killed"
    before = _calls_by_stage(crash_store, run_id)

    run_id, config = resume_config(crash_store, run_id)
    backend = scripted(gated=True)
    result = await Optimizer(config, crash_store, backend, run_id=run_id).run()
    assert result.status == "finished"
    assert _verdicts(crash_store, run_id) == _verdicts(clean_store, clean.run_id)
    assert _outcome(crash_store, run_id) == _outcome(clean_store, clean.run_id)
    assert _calls_by_stage(crash_store, run_id) == _calls_by_stage(clean_store, clean.run_id)
    # what the resumed process paid is exactly what was missing: validation groups are the n=2 requests
    paid_val = sum(c["n"] for c in backend.calls if c["stage"] == "solve" and c["n"] == 2)
    assert paid_val == _calls_by_stage(clean_store, clean.run_id)["validate"] - before.get("validate", 0)


@pytest.mark.parametrize("kill_after_rows", [5, 40, 90])
async def test_kill_9_then_resume_matches_an_uninterrupted_run(tmp_path, kill_after_rows):
    clean_store = RunStore(tmp_path / "clean")
    clean = Optimizer(CONFIG, clean_store, scripted())
    await clean.run()

    crash_dir = tmp_path / "crash"
    child = subprocess.Popen([sys.executable, str(Path(__file__).parent / "crash_run.py"), str(crash_dir), "0.01"],
                             stdout=subprocess.PIPE, text=True)
    run_id = child.stdout.readline().strip()
    crash_store = RunStore(crash_dir)
    deadline = time.time() + 60
    while time.time() < deadline and child.poll() is None:
        rows = crash_store.db["rollouts"].count + crash_store.db["learner_calls"].count
        if rows >= kill_after_rows:
            break
        time.sleep(0.01)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    stored_before = {r["key"]: r["completion"] for r in crash_store.db["rollouts"].rows}
    assert len(crash_store.steps(run_id)) < 6, "the child finished before it was killed"

    run_id, config = resume_config(crash_store, run_id)
    backend = scripted()
    result = await Optimizer(config, crash_store, backend, run_id=run_id).run()
    assert result.status == "finished"
    # nothing stored before the crash was sampled again, nothing was lost or duplicated
    resampled = [c for c in backend.calls if c["stage"] == "solve"]
    assert len(resampled) == 12 * 2 - len({k.rsplit("/", 1)[0] for k in stored_before})
    assert crash_store.db["rollouts"].count == 12 * 4 * 2
    assert _outcome(crash_store, run_id) == _outcome(clean_store, clean.run_id)


async def test_judge_calls_are_stored_counted_and_never_paid_twice(tmp_path, quickstart):
    store = RunStore(tmp_path / "ws")
    config = SMALL.model_copy(update={"reward": "judge", "epochs": 1})
    backend = ScriptedBackend({p.problem: p.answer for p in quickstart})
    _, result = await run(store, backend, config)
    judged = [c for c in backend.calls if c["stage"] == "judge"]
    stored = list(store.db["learner_calls"].rows_where("stage = 'judge'"))
    # identical questions (same completion, same reference) are asked once; every call made is stored and counted
    assert len(judged) == len(stored) == len({s["subject"] for s in stored}) > 1
    assert store.usage(result.run_id)["judge"]["prompt"] == sum(c["prompt_tokens"] for c in judged)
    # the same run again (as a resume would) finds every verdict stored: no judge call is paid
    again = ScriptedBackend({p.problem: p.answer for p in quickstart})
    optimizer = Optimizer(config, store, again, run_id=result.run_id)
    answers = {p.id: p.answer for p in quickstart}
    for rollout in store.rollouts(result.run_id):
        await optimizer.reward([rollout.completion], answer=answers[rollout.problem_id])
    assert not [c for c in again.calls if c["stage"] == "judge"]


@pytest.mark.parametrize("lesson, refused", [
    # the 0.5B learner's lesson on letter_counting (AMD EPYC, 2026-11-25)
    ("Implement a strategy to solve the problem of counting the occurrences of the letter 'n' in the text 'the "
     "summer they have revolutionized'.", "the summer they have revolutionized"),
    ('Count the letters of "THE SUMMER they  have revolutionized" one by one.', "the summer they have revolutionized"),
    # the task's own vocabulary: a quoted letter, a short format, general advice
    ("Spell the text out letter by letter and count each 'n' you pass.", None),
    ("Write the answer in the form HH:MM.", None),
    ("Count the letter in each word, then add the counts: the summer is not the text.", None),
])
def test_a_lesson_is_refused_for_repeating_the_text_a_problem_quotes(lesson, refused):
    problem = Problem(id="p", problem='How many times does the letter "n" appear in the text: "the summer they have '
                                      'revolutionized"? Answer in the form "a whole number".', answer="1")
    broken = OpRules.of(LibraryVersion(), [problem]).broken_by([AddOp(op="add", text=lesson)])
    if refused:
        assert broken == (f'the lesson at operations.0 repeats the text the problem quotes ("{refused}"): state the '
                          "general rule, for any text")
    else:
        assert broken is None


_HAYSTACKS = [  # needle_haystack's form (reasoning-gym), seed 1206: facts about names, one question, one instruction
    "Phoevos is devoted to playing badminton. Maaz adores origami. Matthias prefers sketching. \nWho adores origami? "
    "Reply only with a name.",
    "Cohan disdains playing volleyball. Kayne is neutral toward augmented reality. Bradley resents grilled chicken. "
    "\nWho resents grilled chicken? Reply only with a name.",
    "Brayden revels in stir-fry. Ritchie adores sandwich. Dev rails against ironing clothes. \nWho adores sandwich? "
    "Reply only with a name."]


@pytest.mark.parametrize("lesson, refused", [
    # the 0.5B learner's lesson on needle_haystack (seed 1206, AMD EPYC, 2026-12-06): a fact of one haystack
    ("Phoevos is devoted to playing badminton.", "phoevos is devoted to playing badminton"),
    ("Remember: Phoevos is devoted to playing badminton.", "phoevos is devoted to playing badminton"),
    ("Maaz adores origami.", "maaz adores origami"),  # and "Jules ignores vlogging.", a step later
    # the family's template (in every problem of the batch) is its instruction, repeated: it passes
    ("Reply only with a name.", None),
    ("Reply only with a name: who adores origami?", None),  # the question's words stand in another haystack
    # advice that shares a few of the problem's words, and a short phrase of it, passes
    ("Find the sentence whose verb and object match the question's, and answer with its name.", None),
    ("Read every sentence: who adores origami is named before the verb.", None),
])
def test_a_lesson_that_restates_a_problem_is_refused(lesson, refused):
    problems = [Problem(id=f"p{n}", problem=text, answer="x") for n, text in enumerate(_HAYSTACKS)]
    rules = OpRules.of(LibraryVersion(), problems[:1], problems)
    broken = rules.broken_by([AddOp(op="add", text=lesson)])
    if refused:
        assert broken == (f'the lesson at operations.0 restates the problem ("{refused}"): state what to do, for any '
                          "problem of this kind")
    else:
        assert broken is None
    # learned from one problem alone, with no batch to tell the template by, its instruction is a restatement too
    alone = OpRules.of(LibraryVersion(), problems[:1]).broken_by([AddOp(op="add", text="Reply only with a name.")])
    assert alone and "restates the problem" in alone
    # a batch of two tells a problem's own words as well: the fact is refused, the instruction passes
    pair = OpRules.of(LibraryVersion(), problems[:1], problems[:2])
    assert (pair.broken_by([AddOp(op="add", text=lesson)]) is not None) is (refused is not None)


def test_general_advice_in_a_math_problem_s_own_words_is_not_a_restatement():
    """A mixed batch of arithmetic word problems: "Add the two numbers." is a run of the first problem's words, and
    a general rule; other problems speak of two numbers too, so it passes. A run of another problem's own words
    (its question about Tom's fruits) does not."""
    texts = ["Add the two numbers 23 and 19.", "What is the sum of two numbers, 7 and 8?",
             "Multiply the numbers 4 and 6.", "Tom has 5 apples and buys 3 pears. How many fruits has he?"]
    problems = [Problem(id=f"m{n}", problem=text, answer="1") for n, text in enumerate(texts)]
    rules = OpRules.of(LibraryVersion(), problems[:1], problems)
    assert rules.broken_by([AddOp(op="add", text="Add the two numbers.")]) is None
    fruit = OpRules.of(LibraryVersion(), problems[3:], problems)
    assert "restates the problem" in fruit.broken_by([AddOp(op="add", text="How many fruits has he?")])


@pytest.mark.parametrize("skill, says, shown", [
    (0.0, "answered none of its 64 training answers right", "groups 0 used 16 skipped (16 all wrong)"),
    (1.0, "answered all of its 64 training answers right", "groups 0 used 16 skipped (16 all right)")])
async def test_a_run_that_learned_nothing_says_why(store, skill, says, shown):
    """A family out of the model's reach (every answer wrong) or already solved (every answer right) leaves the
    library empty; the run says which, instead of ending on an empty library in silence, and its progress line
    shows why groups were skipped while it goes."""
    backend = ScriptedBackend({p.problem: p.answer for p in load_dataset("quickstart")}, skill=skill)
    _, result = await run(store, backend)
    assert result.library.items == () and result.progress.groups_used == 0
    why = [n for n in result.progress.notes if n.startswith("nothing learned")]
    assert len(why) == 1 and says in why[0]
    assert ("--worked-examples" in why[0]) is (skill == 0.0)  # what a user can try next (this run keeps none)
    assert shown in progress_line(result.progress)
    # resumed after its last step, the run counts from its stored steps, not from this process's empty counters
    run_id, config = resume_config(store, result.run_id)
    _, resumed = await run(store, backend, config, run_id=run_id)
    assert resumed.progress.rollouts == 0 and [n for n in resumed.progress.notes if n.startswith("nothing")] == why


async def test_a_run_stopped_by_its_token_budget_does_not_say_nothing_was_learned(store):
    """An empty library after a budget stop says only that the budget stopped it: the steps it never ran might
    have learned something."""
    backend = ScriptedBackend({p.problem: p.answer for p in load_dataset("quickstart")}, skill=0.5)
    _, result = await run(store, backend, SMALL.model_copy(update={"max_tokens": 1}))
    assert result.status == "budget" and result.library.items == ()
    assert result.progress.notes and not any(n.startswith("nothing learned") for n in result.progress.notes)


async def test_a_run_that_learned_something_gives_no_nothing_learned_note(store, scripted):
    _, result = await run(store, scripted)
    assert result.library.items and not any(n.startswith("nothing learned") for n in result.progress.notes)


def worked_answers_only(completions, answer, **_):
    """A reward that reads an answer right only after some working: a label alone (`\\boxed{7}`) scores 0."""
    return [float(c.startswith("Work ") and c.endswith(f"\\boxed{{{answer}}}")) for c in completions]


@pytest.mark.parametrize("policy", ["wrong", "right"])
async def test_a_reference_answer_alone_is_the_example_where_no_answer_of_the_model_is_fit_to_show(
        store, quickstart, policy):
    """`labeled_examples`: where the model answered a problem right in no showable way, the problem and its reference
    answer (no working) become the worked example; its provenance is the problem, nothing is sampled or stored for
    it. A model that solves its problems shows its own answers instead."""
    answers = {p.problem: p.answer for p in quickstart}
    model = ScriptedBackend(answers, skill=0.0 if policy == "wrong" else 1.0)
    config = SMALL.model_copy(update={"epochs": 1, "worked_examples": True, "labeled_examples": True})
    _, result = await run(store, model, config)
    examples = [i for i in result.library.items if i.kind == "example"]
    assert len(examples) == 8
    assert len(store.rollouts(result.run_id)) == 8 * 4  # the model's groups, and nothing else stored
    by_problem = {p.id: p for p in quickstart}
    for item in examples:
        [pid] = item.provenance.problem_ids
        problem, solution = example_parts(item.text)
        assert problem == by_problem[pid].problem.strip()
        [key] = item.provenance.rollout_ids
        assert reference_answer(key) == (policy == "wrong")
        if policy == "right":
            assert solution.startswith("Work ")
        else:
            assert key == f"{result.run_id}/{item.provenance.step}/reference/{pid}/0"  # no rollout stored under it
            assert solution == f"\\boxed{{{by_problem[pid].answer}}}"
    shown = {row[3] for row in zip(*(c.cells for c in library_table(result.library).columns))}
    assert all(("(its reference answer, no working)" in cell) == (policy == "wrong") for cell in shown)
    with sqlite3.connect(store.root / "gym-tf.db") as con:  # the studio counts no rollout behind a label, names its problem
        page = studio_queries.version(con, result.library.id)
        item = studio_queries.item(con, result.library.id, examples[0].id)
    assert {i["rollouts"] for i in page["items"]} == {0 if policy == "wrong" else 1}
    assert item["problems"] == [{"id": examples[0].provenance.problem_ids[0],
                                 "text": by_problem[examples[0].provenance.problem_ids[0]].problem.strip()}]


async def test_a_reference_answer_the_reward_does_not_read_back_as_right_is_not_shown(store, quickstart):
    """A label is graded by the run's own reward before it is shown, like any answer: one the grader scores below
    full marks (here, any answer without working) never becomes an example."""
    model = ScriptedBackend({p.problem: p.answer for p in quickstart}, skill=0.0)
    config = SMALL.model_copy(update={"epochs": 1, "worked_examples": True, "labeled_examples": True,
                                      "reward": "test_optimize:worked_answers_only"})
    _, result = await run(store, model, config)
    assert not [i for i in result.library.items if i.kind == "example"]
    # the run's note says the labels gave nothing and why, and does not offer them as the thing to try next
    [why] = [n for n in result.progress.notes if n.startswith("nothing learned")]
    assert "--labeled-examples gave no worked example: none of their answers was fit to show" in why
    assert "(--labeled-examples --examples-as-turns" not in why and "--hard-groups reference" in why
    # and with labels off, the same model keeps none either: the examples above came from the labels
    plain = SMALL.model_copy(update={"epochs": 1, "worked_examples": True})
    _, result = await run(store, ScriptedBackend({p.problem: p.answer for p in quickstart}, skill=0.0), plain)
    assert not [i for i in result.library.items if i.kind == "example"]
    [why] = [n for n in result.progress.notes if n.startswith("nothing learned")]
    assert "(--labeled-examples --examples-as-turns" in why and "gave no worked example" not in why


async def test_labeled_examples_the_gate_refused_are_named_in_the_note(store, quickstart, tmp_path):
    """A model that answers every training problem wrong, shown labels that cost it its validation problems: the
    gate refuses every candidate, and the note says the labels were given and refused, not that none was right."""
    val = quickstart[20:32]
    path = tmp_path / "val.jsonl"
    path.write_text("".join(json.dumps({"problem": p.problem, "answer": p.answer}) + "\n" for p in val))

    class LabelsHurt(ScriptedBackend):
        def skill_for(self, messages):
            if messages[-1]["content"] not in {p.problem for p in val}:
                return 0.0
            return 0.0 if "Worked examples" in str(messages[0]["content"]) else 1.0

    config = SMALL.model_copy(update={"epochs": 1, "worked_examples": True, "labeled_examples": True,
                                      "val_dataset": str(path), "val_samples": 2})
    _, result = await run(store, LabelsHurt({p.problem: p.answer for p in quickstart}), config)
    refused = [v for v in store.versions(result.run_id) if v["status"] == "rejected"]
    assert result.library.items == () and len(refused) == 2
    [why] = [n for n in result.progress.notes if n.startswith("nothing learned")]
    assert ("--labeled-examples gave worked examples (8 offered), and the validation gate refused the candidate "
            "versions that held them (2, below the best so far)") in why


@pytest.mark.parametrize("setting", ["labeled_examples", "examples_as_turns"])
def test_a_run_without_the_new_example_settings_keeps_its_config_hash(setting):
    from gym_tf.store import config_hash

    assert setting not in SMALL.recorded()
    on = SMALL.model_copy(update={setting: True})
    assert on.recorded()[setting] is True
    assert config_hash(on.recorded()) != config_hash(SMALL.recorded())


async def test_examples_as_turns_reach_every_version_and_the_prompts_the_model_is_sent(store, quickstart):
    """`examples_as_turns` is the run's render policy: every version it makes carries it, and the model is sent the
    examples it is shown as earlier turns of the chat (so eval and serve, which render by the version, send the same)."""
    answers = {p.problem: p.answer for p in quickstart}
    config = SMALL.model_copy(update={"epochs": 1, "worked_examples": True, "labeled_examples": True,
                                      "examples_as_turns": True})
    _, result = await run(store, ScriptedBackend(answers, skill=0.0), config)
    assert result.library.policy.examples_as_turns and len(result.library.items) >= 4
    second = store.rollouts(result.run_id, 2)  # asked with step 1's four labeled examples
    assert second and all(r.shown for r in second)
    for r in second:
        roles = [m["role"] for m in r.messages]
        assert roles == ["system", "user", "assistant", "user", "assistant", "user"]
        shown = {result.library.get(i).text for i in r.shown}
        assert {example_text(r.messages[n]["content"], r.messages[n + 1]["content"]) for n in (1, 3)} <= shown
        assert r.messages[2]["content"].startswith("\\boxed{")
