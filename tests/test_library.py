import json

import pytest
from pydantic import ValidationError

from gym_tf.datasets import Problem
from gym_tf.library import (
    EMPTY_LIBRARY, EXAMPLES_HEADER, LIBRARY_HEADER, MAX_EXAMPLE_CHARS, AddOp, DeleteOp, ExampleOp, MergeOp, NoneOp,
    OpAdapter, OpsReply, Provenance, RenderPolicy, UpdateOp, answer_in_problem, apply_ops, ops_schema, render_library,
    select_items, example_text, library_messages, with_library, with_policy,
)
from gym_tf.rollouts import build_messages


def add(text):
    return AddOp(op="add", text=text)


def test_ids_are_stable_and_never_reused():
    v1, _ = apply_ops(EMPTY_LIBRARY, [add("First lesson here."), add("Second lesson here.")], step=1)
    v2, _ = apply_ops(v1, [DeleteOp(op="delete", id="E1"), add("Third lesson here.")], step=2)
    assert [i.id for i in v1.items] == ["E1", "E2"]
    assert [i.id for i in v2.items] == ["E2", "E3"]  # E1 is gone for good; E2 keeps its id
    assert v2.parent == v1.id and v1.parent == EMPTY_LIBRARY.id


def test_versions_are_immutable_values_with_content_ids():
    v1, _ = apply_ops(EMPTY_LIBRARY, [add("First lesson here.")], step=1)
    again, _ = apply_ops(EMPTY_LIBRARY, [add("First lesson here.")], step=1)
    assert v1.id == again.id and v1.id.startswith("bafkrei")  # CIDv1, raw codec, sha2-256
    v2, _ = apply_ops(v1, [UpdateOp(op="update", id="E1", text="Better first lesson.")], step=2)
    assert v1.items[0].text == "First lesson here." and v2.items[0].text == "Better first lesson."
    with pytest.raises(ValidationError):
        v1.items[0].text = "mutated"


def test_unknown_ids_and_duplicates_are_rejected_with_reasons():
    v1, _ = apply_ops(EMPTY_LIBRARY, [add("First lesson here.")], step=1)
    ops = [UpdateOp(op="update", id="E9", text="Does not exist."), DeleteOp(op="delete", id="E7"),
           MergeOp(op="merge", ids=("E1", "E5"), text="Merged lesson text."), add("first  LESSON here."),
           add("A genuinely new lesson.")]
    v2, verdicts = apply_ops(v1, ops, step=2)
    assert [(v.accepted, v.reason) for v in verdicts] == [
        (False, "unknown id E9"), (False, "unknown id E7"), (False, "unknown id E5"),
        (False, "duplicates an existing item"), (True, ""),
    ]
    assert [i.text for i in v2.items] == ["First lesson here.", "A genuinely new lesson."]


def test_a_numbered_copy_of_a_lesson_is_the_same_lesson():
    # The gcd benchmark run (seed 7): the learner added "1. <rule>" and updated E1, which already held the rule, to
    # "2. <rule>"; both were accepted, and the library held the same lesson twice.
    rule = "The greatest common divisor of two numbers also divides their difference."
    v1, _ = apply_ops(EMPTY_LIBRARY, [add(rule)], step=3)
    ops = [add(f"1. {rule}"), UpdateOp(op="update", id="E1", text=f"2. {rule[:-1]}"),
           add("- Check the remainder twice.")]
    v2, verdicts = apply_ops(v1, ops, step=4)
    assert [(v.accepted, v.reason) for v in verdicts] == [
        (False, "duplicates an existing item"), (False, "changes nothing in E1"), (True, "")]
    assert [i.text for i in v2.items] == [rule, "Check the remainder twice."]  # the marker is no part of the advice
    assert UpdateOp(op="update", id="E1", text="1.5 times the rule holds here.").text.startswith("1.5 times")
    # JSON reads "\frac" as a form feed and "r": restored to LaTeX first, then the marker goes, not the "\f"
    assert add("1. \x0crac{a}{b} is a fraction in lowest terms.").text == "\\frac{a}{b} is a fraction in lowest terms."
    # a lesson stored with its marker, before the marker was dropped, is still the same lesson
    stored = v1.model_copy(update={"items": (v1.items[0].model_copy(update={"text": f"2. {rule}"}),)})
    _, verdicts = apply_ops(stored, [add(rule)], step=5)
    assert [(v.accepted, v.reason) for v in verdicts] == [(False, "duplicates an existing item")]


