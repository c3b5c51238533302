"""Several libraries on the same problems and seeds: paired differences, the majority baseline, the cost."""

import hashlib
import json

import pytest

from fakes import ScriptedBackend
from gym_tf.compare import compare, plot
from gym_tf.config import OptimizeConfig
from gym_tf.datasets import load_dataset
from gym_tf.library import EMPTY_LIBRARY, EXAMPLES_HEADER, ExampleOp, apply_ops, with_policy
from gym_tf.optimize import Optimizer
from gym_tf.backends import Choice, Generation, Sampling
from gym_tf.datasets import Problem
from rewards import math_reward
from rewards.answers import last_boxed


class HelpedByExamples(ScriptedBackend):
    """Right 20% of the time, 90% when its prompt carries a worked example: a library that truly helps."""

    def skill_for(self, messages):
        return 0.9 if EXAMPLES_HEADER in str(messages[0]["content"]) else 0.2


async def test_a_library_that_helps_shows_a_paired_gain_beyond_noise_and_beats_the_vote(tmp_path):
    problems = load_dataset("quickstart")
    backend = HelpedByExamples({p.problem: p.answer for p in problems})
    library, _ = apply_ops(EMPTY_LIBRARY, [ExampleOp(op="example", text="Problem: 2+2?\nSolution: \\boxed{4}")], step=1)
    result = await compare(backend, problems, math_reward, 4, Sampling(), [("none", EMPTY_LIBRARY, 0),
                                                                         ("learned", library, 1234)], seed=1)
    none, learned = result.arms
    assert learned.vs_baseline.low > 0.4 and learned.mean_vs_baseline_majority.low > 0
    assert learned.majority_vs_baseline.value > 0
    assert learned.mean_vs_constant.low > 0  # quickstart's answers differ: one answer for all scores little
    # and the gain holds where the most common answer is wrong (the baseline has no such difference of its own)
    assert learned.vs_baseline_uncommon.low > 0.4 and none.vs_baseline_uncommon is None
    assert learned.full_credit_vs_baseline is None  # a grader that pays 1 or 0: the Mean@k gain says it all
    # its answers fit their own problems: given to other problems they earn little, and the gain stands beyond that
    assert learned.swapped_mean < 0.2 and learned.vs_baseline_beyond_swapped.low > 0.4
    assert result.extra_prompt_tokens(learned) > 0 == result.extra_prompt_tokens(none)
    # paired: both arms drew the same seeds for the same problems
    solves = [(c["problem"], c["seed"]) for c in backend.calls if c["stage"] == "solve"]
    assert len(solves) == 2 * len(problems) and set(solves[: len(problems)]) == set(solves[len(problems):])
    result.write(tmp_path / "c.json")
    data = json.loads((tmp_path / "c.json").read_text())
    assert data["arms"][1]["tokens"]["learning"] == 1234 and data["baseline"] == "none"
    plot(result, tmp_path / "c.png")
    assert (tmp_path / "c.png").stat().st_size > 1000


async def test_identical_draws_give_a_paired_difference_of_exactly_zero(tmp_path):
    problems = load_dataset("quickstart")
    backend = ScriptedBackend({p.problem: p.answer for p in problems}, skill=0.5)
    library, _ = apply_ops(EMPTY_LIBRARY, [ExampleOp(op="example", text="Problem: 2+2?\nSolution: \\boxed{4}")], step=1)
    result = await compare(backend, problems, math_reward, 4, Sampling(), [("none", EMPTY_LIBRARY, 0),
                                                                         ("learned", library, 0)], seed=1)
    learned = result.arms[1]
    # the fake's draws depend on (problem, seed) only: identical rewards, a difference of exactly 0
    assert learned.vs_baseline.value == learned.vs_baseline.low == learned.vs_baseline.high == 0


