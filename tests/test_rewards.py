import pytest

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