def test_merge_keeps_the_oldest_id_and_provenance_is_recorded():
    v1, _ = apply_ops(EMPTY_LIBRARY, [add("Lesson number one."), add("Lesson number two."), add("Lesson number three.")], 1)
    origin = Provenance(step=0, op="", problem_ids=("p1",), rollout_ids=("r/1", "r/2"))
    v2, verdicts = apply_ops(v1, [MergeOp(op="merge", ids=("E3", "E1"), text="One and three together.")], 2, {0: origin})
    assert verdicts[0].accepted
    assert [i.id for i in v2.items] == ["E1", "E2"]
    merged = v2.get("E1")
    assert merged.text == "One and three together."
    assert merged.provenance == Provenance(step=2, op="merge", problem_ids=("p1",), rollout_ids=("r/1", "r/2"))


def test_op_schema_is_strict():
    assert isinstance(OpAdapter.validate_python({"op": "none"}), NoneOp)
    for bad in [{"op": "add"}, {"op": "add", "text": "short"}, {"op": "update", "text": "No id given here."},
                {"op": "merge", "ids": ["E1"], "text": "Only one id to merge."}, {"op": "rename", "id": "E1"},
                {"op": "add", "text": "Fine text here.", "extra": 1}]:
        with pytest.raises(ValidationError):
            OpAdapter.validate_python(bad)


def test_a_lesson_is_advice_in_words_not_one_problems_result():
    for result in ["8 + 32 = 40", "x = 3, y = 4 so 7", "-381 - 662 = -1043"]:
        with pytest.raises(ValidationError, match="general rule"):
            OpAdapter.validate_python({"op": "add", "text": result})
        with pytest.raises(ValidationError, match="general rule"):
            OpAdapter.validate_python({"op": "update", "id": "E1", "text": result})
    for advice in ["Check units.", "a^2 + b^2 = c^2 for right triangles", "先检查单位再回答问题"]:  # any script
        assert OpAdapter.validate_python({"op": "add", "text": advice}).text == advice


LIBRARY, ATTEMPTS, ECHO = ("not an instruction about the library", "no attempts and no reference answer",
                           "not the instructions copied back")
STORY = "not a story of what one attempt did"
LOOP = "caught in a loop"