async def test_a_library_version_already_sampled_is_not_sampled_again_and_says_whose_samples_it_shares():
    from rich.console import Console

    from gym_tf.display import comparison_table

    problems = load_dataset("quickstart", limit=6)
    backend = ScriptedBackend({p.problem: p.answer for p in problems}, skill=0.5)
    library, _ = apply_ops(EMPTY_LIBRARY, [ExampleOp(op="example", text="Problem: 2+2?\nSolution: \\boxed{4}")], step=1)
    # a run whose gate kept nothing ends on the empty version: `learned` is `none` again; one that showed examples
    # as turns and kept nothing ends on an empty version of its own policy, which sends the same prompts
    as_turns = with_policy(EMPTY_LIBRARY, EMPTY_LIBRARY.policy.model_copy(update={"examples_as_turns": True}))
    assert as_turns.id != EMPTY_LIBRARY.id
    result = await compare(backend, problems, math_reward, 2, Sampling(), [("none", EMPTY_LIBRARY, 0),
                                                                         ("learned", EMPTY_LIBRARY, 900),
                                                                         ("other", library, 0),
                                                                         ("turns", as_turns, 0)], seed=1)
    solves = [c for c in backend.calls if c["stage"] == "solve"]
    assert len(solves) == 2 * len(problems)  # none and other, not learned nor turns
    none, learned, other, turns = result.arms
    assert learned.same_as == "none" and other.same_as is None and none.same_as is None
    assert turns.same_as == "none" and turns.report is none.report
    assert result.to_dict()["arms"][3]["library_version"] == as_turns.id  # its own version, not none's
    assert learned.vs_baseline.value == learned.vs_baseline.high == 0 and learned.learning_tokens == 900
    assert result.to_dict()["arms"][1]["same_as"] == "none"
    console = Console(record=True, width=100)
    console.print(comparison_table(result))
    assert "learned sends the same prompts as none: sampled once" in console.export_text()


async def test_rollouts_record_the_items_they_were_shown_and_examples_reach_the_prompt(store):
    problems = load_dataset("quickstart", limit=8)
    backend = ScriptedBackend({p.problem: p.answer for p in problems}, skill=0.6)
    config = OptimizeConfig(dataset="quickstart", limit=8, batch_size=4, group_size=4, epochs=2, seed=2)
    result = await Optimizer(config, store, backend).run()
    examples = [i for i in result.library.items if i.kind == "example"]
    assert examples and all(i.text.startswith("Problem: ") and "\\boxed{" in i.text for i in examples)
    second_epoch = [r for r in store.rollouts(result.run_id) if r.problem_id and r.shown]
    assert second_epoch, "later rollouts were shown library items"
    for rollout in second_epoch:
        system = rollout.messages[0]["content"]
        assert all(f"[{item_id}] " in system for item_id in rollout.shown)
    assert result.library.policy == config.render_policy()
    # a training problem is shown the examples of others, never its own (which it would copy)
    text = {p.id: p.problem.strip() for p in problems}
    own = {p.problem.strip(): i.id for i in examples for p in problems if i.text.startswith(f"Problem: {p.problem.strip()}\n")}
    assert len(own) == len(examples)
    later = [r for r in second_epoch if text[r.problem_id] in own]
    assert later, "a problem with an example of its own was asked again"
    assert all(own[text[r.problem_id]] not in r.shown and f"Problem: {text[r.problem_id]}\n" not in r.messages[0]["content"]
               for r in later)


async def test_problems_the_library_holds_verbatim_are_named_not_held_out(tmp_path):
    from rich.console import Console

    from gym_tf.display import comparison_table

    problems = load_dataset("quickstart", limit=6)
    copied = problems[2]
    texts = [f"Problem: {copied.problem}\nSolution: \\boxed{{{copied.answer}}}",
             f"Problem: {problems[3].problem} Then double it.\nSolution: \\boxed{{1}}",  # a longer problem: not it
             f"Problem: First, {problems[4].problem}\nSolution: \\boxed{{1}}"]  # ends with problem 4: not it
    library, _ = apply_ops(EMPTY_LIBRARY, [ExampleOp(op="example", text=t) for t in texts], step=1)
    backend = ScriptedBackend({p.problem: p.answer for p in problems}, skill=0.5)
    result = await compare(backend, problems, math_reward, 2, Sampling(), [("none", EMPTY_LIBRARY, 0),
                                                                         ("learned", library, 0)], seed=1)
    assert [a.held_in_library for a in result.arms] == [[], [copied.id]]
    assert result.to_dict()["arms"][1]["problems_held_in_library"] == [copied.id]
    console = Console(record=True, width=100)
    console.print(comparison_table(result))
    assert "not held out: learned holds 1 of these 6 problems verbatim" in console.export_text()


