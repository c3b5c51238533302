"""Checks a solution's working, not only its final answer: the arithmetic it writes as `expression = value`.

The verifier reads a solution's final answer only, so a small model's right answer can rest on wrong working
("87 = 3^3 x 7", fraction_simplification; "9 - 0 = 9, 1 - 4 = 1", decimal_arithmetic). `gym-tf library show` names
the false equation of such a worked example (refusing them as examples was measured, and gained nothing: README).
`false_equation` finds the first equality between plain numbers and operators that does not hold. It judges only
what it can read for sure: a side cut out of words ("50% of 80", "Year 1"), next to a variable ("2x"), a unit, a
clock time or a symbol it does not compute ("√16"), a whole number followed by its remainder or its smaller unit
("3 R 2", "2 hours 30 minutes"), or a side too long to read, is skipped, never called false. Equations with a
variable are not followed from line to line ("81*t = 6829 + 56", then "81*t = 6875" passes).
"""

from __future__ import annotations

import ast
import math
import operator
import re

_LATEX = [(re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}"), r"((\1)/(\2))"),
          (re.compile(r"\\(?:times|cdot)"), "*"), (re.compile(r"\\div"), "/"),
          (re.compile(r"(?<=\d)(?:\\,|\{,\})(?=\d{3})"), ""),  # 1\,500
          (re.compile(r"\\(?:left|right)\b"), ""), (re.compile(r"\\[()\[\]]"), " ")]
_LIST_MARK = re.compile(r"^\s*(?:\(?\d+[.)]|[-*•])\s+")
_TIMES = re.compile(r"(?<=[\d)])\s*x\s*(?=[\d(])")  # "3 x 7": an x between numbers is a product
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_ARITHMETIC = frozenset("0123456789. +-*/÷^()")
_RIGHT = re.compile(r"[0-9. +\-*/÷^()]*")
_NOT_READ = frozenset("%\\_{}:'\"$,&|!")  # a side glued to one of these is part of something else
_OPERAND_WORD = re.compile(r"(?:\b(?:of|by|times|plus|minus|over|than|per|and|from|to|with|on|x|mod|sqrt|root|"
                           r"twice|double|triple|half)|%)\s*$", re.IGNORECASE)
_LEAD_WORD = re.compile(r"(?:^|\W)(?:is|are|was|were|be|so|then|thus|hence|therefore|get|gets|gives|now|as|since|"
                        r"because)\s*$", re.IGNORECASE)
_PART_OF_QUANTITY = re.compile(r"^\s*(?:r|rem|remainder|with|and|percent|rounded|round|approximately|about)\b",
                               re.IGNORECASE)
_FRACTION = re.compile(r"(?<![\d.)])(\d+/\d+)(?![\d.(])")
_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
              ast.Pow: operator.pow}
_LARGEST, MAX_SIDE = 1e15, 200


def false_equation(text: str) -> str | None:
    """The first `left = right` in `text` whose sides are plain arithmetic and differ, or None. A chain `a = b = c` is
    checked link by link; a link also holds when the right side starts with the left's value and goes on computing
    ("5 + 3 = 8 + 2 = 10", the running total small models write)."""
    for line in text.splitlines():
        parts = _plain(line).split("=")
        for left_text, right_text in zip(parts, parts[1:]):
            if any(mark in left_text[-1:] + right_text[:1] for mark in "<>!≈"):  # <=, >=, !=, ==, ≈=
                continue
            left, right = _left_side(left_text), _right_side(right_text)
            if left is None or right is None or not (_has_operator(left) or _has_operator(right)):
                continue  # "of 80 = 40": a lone number on both sides may be cut from words
            if not _holds(left, right):
                return f"{left} = {right}"
    return None


def _plain(line: str) -> str:
    for pattern, replacement in _LATEX:
        line = pattern.sub(replacement, line)
    line = _LIST_MARK.sub("", line.replace("$", " "))
    for dash in "−–—":
        line = line.replace(dash, "-")
    line = _TIMES.sub("*", _THOUSANDS.sub("", line))
    return line.replace("×", "*").replace("·", "*")