@pytest.mark.parametrize("text, refusal", [
    ("Add a lesson on solving muffins and counting what was sold.", LIBRARY),  # the 0.5B learner, main command
    ("Create a new experience about checking units before answering.", LIBRARY),
    ("Please update the library with a rule about fractions.", LIBRARY),
    ("Add a general strategy for solving problems involving multiplication and addition.", LIBRARY),  # basic_arithmetic
    ("Create a new rule for carrying digits.", LIBRARY),
    ("Add 10 to the result of the previous attempt (attempt 2).", ATTEMPTS),  # the 0.5B learner, decimal_chain_sum
    ("10 to the result of the previous attempt (attempt 2)", ATTEMPTS),  # its second try
    ("Attempt 3 forgot the carry: carry the tens.", ATTEMPTS),
    ("As in attempt #1, write each partial sum.", ATTEMPTS),
    ("Unlike the other attempts, it checked the sign.", ATTEMPTS),
    ("Summarize the reference answer and attempts (summaries, with grades).", ATTEMPTS),  # the 0.5B learner, coin_flip
    ("Check the result against the reference answer.", ATTEMPTS),
    # the 0.5B learner in the README's main command (its apples kept out: the numbers rule is not under test here)
    ("Summarize the attempt for a teacher, in at most 5 short lines: the approach, the key steps, which listed "
     "experiences it used (by id) if any, and where it went wrong if it did. The number he has now is <a new lesson>.",
     ECHO),
    ("Summarize the attempt for a teacher, in at most five lines.", ECHO),  # a run of six words, no blank
    ("Subtract first, then the result is <a new lesson>.", ECHO),  # a blank left unfilled
    # the 0.5B learner on coin_flip at two epochs (2026-11-26): a retry's error and the field it named, written back
    ("State the advice itself at operations.0.add.text", ECHO),
    ("Count the heads; see operations.1.update.text for more.", ECHO),
    ("Operations.0.add.text is where advice goes now.", ECHO),
    ("Check the lesson at operations.0 before you answer it.", ECHO),  # an error at a whole op names no field
    ("Follow the order of operations. 2 rules: multiply, then add.", None),
    # the 0.5B learner on decimal_chain_sum seed 64 (2026-11-29): the too-short message, written back as a lesson
    ("Add 10 letters of advice", ECHO),
    ("Add 10 letters of advice: state a general rule.", ECHO),
    ("State the advice itself: add the numbers left to right.", None),  # a message's words, and advice of its own
    ("Count the letters of each word one at a time.", None),  # near the message's words, not three in a row
    # the 0.5B learner on syllogism at two epochs (2026-11-26), kept until then; and on coin_flip, a paraphrase
    ("Propose a lesson on the concept of the concept of the concept.", LIBRARY),
    ("Provide a general strategy to help on other problems too.", LIBRARY),
    ("Give a new tip about syllogisms.", LIBRARY),
    ("Give the answer as a fraction in lowest terms.", None),  # advice that starts with one of those verbs
    ("Provide units with every length you compute.", None),
    # the 0.5B learner on chain_sum (stop 31): the extract prompt's own sentence, refused by how it starts, and
    # without its first words by the words it copies
    ("Propose at most 2 operations on the library. A lesson is a general strategy that would help on OTHER problems.",
     LIBRARY),
    ("At most 2 operations on the library. A lesson is a general strategy that would help on OTHER problems.", ECHO),
    # the 0.5B learner in the README's main command on a 2-core AMD EPYC (2026-11-25), kept as a lesson until then
    ("1.0: The model attempted to determine how many muffins are left after the baker sells three quarters of them. "
     "The key steps were to calculate three quarters of the total number of muffins and subtract the number of "
     "muffins sold from the total number of muffins to find out how many muffins are left. The experience the model "
     "was given was \\boxed{none}", STORY),  # its first 370 characters (whole, it is refused as too long)
    ("The model correctly computed each partial sum before adding.", STORY),
    ("The key steps were to align the decimal points and add.", STORY),
    ("Experiences it was given: none. Align the decimal points.", STORY),
    ("Add a running total after each step.", None),
    ("Reason step by step and box the final answer.", None),  # near the solve prompt, but in its own words
    ("Write a short check of each step before the answer.", None),
    ("Add the numbers first as a general rule.", None),
    ("Add the two smallest numbers first, then the rest.", None),
    ("Keep every intermediate result written down.", None),
    ("Remove common factors before multiplying fractions.", None),
    ("Apply the lesson of the units: convert before adding.", None),
    ("If the first attempt at a factorization fails, try grouping terms.", None),
    ("If your previous attempt at factoring failed, try grouping terms.", None),
    ("Make one attempt at estimating before computing exactly.", None),
    ("Measure each angle from its reference angle first.", None),
    ("Say what the model of the problem is: rates, then times.", None),  # "model" not narrating an attempt
    ("Write down the key steps, then compute each one.", None),
    # advice that merely names a model, an attempt or key steps (a reviewer's cases)
    ("If the attempt at factoring failed, try grouping terms.", None),
    ("If the model car was built at 1:50 scale, multiply each length by 50.", None),
    ("Name the model used (rate x time) before computing.", None),
    ("Check whether the solver found every case before summing.", None),
    ("Recheck any count where key steps were skipped.", None),
    # a reply caught in a loop, as the syllogism lesson went on to the 400-character cap
    ("Think about the concept of the concept of the concept of the concept of the premises.", LOOP),
    ("Count the number of legs, the number of heads, then the number of animals.", None),  # "the number of": 3 words
    ("Check all of the premises, all of the premises, and all of the premises again.", None),  # a run of 4, 3 times
])
def test_a_lesson_is_advice_to_the_solver_not_about_the_library_the_attempts_or_our_prompts(text, refusal):
    if refusal:
        with pytest.raises(ValidationError, match=refusal):
            OpAdapter.validate_python({"op": "add", "text": text})
    else:
        assert OpAdapter.validate_python({"op": "add", "text": text}).text == text