async def test_a_gate_on_training_problems_is_named_at_the_end_of_the_run(store, tmp_path):
    problems = load_dataset("quickstart", limit=8)
    same = tmp_path / "val.jsonl"
    same.write_text("".join(json.dumps({"problem": p.problem, "answer": p.answer}) + "\n" for p in problems))
    backend = ScriptedBackend({p.problem: p.answer for p in problems}, skill=0.6)
    config = OptimizeConfig(dataset="quickstart", limit=8, val_dataset=str(same), val_samples=2, batch_size=4,
                            group_size=4, epochs=1, seed=2)
    result = await Optimizer(config, store, backend).run()
    examples = [i for i in result.library.items if i.kind == "example"]
    assert examples  # each one is of a training problem, which is also a validation problem
    note = next(n for n in result.progress.notes if n.startswith("not held out"))
    assert f"holds worked examples of {len(examples)} of the 8 validation problems" in note
    assert len(store.run(result.run_id)["summary"]["val_held_in_library"]) == len(examples)


class AnswersTrueWhenShownExamples(ScriptedBackend):
    """Without a library it writes code until its tokens run out; with worked examples in its prompt it boxes True,
    whatever the problem: what isomorphic_strings' examples, all boxing True, taught the 0.5B."""

    def answer_shown(self, prompt: str) -> str:
        return "Work... so \\boxed{True}"

    async def generate(self, messages, n=1, **sampling):
        prompt = str(messages[0]["content"])
        shown = EXAMPLES_HEADER in prompt
        text = self.answer_shown(prompt) if shown else "def isomorphic(a, b):"
        self.calls.append({"stage": "solve"})
        return Generation([Choice(text, "stop" if shown else "length", 5)] * n, 10 * n, 5 * n, 0.0)


def exact(completions, answer, **_):
    return [float(last_boxed(c) == answer) for c in completions]


# True 6 times in 8
ISOMORPHIC = [Problem(f"p{i}", f"Are the strings of pair {i} isomorphic?", "False" if i in (2, 5) else "True")
              for i in range(8)]


async def test_a_gain_that_is_the_most_common_answer_given_to_every_problem_is_named_so():
    from rich.console import Console

    from gym_tf.display import comparison_table

    problems = ISOMORPHIC
    library, _ = apply_ops(EMPTY_LIBRARY, [ExampleOp(op="example", text="Problem: ab cd?\nSolution: \\boxed{True}")],
                           step=1)
    arms = [("none", EMPTY_LIBRARY, 0), ("learned", library, 900)]
    backend = AnswersTrueWhenShownExamples({})
    result = await compare(backend, problems, exact, 4, Sampling(), arms, seed=1)
    none, learned = result.arms
    assert learned.vs_baseline.value == 0.75 and learned.vs_baseline.low > 0  # a "gain" beyond noise
    assert (result.constant.answer, result.constant.mean) == ("True", 0.75)
    assert learned.mean_vs_constant.value == learned.mean_vs_constant.high == 0  # and nothing beyond True always
    # on the two problems whose answer is False, the library gained nothing: the "gain" was the answer True
    assert learned.vs_baseline_uncommon.value == learned.vs_baseline_uncommon.high == 0
    assert none.mean_vs_constant.value == -0.75
    # True given to other problems earns as much as on its own: no gain beyond answers given to other problems
    assert learned.swapped_mean > 0.6 and learned.vs_baseline_beyond_swapped.low < 0 < learned.vs_baseline.low
    data = result.to_dict()
    assert data["constant_answer"] == {"answer": "True", "mean": 0.75} and data["arms"][1]["mean_vs_constant"]["value"] == 0
    console = Console(record=True, width=100)
    console.print(comparison_table(result))
    text = console.export_text()
    assert "'True' always" in text and "every problem scores 0.750" in text and "where 'True' is wrong" in text
    assert data["arms"][1]["mean_vs_baseline_uncommon"] == {"value": 0.0, "low": 0.0, "high": 0.0}

    off = await compare(AnswersTrueWhenShownExamples({}), problems, exact, 4, Sampling(), arms, seed=1, constant=False)
    assert off.constant is None and off.arms[1].mean_vs_constant is off.arms[1].vs_baseline_uncommon is None
    assert off.to_dict()["constant_answer"] is None

    def picky(completions, answer, **_):  # grades the model's answers, raises on the constant's wording
        if any(c.startswith("The answer is") for c in completions):
            raise ValueError("unexpected wording")
        return exact(completions, answer)

    ungraded = await compare(AnswersTrueWhenShownExamples({}), problems, picky, 4, Sampling(), arms, seed=1)
    assert ungraded.constant is None and ungraded.arms[1].vs_baseline == learned.vs_baseline  # the comparison stands


