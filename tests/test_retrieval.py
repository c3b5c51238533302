from gym_tf.retrieval import rank

TEMPLATE = "State the final answer to the following arithmetic problem: {} ="


def test_length_normalization_ranks_a_template_family_shortest_first_and_b0_does_not():
    texts = [TEMPLATE.format(e) for e in ("5 - 1 + 4", "0 - 2", "427 + 633 - 277 + 625")]
    query = TEMPLATE.format("31 + 12 - 9")  # shares only the template's words with each of them
    assert rank(texts, query) == [1, 0, 2]  # the shortest problem wins: length is all that differs
    assert rank(texts, query, length_norm=False) == [2, 1, 0]  # equal scores: newest first
    assert rank(texts, query, length_norm=False, prior=[3.0, 1.0, 2.0]) == [0, 2, 1]  # equal scores: prior first


def test_a_shared_word_still_outranks_the_prior():
    texts = ["add 12 and 30", "add 7 and 9", "add 5 and 6"]
    assert rank(texts, "add 7 and 40", 1, length_norm=False, prior=[9.0, 0.0, 9.0]) == [1]


def test_texts_sharing_no_word_follow_by_prior_then_newest():
    texts = ["alpha beta", "gamma", "delta", "epsilon"]
    assert rank(texts, "alpha") == [0, 3, 2, 1]
    assert rank(texts, "alpha", prior=[0.0, 5.0, 0.0, 1.0]) == [0, 1, 3, 2]
    assert rank(texts, "alpha", 2, prior=[0.0, 5.0, 0.0, 1.0]) == [0, 1]