def test_latex_that_json_read_as_escapes_reaches_the_solver_as_written():
    """LaTeX in a learner's JSON: "\\boxed", "\\frac" and "\\times" are valid JSON escapes (backspace, form feed,
    tab), so a plain JSON reader hands the solver "<BS>oxed"; a lesson gets back the backslashes the learner wrote."""
    written = r"Write \frac{a}{b} in lowest terms, then \boxed{} the \times result."
    reply = '{"operations": [{"op": "add", "text": "' + written + '"}]}'  # one backslash each, as a learner writes
    assert json.loads(reply)["operations"][0]["text"] != written  # what JSON alone makes of it
    (op,) = OpsReply.model_validate_json(reply).operations
    assert op.text == written
    # a line break stays one
    (op,) = OpsReply.model_validate_json(r'{"operations": [{"op": "add", "text": "Check units.\nThen add."}]}').operations
    assert op.text == "Check units.\nThen add."
    # too long once read as written (the 0.5B learner's reply in the main command on the AMD EPYC): said in characters
    with pytest.raises(ValidationError, match="a lesson is at most 400 characters, this one 401"):
        OpsReply.model_validate_json('{"operations": [{"op": "add", "text": "' + "a" * 395 + r' \frac"}]}')


def test_a_full_budget_still_lets_a_new_lesson_in():
    """Once the cap is reached, the newest lessons go in and the oldest make room: a new item always changes the
    rendered text, so the gate compares two different prompts (it used to see the same text and pass untested)."""
    policy = RenderPolicy(max_tokens=40)
    v1, _ = apply_ops(with_policy(EMPTY_LIBRARY, policy), [add(f"Lesson {n} says something useful.") for n in range(1, 6)], step=1)
    full = render_library(with_policy(v1, RenderPolicy(max_tokens=None)))
    assert full.splitlines()[0] == LIBRARY_HEADER and full.splitlines()[1] == "[E1] Lesson 1 says something useful."
    capped = render_library(v1).splitlines()[1:]
    assert 0 < len(capped) < 5 and capped[-1] == "[E5] Lesson 5 says something useful."
    v2, _ = apply_ops(v1, [add("Lesson 6 is the newest one.")], step=2)
    assert v2.policy == policy and "[E6] Lesson 6" in render_library(v2) and render_library(v2) != render_library(v1)
    assert render_library(EMPTY_LIBRARY) == ""


def example(text):
    return ExampleOp(op="example", text=text)


def test_the_longest_worked_example_is_shown_alone_within_the_default_budget():
    """A worked example as long as one may be still fits the default render budget with its header and id, even at a
    four-digit id: an example kept is one that can be shown. One character past the bound is refused as an item."""
    longest = "Problem: " + "x" * (MAX_EXAMPLE_CHARS - 29) + "\nSolution: \\boxed{5}"
    assert len(longest) == MAX_EXAMPLE_CHARS
    lib, _ = apply_ops(EMPTY_LIBRARY, [example(longest)], step=1)
    big_id = lib.model_copy(update={"items": (lib.items[0].model_copy(update={"id": "E9999"}),)})
    for version in (lib, big_id):
        assert version.policy.max_tokens == 1024 and select_items(version, "x") == version.items
        assert longest in render_library(version, "x")
    with pytest.raises(ValidationError):
        example(longest + "y")


def test_worked_examples_are_retrieved_per_problem_deterministically():
    lib, _ = apply_ops(EMPTY_LIBRARY, [add("Check the units before answering."),
                                      example("Problem: How many legs do 3 spiders have?\nSolution: 3*8=24. \\boxed{24}"),
                                      example("Problem: Sort 3, 1, 2 ascending.\nSolution: 1, 2, 3. \\boxed{1, 2, 3}"),
                                      example("Problem: What is the GCD of 12 and 18?\nSolution: 6. \\boxed{6}")], step=1)
    lib = with_policy(lib, RenderPolicy(examples=1))
    assert [i.kind for i in lib.items] == ["lesson", "example", "example", "example"]
    legs = select_items(lib, "How many legs do 5 spiders and 2 ants have?")
    assert [i.id for i in legs] == ["E1", "E2"]  # every lesson, and the one most relevant example
    assert [i.id for i in select_items(lib, "Find the GCD of 40 and 64.")] == ["E1", "E4"]
    assert select_items(lib, "How many legs do 5 spiders and 2 ants have?") == legs
    text = render_library(lib, "Find the GCD of 40 and 64.")
    assert text.index(LIBRARY_HEADER) < text.index(EXAMPLES_HEADER) < text.index("[E4]")