async def test_a_reference_that_is_no_answer_is_not_given_to_every_problem():
    """A family whose problems have many right answers stores one sentence as every reference (task_levels'
    NO_SINGLE_ANSWER); boxed, its own grader gives it 0, so it is no most common answer to compare against."""
    from gym_tf.task_levels import NO_SINGLE_ANSWER

    def any_valid_path(completions, answer, **_):  # grades the answer's content, never the stored sentence
        return [float("a->b" in c) for c in completions]

    problems = [Problem(f"p{i}", f"Find a path in graph {i}", NO_SINGLE_ANSWER) for i in range(4)]
    arms = [("none", EMPTY_LIBRARY, 0)]
    result = await compare(AnswersTrueWhenShownExamples({}), problems, any_valid_path, 2, Sampling(), arms, seed=1)
    assert result.constant is None and result.to_dict()["constant_answer"] is None
    partial = await compare(AnswersTrueWhenShownExamples({}), problems, lambda completions, **_: [0.5] * len(completions), 2,
                            Sampling(), arms, seed=1)
    assert partial.constant.answer == NO_SINGLE_ANSWER  # a reward whose full marks are below 1 keeps its answer
    mixed = problems[:3] + [Problem("p3", "Find a path in graph 3", "a->b")]  # a real answer, even if less common
    assert (await compare(AnswersTrueWhenShownExamples({}), mixed, any_valid_path, 2, Sampling(), arms,
                          seed=1)).constant is None  # the sentence is still the most common: still not compared


class CopiesTheExample(AnswersTrueWhenShownExamples):
    """With a worked example in its prompt, it writes the example's solution again, whatever the problem (what the
    0.5B did on color_cube_rotation); without one, it writes code until its tokens run out."""

    def answer_shown(self, prompt: str) -> str:
        return prompt.split("Solution: ", 1)[1].split("\n")[0]


async def test_answers_that_copy_a_shown_example_are_counted_with_how_often_they_were_right():
    from rich.console import Console

    from gym_tf.display import comparison_table

    problems = ISOMORPHIC
    solution = "Each letter of the first maps to one letter of the second, so they are \\boxed{True}"
    library, _ = apply_ops(EMPTY_LIBRARY, [ExampleOp(op="example", text=f"Problem: ab cd?\nSolution: {solution}")],
                           step=1)
    result = await compare(CopiesTheExample({}), problems, exact, 4, Sampling(),
                           [("none", EMPTY_LIBRARY, 0), ("learned", library, 900)], seed=1)
    none, learned = result.arms
    assert none.copies is None  # shown no example: nothing to copy
    assert (learned.copies.copied, learned.copies.of, learned.copies.mean_reward) == (32, 32, 0.75)
    assert result.to_dict()["arms"][1]["copies"] == {"copied": 32, "of": 32, "share": 1.0, "mean_reward": 0.75}
    console = Console(record=True, width=110)
    console.print(comparison_table(result))
    assert "32 of 32 (100%, right 0.75)" in console.export_text()

    helped = await compare(HelpedByExamples({p.problem: p.answer for p in problems}), problems, exact, 4, Sampling(),
                           [("none", EMPTY_LIBRARY, 0), ("learned", library, 900)], seed=1)
    assert (helped.arms[1].copies.copied, helped.arms[1].copies.of) == (0, 32)  # its own working: no copy
    assert helped.arms[1].copies.mean_reward is None and "0 of 32 (0%)" in str(helped.arms[1].copies)