def _left_side(text: str) -> str | None:
    """The arithmetic that ends at an `=`, or None where it is cut out of something it cannot judge."""
    start = len(text)
    while start and text[start - 1] in _ARITHMETIC:  # a scan from the end: linear however long the line
        start -= 1
    side, outer = text[start:].strip(), text[:start]
    if not side or len(side) > MAX_SIDE or not (side[0].isdigit() or side[0] in "(."):
        return None  # "x - 3 = 4" leaves "- 3": the start of the expression is not in view
    if not text[start].isspace() and _unreadable(outer[-1:]):
        return None  # "2x + 3", "√16 + 2", "2:30"
    if _OPERAND_WORD.search(outer) or re.fullmatch(r"\d+-\d+", side):
        return None  # "50% of 80 =", "pages 1-5 ="
    if not _has_operator(side) and re.search(r"[A-Za-z]\s*$", outer) and not _LEAD_WORD.search(outer):
        return None  # "Year 1 = 100 + 10": a label
    return side


def _right_side(text: str) -> str | None:
    """The arithmetic that starts at an `=`, or None where it is part of something it cannot judge."""
    run = _RIGHT.match(text)
    side, rest = run.group().strip(), text[run.end():]
    if not side or len(side) > MAX_SIDE or not (side[0].isdigit() or side[0] in "(."):
        return None
    if (not run.group()[-1:].isspace() and _unreadable(rest[:1])) or rest.lstrip()[:1] in ("%", ":"):
        return None  # "= 3x", "= 15km", "= 10:00", "= 25 %"
    if not _has_operator(side) and (re.search(r"\d", rest) or _PART_OF_QUANTITY.match(rest)):
        return None  # "= 3 remainder 2", "= 2 hours 30 minutes", "= 3 and a half"
    return side


def _unreadable(neighbour: str) -> bool:
    return bool(neighbour) and (neighbour.isalnum() or not neighbour.isascii() or neighbour in _NOT_READ)


def _has_operator(side: str) -> bool:
    return bool(re.search(r"(?<=[\d).\s])[+\-*/÷^]", side))


def _holds(left: str, right: str) -> bool:
    """Whether some reading of each side agrees: as Python reads it, or with each unspaced `a/b` one fraction
    ("3 ÷ 1/4 = 12"); to the last decimal written, or within 1% where the left computes with decimals that may have
    been rounded ("33.33 * 3 = 100"); or as a running total."""
    rounded = 0.01 if re.search(r"\d\.\d", left) else 0.0
    lefts, rights = _readings(left), _readings(right)
    lead = re.match(r"[\d.]+", right)
    leads = _readings(lead.group()) if lead and _has_operator(right) else set()
    for a in lefts:
        if any(_close(a, b, right, rounded) or _close(b, a, left, rounded) for b in rights):
            return True
        if any(_close(a, b, "", 0.0) for b in leads):
            return True  # "5 + 3 = 8 + 2"
    return not (lefts and rights)  # a side it cannot compute is not judged


def _readings(side: str) -> set[float]:
    values = set()
    for text in {side, _FRACTION.sub(r"(\1)", side)}:
        value = _value(text)
        if value is not None:
            values.add(value)
    return values


def _value(side: str) -> float | None:
    try:
        tree = ast.parse(side.replace("÷", "/").replace("^", "**"), mode="eval")
        value = _evaluate(tree.body)
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError, TypeError, RecursionError, MemoryError):
        return None
    return value if math.isfinite(value) else None


def _evaluate(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return float(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _evaluate(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        a, b = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and (abs(b) > 64 or abs(a) > 1e6):
            raise ValueError("a power too large to judge")
        value = _OPERATORS[type(node.op)](a, b)
        if isinstance(value, complex) or abs(value) > _LARGEST:
            raise ValueError("out of range")
        return value
    raise ValueError("not plain arithmetic")


def _close(a: float, b: float, written: str, relative: float) -> bool:
    """Whether `a` equals `b` as `written` shows `b`: within one unit of its last decimal when it is one number with
    decimals ("2/3 = 0.666", truncated or rounded), else to `relative` (at least 1e-9)."""
    tolerance = max(1e-9, relative) * max(1.0, abs(a), abs(b))
    single = re.fullmatch(r"\s*\(?\s*-?\d*\.(\d+)\s*\)?\s*", written)
    if single:
        tolerance = max(tolerance, 10 ** -len(single.group(1)) + 1e-12)
    return abs(a - b) <= tolerance