def test_in_a_template_family_the_examples_shown_are_those_with_the_most_steps_not_the_shortest():
    def solved(expression, steps):
        return example(f"Problem: Calculate {expression}.\nSolution: " + "\n".join(f"step {i}" for i in range(steps))
                       + "\n\\boxed{0}")
    lib, _ = apply_ops(EMPTY_LIBRARY, [solved("1 + 2 + 3 + 4", 4), solved("0 - 2", 1), solved("5 * 6 - 7", 3),
                                      solved("8 / 1", 1)], step=1)
    assert [i.id for i in select_items(lib, "Calculate 31 + 12 - 9 + 40.")] == ["E1", "E3"]
    assert [i.id for i in select_items(lib, None)] == ["E1", "E3"]
    # a problem sharing a number with the request still comes first: relevance, then steps
    assert [i.id for i in select_items(lib, "Calculate 8 + 15 + 22.")] == ["E1", "E4"]


def test_examples_are_matched_on_their_problem_not_their_solution():
    lib, _ = apply_ops(EMPTY_LIBRARY, [
        example("Problem: How many legs do 3 spiders have?\nSolution: 3 * 8 = 24.\n\\boxed{24}"),
        example("Problem: Sort 9, 4, 7 in ascending order.\nSolution: Not how many legs 6 spiders have: how do the "
                "numbers compare?\nSo 4, 7, 9.\n\\boxed{4, 7, 9}")], step=1)
    lib = with_policy(lib, RenderPolicy(examples=1))
    assert [i.id for i in select_items(lib, "How many legs do 6 spiders have?")] == ["E1"]
    assert [i.id for i in select_items(lib, "Sort 3, 8, 1 in ascending order.")] == ["E2"]


def test_retrieved_lessons_are_the_most_relevant():
    lib, _ = apply_ops(EMPTY_LIBRARY, [add("For sorting, compare numbers digit by digit."),
                                      add("For animal legs, multiply count by legs per animal."),
                                      add("For fractions, divide by the greatest common divisor.")], step=1)
    lib = with_policy(lib, RenderPolicy(lessons=1))
    assert [i.id for i in select_items(lib, "Count the legs of 4 animals")] == ["E2"]


def test_the_learner_cannot_rewrite_a_worked_example_and_kinds_keep_old_ids():
    lib, _ = apply_ops(EMPTY_LIBRARY, [example("Problem: 1+1?\nSolution: \\boxed{2}")], step=1)
    same, verdicts = apply_ops(lib, [UpdateOp(op="update", id="E1", text="A lesson that replaces it.")], step=2)
    assert same is lib and "worked example" in verdicts[0].reason
    lesson_only, _ = apply_ops(EMPTY_LIBRARY, [add("First lesson here.")], step=1)
    assert "kind" not in lesson_only.model_dump(mode="json")["items"][0] and "policy" not in lesson_only.model_dump()
    assert with_policy(lesson_only, RenderPolicy(max_tokens=64)).id != lesson_only.id


def test_with_library_merges_into_the_system_message_first():
    text = "LIB"
    assert with_library([{"role": "user", "content": "q"}], text) == [
        {"role": "system", "content": "LIB"}, {"role": "user", "content": "q"}]
    merged = with_library([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "q"}], text)
    assert merged[0] == {"role": "system", "content": "LIB\n\nBe brief."} and len(merged) == 2
    parts = with_library([{"role": "system", "content": [{"type": "text", "text": "x"}]}], text)
    assert parts[0]["content"][0] == {"type": "text", "text": "LIB\n\n"}
    original = [{"role": "system", "content": "Be brief."}]
    with_library(original, text)
    assert original == [{"role": "system", "content": "Be brief."}]


