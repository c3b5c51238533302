import asyncio
import logging
import threading
import time

import pytest

from gym_tf.datasets import Problem
from gym_tf.errors import RewardError
from gym_tf.rollouts import score
from rewards import (
    LLMJudge, RewardLoadError, choice_letter, exact_match, extract_answer, load_reward, majority_vote, math_reward,
    normalized_match, numeric_match, regex_match,
)
from gym_tf.backends import Choice, Generation


@pytest.mark.parametrize(
    "completion, gold, expected",
    [
        ("so the result is \\boxed{0.5}", "\\frac{1}{2}", 1.0),
        ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),
        ("\\boxed{1,000}", "1000", 1.0),
        ("\\boxed{3\\sqrt{2}}", "\\sqrt{18}", 1.0),
        ("\\boxed{336}", "336^\\circ", 1.0),
        ("\\boxed{\\frac{3}{10}}", "0.3", 1.0),
        ("\\boxed{7}", "6", 0.0),
        ("I do not know.", "6", 0.0),
        ("\\boxed{x^2+2x+1}", "(x+1)^2", 1.0),
    ],
)
def test_math_reward_equivalences(completion, gold, expected):
    assert math_reward([completion], answer=gold) == [expected]


PATHOLOGICAL = r"so \boxed{9^{9^{9^{9}}}}"  # sympy would build this power for ever (measured: > 40 s, no end)


async def test_math_reward_off_the_main_thread_does_not_hang_on_a_pathological_completion():
    # score() runs sync rewards in a worker thread, where math-verify's own signal timeouts cannot work
    start = time.perf_counter()
    scores = await asyncio.wait_for(score(math_reward, Problem("p", "x", "1"), [PATHOLOGICAL, r"\boxed{1}"]), 90)
    assert scores == [0.0, 1.0] and time.perf_counter() - start < 60


def test_math_reward_kills_a_check_past_its_limit_and_goes_on(caplog):
    with caplog.at_level(logging.WARNING, logger="rewards.math_answer"):
        scores = math_reward([PATHOLOGICAL, r"\boxed{1}", r"\boxed{2}"], answer="1", time_limit_s=1.0)
    assert scores == [None, 1.0, 0.0]
    assert "killed" in caplog.text and "9^{9^{9^{9}}}" in caplog.text


async def test_a_reward_past_its_time_limit_gives_no_signal_and_is_logged(caplog):
    release = threading.Event()

    def stuck_sync(completions, **_):
        release.wait(60)
        return [1.0] * len(completions)

    async def stuck_async(completions, **_):
        await asyncio.sleep(60)
        return [1.0] * len(completions)

    problem = Problem("p-7", "2+2?", "4")
    for reward in (stuck_sync, stuck_async):
        start = time.perf_counter()
        with caplog.at_level(logging.WARNING, logger="gym_tf.rollouts"):
            assert await score(reward, problem, ["4", "5"], time_limit_s=0.5) == [None, None]
        assert time.perf_counter() - start < 5
        assert f"reward {reward.__name__} timed out after 0.5 s on problem p-7" in caplog.text
    release.set()


async def test_a_reward_that_raises_is_a_reward_error_naming_it_and_the_problem():
    def broken(completions, **row):
        return [float(row["no_such_column"])] * len(completions)

    with pytest.raises(RewardError, match=r"reward 'broken' failed on problem p-3: KeyError: 'no_such_column'"):
        await score(broken, Problem("p-3", "x", "1"), ["1"])


def test_extract_answer_prefers_last_box_then_statement_then_number():
    assert extract_answer("\\boxed{1} then \\boxed{\\frac{2}{3}}") == "\\frac{2}{3}"
    assert extract_answer("We get 12 apples, so the answer is 14.") == "14"
    assert extract_answer("3 + 4 = 7") == "7"
    assert extract_answer("no digits here") is None


def test_exact_and_normalized_match():
    assert exact_match(["\\boxed{Paris}", "\\boxed{paris}"], answer="Paris") == [1.0, 0.0]
    assert normalized_match(["\\boxed{ paris. }", "\\boxed{\\text{Paris}}", "\\boxed{Rome}"], answer="Paris") == [1.0, 1.0, 0.0]
    assert normalized_match(["\\boxed{1,000}"], answer="1000") == [1.0]


def test_numeric_match_tolerance_and_fractions():
    assert numeric_match(["\\boxed{0.3333333}", "\\boxed{1/3}", "\\boxed{\\frac{1}{3}}", "\\boxed{0.34}"], answer="1/3",
                         rel_tol=1e-5) == [1.0, 1.0, 1.0, 0.0]
    assert numeric_match(["\\boxed{1,000}", "\\boxed{$1000$}"], answer="1000") == [1.0, 1.0]
    assert numeric_match(["\\boxed{5}"], answer="blue") == [None]


def test_regex_match_reads_pattern_column():
    assert regex_match(["The capital is Paris.", "It is Lyon"], pattern=r"\bparis\b") == [1.0, 0.0]


def test_choice_letter():
    completions = ["The answer is (B).", "\\boxed{C}", "I think A, no wait, the answer is D", "none"]
    assert choice_letter(completions, answer="D") == [0.0, 0.0, 1.0, 0.0]
    assert choice_letter(completions, answer="(B)") == [1.0, 0.0, 0.0, 0.0]


@pytest.mark.parametrize(
    "completion, chosen",
    [
        ("The answer is (B).\nI hope this helps.", "B"),  # "I" opens a line, it is not an option
        ("The answer is B.\nA) would double count; C) too.", "B"),  # lines discussing options are not choices
        ("The answer is a bit subtle.\nAfter all: \\boxed{D}", "D"),  # the article "a" is not option A
        ("\\boxed{C}\nBut the answer is A under the other reading.", "C"),  # a boxed letter beats a stated one
        ("Let me compare them.\n(C)\n", "C"),  # a letter alone on a line is a choice
        ("Answer: E", "E"),
        ("I cannot tell.", None),
    ],
)
def test_choice_letter_reads_only_stated_choices(completion, chosen):
    for letter in "ABCDEFGHIJ":
        assert choice_letter([completion], answer=letter) == [1.0 if letter == chosen else 0.0], letter


def test_majority_vote_pseudo_reward():
    completions = ["\\boxed{4}", "\\boxed{4.}", "\\boxed{5}", "no answer here"]
    assert majority_vote(completions) == [1.0, 1.0, 0.0, 0.0]
    assert majority_vote(["nothing", "nada"]) == [None, None]


class _Judge:
    def __init__(self, verdicts):
        self.verdicts = iter(verdicts)
        self.prompts = []

    async def generate(self, messages, n=1, **sampling):
        self.prompts.append(messages[0]["content"])
        return Generation([Choice(next(self.verdicts), "stop", 1)], 10, 1, 0.0)


async def test_llm_judge_maps_verdicts_and_shows_reference():
    judge = LLMJudge(_Judge(["CORRECT", "INCORRECT", "maybe"]))
    assert await judge(["a", "b", "c"], answer="42") == [1.0, 0.0, None]
    assert "Reference answer: 42" in judge.backend.prompts[0]


def test_load_reward_by_name_and_module_function():
    assert load_reward("math") is math_reward
    assert load_reward("rewards.text:exact_match") is exact_match
    with pytest.raises(RewardLoadError, match="unknown reward"):
        load_reward("nope")
    with pytest.raises(RewardLoadError, match="cannot import"):
        load_reward("no_such_module:f")
    with pytest.raises(RewardLoadError, match="needs a backend"):
        load_reward("judge")
