import numpy as np

from gym_tf.metrics import bootstrap, compute_metrics, majority_score, paired_difference


def test_mean_pass_and_majority():
    groups = [
        (["\\boxed{1}", "\\boxed{1}", "\\boxed{2}"], [1.0, 1.0, 0.0]),  # majority right
        (["\\boxed{3}", "\\boxed{4}", "\\boxed{4}"], [1.0, 0.0, 0.0]),  # majority wrong, pass
        (["\\boxed{5}", "\\boxed{6}", "x"], [0.0, 0.0, None]),          # all wrong
    ]
    m = compute_metrics(groups)
    assert m.problems == 3 and m.samples == 3
    assert np.isclose(m.mean_at_k.value, (2 / 3 + 1 / 3 + 0) / 3)
    assert np.isclose(m.pass_at_k.value, 2 / 3)
    assert np.isclose(m.majority.value, 1 / 3)
    for estimate in (m.mean_at_k, m.pass_at_k, m.majority):
        assert estimate.low <= estimate.value <= estimate.high


def test_majority_score_without_answers_is_zero():
    assert majority_score(["no", "answers"], [1.0, 1.0]) == 0.0


def test_bootstrap_interval_narrows_with_more_problems():
    rng = np.random.default_rng(1)
    small = bootstrap(rng.integers(0, 2, 10).astype(float))
    large = bootstrap(rng.integers(0, 2, 1000).astype(float))
    assert (large.high - large.low) < (small.high - small.low)
    constant = bootstrap(np.ones(20))
    assert constant.low == constant.high == 1.0


def test_paired_difference_detects_a_real_drop():
    baseline = [1.0] * 20
    assert paired_difference([0.0] * 20, baseline).high < 0
    assert paired_difference([1.0] * 19 + [0.0], baseline).high == 0.0


def test_majority_groups_answers_the_verifier_calls_equal_and_scores_ties_fairly():
    # 1/2 and 0.5 are both scored correct by the verifier: one answer with two votes, not two with one each
    assert majority_score(["\\boxed{1/2}", "\\boxed{0.5}", "\\boxed{3}"], [1.0, 1.0, 0.0]) == 1.0
    # wrong answers that are the same number in other forms vote together too
    assert majority_score(["\\boxed{3}", "\\boxed{3.0}", "\\boxed{\\frac{1}{2}}"], [0.0, 0.0, 1.0]) == 0.0
    # a tie favours no sample order: the expected score of a fair pick
    assert majority_score(["\\boxed{3}", "\\boxed{4}"], [0.0, 1.0]) == 0.5
    assert majority_score(["\\boxed{4}", "\\boxed{3}"], [1.0, 0.0]) == 0.5