@pytest.mark.parametrize("ids, reply, valid", [
    ((), {"operations": [{"op": "add", "text": "Write each step on its own line."}]}, True),
    ((), {"operations": [{"op": "update", "id": "attempt2", "text": "Write each step on its own line."}]}, False),
    (("E1",), {"operations": [{"op": "update", "id": "E1", "text": "Write each step on its own line."}]}, True),
    (("E1",), {"operations": [{"op": "delete", "id": "E2"}]}, False),
    (("E1",), {"operations": [{"op": "merge", "ids": ["E1", "E1"], "text": "Write each step on its own line."}]},
     False),
    (("E1", "E3"), {"operations": [{"op": "merge", "ids": ["E1", "E3"], "text": "Write each step on its own line."}]},
     True),
    (("E1", "E3"), {"operations": [{"op": "merge", "ids": ["E1", "E9"], "text": "Write each step on its own line."}]},
     False),
])
def test_ops_schema_offers_only_the_librarys_ids(ids, reply, valid):
    """What a grammar built from the schema lets a learner write: no update or delete on a library without lessons,
    no merge below two, and only ids that exist."""
    import jsonschema

    schema = ops_schema(2, ids)
    if valid:
        jsonschema.validate(reply, schema)
    else:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(reply, schema)


def test_a_library_made_before_a_content_rule_still_imports(tmp_path):
    """The lesson rules judge new ops; a stored version is checked for the shape ops give it, so a library learned
    before a rule existed (this lesson was kept on decimal_chain_sum) still imports, publishes and is followed."""
    from gym_tf.library import LibraryVersion
    from gym_tf.library_io import export_library, read_library_file

    lesson = "Add 10 to the result of the previous attempt (attempt 2)."
    old = LibraryVersion.model_validate({"items": [{"id": "E1", "text": lesson, "provenance": {"step": 1, "op": "add"}}],
                                         "next_number": 2, "step": 1})
    export_library(old, tmp_path / "old.json")
    assert read_library_file(tmp_path / "old.json").items == old.items


@pytest.mark.parametrize("problem, answer, stated", [
    ("Spell this word backward (example: sun -> nus): eye", "eye", True),
    ("Spell this word backward (example: sun -> nus): Bob", "boB", True),  # whatever its case
    ("Spell this word backward (example: sun -> nus): cat", "tac", False),
    ("Find the GCD of these numbers: 990, 330.", "330", True),
    ("What is the next term: 9, 4, 2, 1, 0, 0, 0, ?", "0", True),
    ("Simplify the fraction $\\dfrac{9}{16}$ to its lowest terms.", "$\\dfrac{9}{16}$", True),
    ("Calculate -2 - -4.", "2", False),  # a sign belongs to its number
    ("What is 12 * 10?", "120", False),  # nor is 120 read inside 12 or 12 inside 120
    ("What is 12 * 10?", "12", True),
    ("Compute 0.55 + 0.", "0.5", False),
    ("Let x = 12.5; round x down.", "12", False),
    ("Anything at all.", "", False),
    ("Anything at all.", None, False),
])
def test_an_answer_stated_in_its_own_problem(problem, answer, stated):
    assert answer_in_problem(problem, answer) is stated


def _with_examples(turns: bool):
    library, _ = apply_ops(EMPTY_LIBRARY, [AddOp(op="add", text="Count the islands before you answer."),
                                           ExampleOp(op="example", text=example_text("Grid A: 1 1 / 0 1", "\\boxed{3}")),
                                           ExampleOp(op="example", text=example_text("Grid B: 0 0 / 0 1", "\\boxed{1}"))],
                           step=1)
    return with_policy(library, RenderPolicy(examples_as_turns=turns))


def test_examples_as_turns_are_earlier_chat_turns_and_lessons_stay_in_the_system_message():
    library = _with_examples(turns=True)
    asked = [{"role": "system", "content": "Solve it."}, {"role": "user", "content": "Grid C: 1 0 / 0 1"}]
    sent, shown = library_messages(library, asked)
    assert shown == ("E1", "E2", "E3")
    assert sent[0] == {"role": "system", "content": f"{LIBRARY_HEADER}\n[E1] Count the islands before you answer."
                                                    "\n\nSolve it."}
    assert sent[1:] == [{"role": "user", "content": "Grid A: 1 1 / 0 1"}, {"role": "assistant", "content": "\\boxed{3}"},
                        {"role": "user", "content": "Grid B: 0 0 / 0 1"}, {"role": "assistant", "content": "\\boxed{1}"},
                        asked[1]]
    assert "Grid A" not in sent[0]["content"]
    assert library.messages(asked) == sent  # an app's own call sends what optimize and eval send
    # without a system message, the turns still come first, and a conversation keeps its own order after them
    talk = [{"role": "user", "content": "Grid D"}, {"role": "assistant", "content": "2"}, {"role": "user", "content": "Why?"}]
    sent = library_messages(library, talk)[0]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "user", "assistant", "user", "assistant", "user"]
    assert sent[-3:] == talk


