"""`false_equation`: the arithmetic a solution writes is checked, and only what can be read for sure is judged."""

import pytest

from gym_tf.display import library_table
from gym_tf.library import EMPTY_LIBRARY, ExampleOp, apply_ops
from gym_tf.working import false_equation

# the 0.5B's right answers on fraction_simplification (benchmark seed 11) whose working was false
FALSE = [
    ("\\[ 87 = 3^3 \\times 7 \\]", "87 = 3^3 * 7"),
    ("1. Divide the numerator 59 by 19:\n   \\[\n   59 \\div 19 = 3\n   \\]", "59 / 19 = 3"),
    ("The prime factorization of 51 is \\(51 = 3 \\times 13\\)", "51 = 3 * 13"),
    ("\\[ \\frac{6}{12} \\div 6 = \\frac{6 \\div 6}{12 \\div 6} = \\frac{1}{2} \\]",
     "((6)/(12)) / 6 = ((6 / 6)/(12 / 6))"),
    ("Step 1: 9 - 0 = 9, 1 - 4 = 1", "1 - 4 = 1"),  # decimal_arithmetic's learner example
    ("Then 5 + 3 = 9", "5 + 3 = 9"),
    ("So 12 * 4 = 46 apples", "12 * 4 = 46"),
    ("4.5 - 1.25 = 3.35", "4.5 - 1.25 = 3.35"),
    ("1/3 = 0.35", "1/3 = 0.35"),
    ("100 / 7 = 15", "100 / 7 = 15"),
    ("x = 3 + 4 = 8", "3 + 4 = 8"),
    ("\\frac{87}{264} = \\frac{29}{87}", "((87)/(264)) = ((29)/(87))"),
]

TRUE_OR_UNREADABLE = [
    "264 = 2^3 \\times 3 \\times 11", "\\frac{87 \\div 3}{264 \\div 3} = \\frac{29}{88}", "$3 \\cdot 4 = 12$",
    "5 + 3 = 8 + 2 = 10",  # a running total: the right side starts with the left's value
    "(2 + 3) * 4 = 20", "7 ÷ 2 = 3.5", "1,000 + 2 = 1,002", "10 - -3 = 13", "−3 + 5 = 2", "3 x 7 = 21",
    "1/3 = 0.333",  # equal to the decimals written
    "The total is 6 * 7 = 42.",
    # not judged: a side cut out of words, next to a variable or a unit, a comparison, too large to compute
    "50% of 80 = 0.5 * 80 = 40", "half of 80 + 5 = 45", "2x + 3 = 7", "x - 3 = 4", "3 * 4 = 12x", "a <= 3 + 4",
    "3 + 4 == 7", "2^100 = 5", "9**9**9 = 1", "5 * 3 = 15km", "The answer is \\boxed{29/88}", "",
    # right working a small model writes, each once called false by an earlier version (a review's cases)
    "The time is 2:30 = 2 * 60 + 30 = 150 minutes", "8:00 + 2 = 10:00", "The ratio 2:3 = 2/3", "6:9 = 6/3 : 9/3 = 2:3",
    "17 ÷ 5 = 3 remainder 2", "48 ÷ 18 = 2 R 12", "150 / 60 = 2 hours 30 minutes", "7 / 2 = 3 and a half",
    "\\( 17 \\div 5 = 3 \\) with remainder \\( 2 \\)", "1/4 = 25 %", "1/2 = 50 percent",
    "π × 5^2 = 3.14 × 25 = 78.5", "Area = ½ × 6 × 4 = 12", "12 eggs × 3 - 6 = 30", "5 apples x 3 + 2 = 17",
    "√16 + 2 = 6", "√(9 + 16) = 5", "sqrt 16 + 2 = 6", "10 – 3 + 2 = 9", "10 mod 3 + 1 = 2", "twice 5 + 3 = 13",
    "3 ÷ 1/4 = 3 × 4 = 12", "3/4 ÷ 1/2 = 3/4 × 2/1 = 3/2", "3/4 \\div 1/2 = 3/4 \\times 2 = 3/2", "2/3 = 0.666",
    "33.33 * 3 = 100", "6.67 × 3 = 20", "1000 * 1.05^3 = 1158", "Year 1 = 100 + 10 = 110",
    "Tip on $40 = 0.15 × $40 = $6", "Pages 1-5 = 5 pages", "The years 1990-2000 = 10 years", "1. -3 + 5 = 2",
    "(1) -3 + 4 = 1", "1\\,500 + 500 = 2000", "\\dfrac{1}{2} + \\dfrac{1}{4} = \\dfrac{3}{4}",
]


@pytest.mark.parametrize("text, found", FALSE)
def test_false_arithmetic_is_found_and_named(text, found):
    assert false_equation(text) == found


@pytest.mark.parametrize("text", TRUE_OR_UNREADABLE)
def test_true_or_unreadable_arithmetic_is_never_called_false(text):
    assert false_equation(text) is None


@pytest.mark.parametrize("text", ["1" + "-" * 10000 + "1 = 3", "1/3 = 0." + "3" * 20000 + " so x = 1",
                                  "1 " * 50000 + "a = 1 + 1", "(" * 100000 + "1 = 2"])
def test_hostile_working_is_read_quickly_and_never_raises(text):
    assert false_equation(text) is None


def test_every_line_is_read_and_the_first_false_one_named():
    assert false_equation("2 + 2 = 4\n6 * 7 = 42\n8 - 5 = 2\n1 + 1 = 3") == "8 - 5 = 2"


def test_library_show_names_an_example_whose_working_is_false():
    texts = ["Problem: Simplify 87/264.\nSolution: \\[ 87 = 3^3 \\times 7 \\] so \\boxed{\\frac{29}{88}}",
             "Problem: Simplify 6/12.\nSolution: 6 = 2 \\times 3 and 12 = 2 \\times 6, so \\boxed{\\frac{1}{2}}",
             "Problem: Solve 3x + 5 = 21.\nSolution: 21 - 5 = 16, 16 / 3 = 5.33, so \\boxed{5.33}"]
    library, _ = apply_ops(EMPTY_LIBRARY, [ExampleOp(op="example", text=t) for t in texts], step=1)
    origins = [cell for column in library_table(library).columns if column.header == "from" for cell in column.cells]
    assert [origin.endswith("; its working is false: 87 = 3^3 * 7") for origin in origins] == [True, False, False]