def test_an_answer_copies_an_example_when_most_of_its_words_repeat_the_solution():
    from gym_tf.library import copies_example

    solution = ("The front side is now the top. The right side is now the top. Since all rotations followed the "
                "same order, the colour of the front side is \\boxed{white}")
    assert copies_example(solution, [solution])
    assert copies_example(solution.replace("white", "red").replace("colour", "color"), ["other", solution])
    assert not copies_example("Rotate left to top: yellow is on top. Then bottom to top: the front is \\boxed{cyan}",
                              [solution])
    assert not copies_example(solution, []) and not copies_example(solution, [""])
    words = solution.split()  # near the threshold: 8 of 10 words kept is 0.89 alike, 6 of 10 is 0.75
    assert copies_example(" ".join(words[:len(words) * 8 // 10]), [solution])
    assert not copies_example(" ".join(words[:len(words) * 6 // 10]), [solution])
    assert not copies_example(" ".join([solution] * 20), [solution])  # a loop of it is no longer the same answer


async def test_a_reward_that_fails_on_answers_given_to_other_problems_leaves_the_comparison_standing():
    """Answers given to other problems are a measure beside the comparison: a reward that raises there (a grader
    that reads the problem's own entry, say) leaves them unmeasured (None), and every other figure as it was."""
    problems = load_dataset("quickstart")[:6]
    library, _ = apply_ops(EMPTY_LIBRARY, [ExampleOp(op="example", text="Problem: 2+2?\nSolution: \\boxed{4}")],
                           step=1)
    arms = [("none", EMPTY_LIBRARY, 0), ("learned", library, 900)]
    right = {p.problem: p.answer for p in problems}
    graded = []

    def own_only(completions, answer, problem, **_):  # raises on answers written for another problem
        graded.append(problem)
        if any(f"{hashlib.sha256(problem.encode()).hexdigest()[:4]} " not in c for c in completions):
            raise TypeError("an answer to another problem")
        return math_reward(completions, answer)

    result = await compare(HelpedByExamples(right), problems, own_only, 2, Sampling(), arms, seed=1)
    plain = await compare(HelpedByExamples(right), problems, math_reward, 2, Sampling(), arms, seed=1)
    learned = result.arms[1]
    assert learned.swapped_mean is None and learned.vs_baseline_beyond_swapped is None
    assert result.to_dict()["arms"][1]["mean_vs_baseline_beyond_swapped"] is None
    assert learned.vs_baseline == plain.arms[1].vs_baseline and plain.arms[1].vs_baseline_beyond_swapped is not None
    assert len(graded) > 2 * len(problems)  # it was tried, after every group had been graded on its own problem


def legal_move(completions, answer, **_):
    """tsumego's grader: 1 for the right point, 0.05 for any other point on the board, 0 for anything else."""
    moves = [last_boxed(c) for c in completions]
    return [1.0 if m == answer else 0.05 if m and m[0] in "ABCDEFGHJ" and m[1:].isdigit() else 0.0 for m in moves]


async def test_a_gain_in_partial_credit_alone_is_set_against_the_answers_paid_in_full():
    """Shown worked examples it answers A1 on every board, right on one of eight: the mean gains beyond noise on
    the grader's 0.05 for a legal move, while the answers paid in full gain 4 in 32 (one board), within noise."""
    from rich.console import Console

    from gym_tf.display import comparison_table

    problems = [Problem(f"b{i}", f"Board {i}: where should black play?", f"{'ABCDEFGH'[i]}{i + 1}") for i in range(8)]
    library, _ = apply_ops(EMPTY_LIBRARY, [ExampleOp(op="example", text="Problem: a board\nSolution: \\boxed{C3}")],
                           step=1)

    class AnswersA1WhenShownExamples(AnswersTrueWhenShownExamples):
        def answer_shown(self, prompt: str) -> str:
            return "Black plays \\boxed{A1}"

    arms = [("none", EMPTY_LIBRARY, 0), ("learned", library, 900)]
    result = await compare(AnswersA1WhenShownExamples({}), problems, legal_move, 4, Sampling(), arms, seed=1)
    none, learned = result.arms
    assert learned.vs_baseline.low > 0  # a "gain" beyond noise: 0.05 on seven boards, 1 on one
    assert learned.vs_baseline.value == (7 * 0.05 + 1) / 8
    assert learned.full_credit_vs_baseline.value == 1 / 8 and learned.full_credit_vs_baseline.low <= 0
    # A1 earns its 0.05 on any board, and 1 on board A1 whichever problem it was written for: given to other
    # problems the answers earn what they earned on their own, so nothing of the gain is fitted to its problem
    beyond = learned.vs_baseline_beyond_swapped
    assert learned.swapped_mean == pytest.approx(learned.report.metrics.mean_at_k.value)
    assert beyond.value == pytest.approx(0) and beyond.low < 0
    assert none.full_credit_vs_baseline is None
    assert result.to_dict()["arms"][1]["full_credit_vs_baseline"]["value"] == 1 / 8
    console = Console(record=True, width=120)
    console.print(comparison_table(result))
    assert "answers paid in full - none's" in console.export_text()


# two of the four state their own answer: a palindrome reads the same backward
WORDS = [Problem("w0", "Spell this word backward: eye", "eye"), Problem("w1", "Spell this word backward: cat", "tac"),
         Problem("w2", "Spell this word backward: pop", "pop"), Problem("w3", "Spell this word backward: dog", "god")]


class CopiesTheWordWhenShownExamples(ScriptedBackend):
    """With worked examples in its prompt it boxes the word it was given, without them nothing: right only on the
    palindromes, what examples of palindromes teach a small model."""

    async def generate(self, messages, n=1, **sampling):
        word = str(messages[-1]["content"]).rsplit(" ", 1)[-1]
        text = f"Reversed: \\boxed{{{word}}}" if EXAMPLES_HEADER in str(messages[0]["content"]) else "I do not know."
        self.calls.append({"stage": "solve"})
        return Generation([Choice(text, "stop", 5)] * n, 10 * n, 5 * n, 0.0)


async def test_a_gain_only_where_the_problem_states_its_answer_is_named_so():
    from rich.console import Console

    from gym_tf.display import comparison_table

    library, _ = apply_ops(EMPTY_LIBRARY, [ExampleOp(op="example", text="Problem: noon\nSolution: \\boxed{noon}")],
                           step=1)
    arms = [("none", EMPTY_LIBRARY, 0), ("learned", library, 900)]
    result = await compare(CopiesTheWordWhenShownExamples({}), WORDS, exact, 2, Sampling(), arms, seed=1)
    none, learned = result.arms
    assert learned.vs_baseline.value == 0.5  # right on both palindromes, as the library was not before
    # on the two words that are not palindromes it gained nothing: the "gain" was copying the question
    assert learned.vs_baseline_unstated.value == learned.vs_baseline_unstated.high == 0
    assert none.vs_baseline_unstated is None
    assert result.to_dict()["arms"][1]["mean_vs_baseline_unstated"] == {"value": 0.0, "low": 0.0, "high": 0.0}
    console = Console(record=True, width=120)
    console.print(comparison_table(result))
    assert "where the problem does not state its answer" in console.export_text()
    # where every problem states its answer (options named in the question) or none does, there is no such subset
    for problems in (WORDS[::2], WORDS[1::2]):
        alike = await compare(CopiesTheWordWhenShownExamples({}), problems, exact, 2, Sampling(), arms, seed=1)
        assert alike.arms[1].vs_baseline_unstated is None


async def test_stored_groups_are_not_sampled_again_and_a_group_of_another_size_is():
    """`stored` (a stopped comparison's groups, by version): the problems it holds a whole group for are not sampled,
    the others are, and the report is the one an uninterrupted comparison makes (the draws depend on the seed and
    the problem only). A group of another size (another -k) is sampled again."""
    problems = load_dataset("quickstart", limit=6)
    gold = {p.problem: p.answer for p in problems}
    arms = [("none", EMPTY_LIBRARY, 0)]
    whole = await compare(ScriptedBackend(gold), problems, math_reward, 2, Sampling(), arms, seed=1)
    groups = whole.arms[0].report.rollouts
    stored = {pid: groups[pid] for pid in [p.id for p in problems][:3]}
    stored[problems[3].id] = groups[problems[3].id][:1]  # cut short: sampled again
    backend = ScriptedBackend(gold)
    again = await compare(backend, problems, math_reward, 2, Sampling(), arms, seed=1,
                          stored={EMPTY_LIBRARY.id: stored})
    assert sum(c["stage"] == "solve" for c in backend.calls) == 3
    def answers(report):  # the draws, without their latencies (which differ)
        return {pid: [(r.completion, r.reward) for r in group] for pid, group in report.rollouts.items()}

    assert answers(again.arms[0].report) == answers(whole.arms[0].report)
    assert again.arms[0].report.metrics == whole.arms[0].report.metrics