@pytest.mark.parametrize("turns", [False, True])
def test_a_problem_asked_without_its_own_example_is_shown_the_others(turns):
    library = _with_examples(turns)
    asked = [{"role": "user", "content": " Grid A: 1 1 / 0 1 "}]
    assert library_messages(library, asked)[1] == ("E1", "E2", "E3")  # as serve and eval ask it
    sent, shown = library_messages(library, asked, leave_out=" Grid A: 1 1 / 0 1")  # as optimize asks it, training
    assert shown == ("E1", "E3")
    assert sum("Grid A" in m["content"] for m in sent) == 1 and "Grid B" in "".join(m["content"] for m in sent)
    other = [{"role": "user", "content": "Grid C: 1 0 / 0 1"}]
    assert library_messages(library, other, leave_out="Grid A: 1 1 / 0 1")[1] == ("E1", "E3")
    # a training problem that is a conversation is matched by its problem text, not its last message
    talk = Problem("t", "user: Grid A: 1 1 / 0 1\n\nassistant: 3?\n\nuser: Sure?", None,
                   {"messages": [{"role": "user", "content": "Grid A: 1 1 / 0 1"}, {"role": "assistant", "content": "3?"},
                                 {"role": "user", "content": "Sure?"}]})
    held, _ = apply_ops(library, [ExampleOp(op="example", text=example_text(talk.problem, "\\boxed{3}"))], step=2)
    held = with_policy(held, RenderPolicy(examples=3, examples_as_turns=turns))
    assert build_messages(talk, held)[1] == ("E1", "E2", "E3", "E4")
    assert build_messages(talk, held, own_example=False)[1] == ("E1", "E2", "E3")


@pytest.mark.parametrize("asked", [
    [],                                                                        # nothing asked
    [{"role": "system", "content": "Be brief."}],                              # instructions, no question
    [{"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Grid C"}],  # the assistant opens
])
def test_a_request_that_does_not_open_with_the_user_gets_the_examples_as_system_text(asked):
    """Turns go only before a user's message: otherwise the request would end on an example's answer, or hold two
    assistant turns in a row (which strict chat templates refuse)."""
    turns, text = _with_examples(turns=True), _with_examples(turns=False)
    sent, shown = library_messages(turns, asked)
    assert (sent, shown) == library_messages(text, asked)
    assert [m["role"] for m in sent] == ["system", *(m["role"] for m in asked if m["role"] != "system")]
    assert "Grid A" in sent[0]["content"]


def test_an_example_not_in_problem_and_solution_form_stays_system_text():
    odd, _ = apply_ops(_with_examples(turns=True), [ExampleOp(op="example", text="Grid E has two islands: 2.")], step=2)
    library = with_policy(odd, RenderPolicy(examples=3, examples_as_turns=True))
    sent, shown = library_messages(library, [{"role": "user", "content": "Grid E"}])
    assert set(shown) == {"E1", "E2", "E3", "E4"}
    assert "[E4] Grid E has two islands: 2." in sent[0]["content"] and "Grid A" not in sent[0]["content"]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert all(m["content"] for m in sent)


def test_examples_as_text_render_as_before_and_keep_the_version_id():
    text, turns = _with_examples(turns=False), _with_examples(turns=True)
    assert text.id != turns.id
    # the field is left out where it is off, also beside other policy settings: a version made before it existed
    # has the same bytes, so the same id
    wider = with_policy(text, RenderPolicy(max_tokens=2048)).canonical_bytes().decode()
    assert '"max_tokens":2048' in wider.replace(" ", "") and "examples_as_turns" not in wider
    assert turns.model_dump(mode="json")["policy"]["examples_as_turns"] is True
    asked = [{"role": "user", "content": "Grid C"}]
    assert library_messages(text, asked)[0] == with_library(asked, render_library(text, "Grid C"))
