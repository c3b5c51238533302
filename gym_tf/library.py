"""The experience library: immutable versions of stable-id items, the typed ops that change them, and the renderer.

A version is a value. `apply_ops(version, ops, ...)` returns a new version plus a verdict for every op; the old
version is untouched. Item ids (`E1`, `E2`, ...) are handed out once and never renumbered or reused.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from collections import Counter
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Annotated, Any, Iterable, Literal, Union

from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, TypeAdapter, field_validator,
                      model_serializer)

from gym_tf.chat import request_text
from gym_tf.prompts import copied_from_prompts
from gym_tf.retrieval import rank
from ledger.cid import canonical, cid

MAX_EXPERIENCE_CHARS = 400
# A worked example: the problem and a verified solution. At most what the default library budget (1024 estimated
# tokens, 4 bytes a token) shows alone, with its header and id: a task family whose statements are long keeps its
# examples (at 1,600, string_splitting's 1,565-character problems left a label, `\boxed{0 1 0 3 0 3}`, 3 over).
MAX_EXAMPLE_CHARS = 4000

MIN_LESSON_LETTERS = 10


# "Add a lesson on solving muffins and ..." (the 0.5B learner, in the README's main command) and "Add a general
# strategy for solving problems involving multiplication and addition. ..." (the same, on basic_arithmetic):
# instructions to whoever keeps the library, which the solver reads as noise; so is "Propose a lesson on the concept
# of ..." (the 0.5B learner on syllogism, 2026-11-26) and "Provide a general strategy to help on other problems too."
# (on coin_flip). A heuristic: it reads only how the text starts.
_ABOUT_THE_LIBRARY = re.compile(
    r"^\W*(?:please\s+)?(?:add|create|write|include|insert|record|store|keep|remove|delete|update|merge|propose|"
    r"suggest|provide|give|formulate|generate)\b"
    r"(?:[^.]{0,40}?\b(?:lessons?|experiences?|library)\b"
    r"|\s+(?:a|an|one|another|new)\s+(?:\w+\s+){0,2}(?:strategy|strategies|rule|tip|insight|item|entry)\b)",
    re.IGNORECASE)

# "Add 10 to the result of the previous attempt (attempt 2)." (the 0.5B learner on decimal_chain_sum, kept through the
# prune step by noise): the learner's prompt numbers its attempts, a solver facing a new problem has none. Nor has it
# a reference answer: "Summarize the reference answer and attempts (summaries, with grades)." (the 0.5B learner on
# coin_flip, from the labels of its prompt, no six words of them in a row) was kept as a lesson.
_ABOUT_THE_GRADING = re.compile(
    r"\battempts?\s*#?\s*\d|\b(?:the|that|those)\s+(?:previous|earlier|other|second|third|successful|failed|correct|wrong|"
    r"right)\s+attempts?\b|\bthat\s+attempt\b|\breference\s+answers?\b", re.IGNORECASE)


# "1.0: The model attempted to determine how many muffins are left ... The key steps were to calculate three quarters
# ... The experience the model was given was \boxed{none}" (the 0.5B learner in the README's main command, on a 2-core
# AMD EPYC, 2026-11-25): a summary of one attempt, in the shape the summarize stage writes, kept as a lesson. A
# solver reads a story about another answer, not advice. A heuristic, kept to the summary's own forms: "the model"
# followed at once by a verb of attempting, a grade or "was given" ("the model car was built to scale", "the model
# used (rate x time)" and "if the attempt failed, ..." are advice), "the key steps were to", "experiences it was given".
_NARRATES_AN_ATTEMPT = re.compile(
    r"\bthe\s+model\s+(?:attempted|tried|(?:was|were)\s+given|correctly|incorrectly|failed\s+to)\b"
    r"|\bthe\s+key\s+steps\s+were\s+to\b|\bexperiences?\s+(?:the\s+model|it)\s+(?:was|were)\s+given\b", re.IGNORECASE)


# "Propose a lesson on the concept of the concept of the concept of ..." to the 400-character cap (the 0.5B learner on
# syllogism, 2026-11-26, kept by the prune step: 0.83 with it, 0.75 without, on 6 validation problems x 2 samples):
# a reply caught in a loop.
# Advice may say "the number of" twice; a run of four words said four times is a loop.
REPEATS_IN_A_LOOP = 4


def _repeats_itself(text: str) -> bool:
    words = re.findall(r"\w+", text.lower())
    runs = Counter(tuple(words[i:i + 4]) for i in range(len(words) - 3))
    return bool(runs) and max(runs.values()) >= REPEATS_IN_A_LOOP


# What a rejected lesson's retry tells the learner (gym_tf/learner.py sends the message back with the prompt).
_TOO_SHORT = (f"a lesson needs at least {MIN_LESSON_LETTERS} letters of advice: state a general rule, not one problem's "
              "result")
_IN_A_LOOP = "a lesson that says the same words over and over is a reply caught in a loop: state the advice once"
_TO_THE_LIBRARY = "a lesson is advice to the solver, not an instruction about the library: write the advice itself"
_TO_THE_GRADING = ("a lesson is read with a new problem, where there are no attempts and no reference answer to refer "
                   "to: state the advice itself")
_A_STORY = ("a lesson is advice to the solver, not a story of what one attempt did: state the rule the attempt shows, "
            "in the imperative")
_ECHOED = "a lesson is advice in your own words, not the instructions copied back"
_RETRY_MESSAGES = (_TOO_SHORT, _IN_A_LOOP, _TO_THE_LIBRARY, _TO_THE_GRADING, _A_STORY, _ECHOED)

# "Add 10 letters of advice" (the 0.5B learner on decimal_chain_sum seed 64, 2026-11-29, on a 2-core Zen 5 EPYC): the
# too-short message above, echoed back in a retry's reply and kept as a lesson. Three words in a row of a retry's
# message are not the learner's own, so a lesson's letters are counted without them: "Add" is 3.
ECHO_OF_A_RETRY = 3


@lru_cache(maxsize=1)
def _retry_runs() -> frozenset[tuple[str, ...]]:
    runs = set()
    for message in _RETRY_MESSAGES:
        words = re.findall(r"\w+", message.lower())
        runs.update(tuple(words[i:i + ECHO_OF_A_RETRY]) for i in range(len(words) - ECHO_OF_A_RETRY + 1))
    return frozenset(runs)


def _own_letters(text: str) -> int:
    """Letters of `text` outside any run of `ECHO_OF_A_RETRY` words taken from a retry's message."""
    words = re.findall(r"\w+", text.lower())
    echoed = set()
    for i in range(len(words) - ECHO_OF_A_RETRY + 1):
        if tuple(words[i:i + ECHO_OF_A_RETRY]) in _retry_runs():
            echoed.update(range(i, i + ECHO_OF_A_RETRY))
    return sum(c.isalpha() for i, word in enumerate(words) if i not in echoed for c in word)


def _says_something(text: str) -> str:
    """A lesson is advice in words: "8 + 32 = 40" is one problem's arithmetic, not a lesson (a 0.5B learner wrote
    exactly that into a learned library). Letters are counted, not words, so scripts without spaces pass. Nor is
    an instruction about the library itself ("Add a lesson on ..."), nor a note about the compared attempts, nor a
    summary of one attempt, nor our own prompt or a retry's message echoed back."""
    if sum(c.isalpha() for c in text) < MIN_LESSON_LETTERS:
        raise ValueError(_TOO_SHORT)
    if _repeats_itself(text):
        raise ValueError(_IN_A_LOOP)
    if _ABOUT_THE_LIBRARY.match(text):
        raise ValueError(_TO_THE_LIBRARY)
    if _ABOUT_THE_GRADING.search(text):
        raise ValueError(_TO_THE_GRADING)
    if _NARRATES_AN_ATTEMPT.search(text):
        raise ValueError(_A_STORY)
    copied = copied_from_prompts(text)
    if copied:
        raise ValueError(f'{_ECHOED} ("{copied}"): write the advice itself')
    if _own_letters(text) < MIN_LESSON_LETTERS:
        raise ValueError(f"{_ECHOED}: a lesson's {MIN_LESSON_LETTERS} letters of advice are its own, not the words of "
                         "this check's message")
    return text


# A learner writing LaTeX inside a JSON string writes "\boxed" and "\frac", which JSON reads as a backspace and a form
# feed: the main command's lesson above reached the solver as "<BS>oxed{none}". No lesson holds such a character, so
# each is read back as the backslash and letter the learner wrote; a tab or carriage return right before a letter
# ("\times", "\right") likewise. A newline is left alone: "\n" before a word is as often a line break as "\neq".
_LATEX_READ_AS_ESCAPES = re.compile(r"[\x08\x0c]|[\t\r](?=[A-Za-z])")
_ESCAPED = {"\x08": "\\b", "\x0c": "\\f", "\t": "\\t", "\r": "\\r"}


def _latex_restored(text: Any) -> Any:
    """Before the length check, which then counts what the solver will read, and says so in characters (pydantic's
    own message after a before-validator counts "items", which a learner asked again reads as noise)."""
    if not isinstance(text, str):
        return text
    text = _LATEX_READ_AS_ESCAPES.sub(lambda found: _ESCAPED[found.group(0)], text)
    if len(text) > MAX_EXPERIENCE_CHARS:
        raise ValueError(f"a lesson is at most {MAX_EXPERIENCE_CHARS} characters, this one {len(text)}: say it "
                         "shorter")
    return text


# A learner listing its proposals numbers them ("1. The general rule ...", "2. The general rule ..."), and the number
# is no part of the advice: the gcd benchmark run (seed 7) kept the same lesson twice, once as "1." and once as "2.",
# past the duplicate check. The solver sees each item under its own id, so the marker is dropped (after the LaTeX
# above is restored: pydantic runs before-validators last to first, and "1. \frac" would otherwise lose its "\f").
_LIST_MARKER = re.compile(r"^\s*(?:\d{1,2}[.)]|[-*\u2022])\s+")


def _list_marker_removed(text: Any) -> Any:
    return _LIST_MARKER.sub("", text, count=1) if isinstance(text, str) else text


# What a stored lesson must be (a version from a file or a peer is checked against it): as long as ops allow. The
# content rules above apply to new ops only: they grow with what learners are seen to write, and a library made
# before a rule must still import, publish and follow.
StoredLessonText = Annotated[str, Field(min_length=8, max_length=MAX_EXPERIENCE_CHARS)]
ExperienceText = Annotated[str, BeforeValidator(_list_marker_removed), BeforeValidator(_latex_restored),
                           Field(min_length=8, max_length=MAX_EXPERIENCE_CHARS), AfterValidator(_says_something)]
ExampleText = Annotated[str, Field(min_length=8, max_length=MAX_EXAMPLE_CHARS)]


class _Op(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    # Which proposals (numbered in the consolidation prompt) an op came from; feeds provenance.
    sources: tuple[int, ...] = ()


class AddOp(_Op):
    op: Literal["add"]
    text: ExperienceText


class UpdateOp(_Op):
    op: Literal["update"]
    id: str
    text: ExperienceText


class DeleteOp(_Op):
    op: Literal["delete"]
    id: str


class MergeOp(_Op):
    op: Literal["merge"]
    ids: tuple[str, ...] = Field(min_length=2)
    text: ExperienceText

    @field_validator("ids")
    @classmethod
    def _distinct(cls, ids: tuple[str, ...]) -> tuple[str, ...]:
        if len(set(ids)) != len(ids):
            raise ValueError("merge ids must be distinct")
        return ids


class NoneOp(_Op):
    op: Literal["none"]


class ExampleOp(_Op):
    """Add a worked example: a problem and one of the model's own answers to it that the verifier scored correct.
    Made by the optimizer from rollouts, never by the learner (it is not in the learner's reply schema)."""

    op: Literal["example"]
    text: ExampleText


LibraryOp = Annotated[Union[AddOp, UpdateOp, DeleteOp, MergeOp, NoneOp], Field(discriminator="op")]


class OpsReply(BaseModel):
    """What the learner must answer in the group and consolidation stages."""

    model_config = ConfigDict(extra="forbid")
    operations: list[LibraryOp] = Field(min_length=1, max_length=16)


OPS_SCHEMA: dict[str, Any] = OpsReply.model_json_schema()


def ops_schema(max_ops: int, ids: tuple[str, ...] | None = None) -> dict[str, Any]:
    """The ops schema with at most `max_ops` operations: with constrained decoding, a small model cannot ramble on.
    With `ids` (the lessons the learner may name), an op names only one of them, and an op that needs more lessons
    than there are leaves the schema: no update or delete on a library without lessons, no merge below two. (A 1.5B
    learner facing an empty library answered `update` of ids it made up, "attempt2" and "library_1".)"""
    schema = json.loads(json.dumps(OPS_SCHEMA))
    operations = schema["properties"]["operations"]
    operations["maxItems"] = max_ops
    if ids is None:
        return schema
    needs = {"UpdateOp": 1, "DeleteOp": 1, "MergeOp": 2}
    keep = {name for name in schema["$defs"] if len(ids) >= needs.get(name, 0)}
    items = operations["items"]
    items["oneOf"] = [ref for ref in items["oneOf"] if ref["$ref"].rsplit("/", 1)[1] in keep]
    items["discriminator"]["mapping"] = {op: ref for op, ref in items["discriminator"]["mapping"].items()
                                         if ref.rsplit("/", 1)[1] in keep}
    defs = schema["$defs"]
    for name in ("UpdateOp", "DeleteOp"):
        defs[name]["properties"]["id"]["enum"] = list(ids)
    defs["MergeOp"]["properties"]["ids"]["items"]["enum"] = list(ids)
    for name in set(defs) - keep:
        del defs[name]
    return schema
OpAdapter: TypeAdapter[Any] = TypeAdapter(LibraryOp)


class Provenance(BaseModel):
    """Where an item's current text came from."""

    model_config = ConfigDict(frozen=True)
    step: int
    op: str
    problem_ids: tuple[str, ...] = ()
    rollout_ids: tuple[str, ...] = ()


class Experience(BaseModel):
    """A library item: a lesson (a short general strategy) or a worked example (a verified solution)."""

    model_config = ConfigDict(frozen=True)
    id: str
    text: str
    provenance: Provenance
    kind: Literal["lesson", "example"] = "lesson"

    @model_serializer(mode="wrap")
    def _lessons_as_before(self, handler: Any) -> dict[str, Any]:
        data = handler(self)
        if data.get("kind") == "lesson":
            del data["kind"]  # a lesson serializes as it did before kinds existed: its version id is unchanged
        return data


class RenderPolicy(BaseModel):
    """How a version becomes prompt text; recorded in the version, so optimize, eval and serve render it alike.

    `max_tokens` caps the whole text (a tokenizer-free estimate). `lessons`: put only the N lessons most relevant
    to the request (BM25), or all that fit when None. `examples`: the N worked examples most relevant to it."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    max_tokens: int | None = Field(1024, ge=16)
    lessons: int | None = Field(None, ge=1)
    examples: int = Field(2, ge=0)
    examples_as_turns: bool = Field(False, description="in a chat request, show each worked example as a turn of "
                                    "the conversation before the request's own (the problem as the user's message, "
                                    "the solution as the assistant's), not as text in the system message")

    @model_serializer(mode="wrap")
    def _text_examples_as_before(self, handler: Any) -> dict[str, Any]:
        data = handler(self)
        if not self.examples_as_turns:
            data.pop("examples_as_turns", None)  # versions made before the field keep their ids
        return data


DEFAULT_POLICY = RenderPolicy()


class LibraryVersion(BaseModel):
    """An immutable library version. Its id is the IPFS CID (v1) of its canonical JSON: the same library has the
    same id on every machine, and an IPFS node given these bytes computes the same CID."""

    model_config = ConfigDict(frozen=True)
    items: tuple[Experience, ...] = ()
    next_number: int = 1
    parent: str | None = None
    step: int = 0
    policy: RenderPolicy = DEFAULT_POLICY

    @model_serializer(mode="wrap")
    def _default_policy_as_before(self, handler: Any) -> dict[str, Any]:
        data = handler(self)
        if self.policy == DEFAULT_POLICY:
            data.pop("policy", None)  # versions made before policies existed keep their ids
        return data

    def canonical_bytes(self) -> bytes:
        return canonical(self.model_dump(mode="json"))

    @cached_property
    def id(self) -> str:
        return cid(self.canonical_bytes())

    def get(self, item_id: str) -> Experience | None:
        return next((item for item in self.items if item.id == item_id), None)

    def render(self, query: str | None = None) -> str:
        """The prompt text for a request whose text is `query`: what optimize, eval and serve put in the system
        message (worked examples included; a policy that shows them as turns sends those as messages instead:
        `messages`)."""
        return render_library(self, query)

    def messages(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """A chat request with this library in it, exactly as `gym-tf serve` sends it upstream: for an app that
        calls its model directly rather than through the proxy."""
        return library_messages(self, messages)[0]


EMPTY_LIBRARY = LibraryVersion()


def short(version_id: str) -> str:
    """Enough of a version id for people to read and type (every raw-leaves CIDv1 starts `bafkrei`)."""
    return version_id[:16]


@dataclass(frozen=True)
class OpVerdict:
    op: Any
    accepted: bool
    reason: str = ""


def apply_ops(
    library: LibraryVersion, ops: list[Any], step: int, provenance: dict[int, Provenance] | None = None
) -> tuple[LibraryVersion, list[OpVerdict]]:
    """Apply ops in order. Ops naming unknown ids, adding a duplicate or updating to the same text are rejected with
    a reason.

    `provenance` maps an op's index to where it came from. Returns the new version (parent = `library`; `library`
    itself when no op was accepted) and one verdict per op. The new version is only a value: recording it is the store's job.
    """
    items = {item.id: item for item in library.items}
    number = library.next_number
    verdicts: list[OpVerdict] = []
    for index, op in enumerate(ops):
        origin = (provenance or {}).get(index, Provenance(step=step, op=op.op))
        origin = origin.model_copy(update={"op": op.op, "step": step})
        missing = [i for i in _ids_of(op) if i not in items]
        if missing:
            verdicts.append(OpVerdict(op, False, f"unknown id {', '.join(missing)}"))
            continue
        examples = [i for i in _ids_of(op) if items[i].kind == "example"]
        if examples:
            verdicts.append(OpVerdict(op, False, f"{', '.join(examples)} is a worked example, not a lesson"))
            continue
        if isinstance(op, (AddOp, UpdateOp, MergeOp, ExampleOp)) and _is_duplicate(op.text, items, skip=_ids_of(op)):
            verdicts.append(OpVerdict(op, False, "duplicates an existing item"))
            continue
        if isinstance(op, UpdateOp) and _text_key(op.text) == _text_key(items[op.id].text):
            verdicts.append(OpVerdict(op, False, f"changes nothing in {op.id}"))
            continue
        if isinstance(op, (AddOp, ExampleOp)):
            new_id = f"E{number}"
            number += 1
            kind = "example" if isinstance(op, ExampleOp) else "lesson"
            items[new_id] = Experience(id=new_id, text=op.text.strip(), provenance=origin, kind=kind)
        elif isinstance(op, UpdateOp):
            items[op.id] = Experience(id=op.id, text=op.text.strip(), provenance=origin, kind=items[op.id].kind)
        elif isinstance(op, DeleteOp):
            del items[op.id]
        elif isinstance(op, MergeOp):
            # The merged item keeps the oldest id, so references to it stay valid.
            keep = min(op.ids, key=_number_of)
            for item_id in op.ids:
                del items[item_id]
            items[keep] = Experience(id=keep, text=op.text.strip(), provenance=origin)
        verdicts.append(OpVerdict(op, True))
    if not any(v.accepted for v in verdicts):
        return library, verdicts  # nothing changed: no new version
    ordered = tuple(sorted(items.values(), key=lambda item: _number_of(item.id)))
    new = LibraryVersion(items=ordered, next_number=number, parent=library.id, step=step, policy=library.policy)
    return new, verdicts


def _ids_of(op: Any) -> tuple[str, ...]:
    if isinstance(op, (UpdateOp, DeleteOp)):
        return (op.id,)
    if isinstance(op, MergeOp):
        return op.ids
    return ()


def _number_of(item_id: str) -> int:
    return int(item_id[1:]) if item_id[1:].isdigit() else 0


def _is_duplicate(text: str, items: dict[str, Experience], skip: tuple[str, ...]) -> bool:
    key = _text_key(text)
    return any(_text_key(item.text) == key for item_id, item in items.items() if item_id not in skip)


def _text_key(text: str) -> str:
    """Equal keys, the same advice: texts equal but for case, spacing, a list marker in front and a full stop at the
    end."""
    return " ".join(_LIST_MARKER.sub("", text, count=1).lower().split()).rstrip(".")


def example_text(problem: str, solution: str) -> str:
    """A worked example's text: the problem's statement and a verified solution."""
    return f"Problem: {problem.strip()}\nSolution: {solution.strip()}"


def labeled_solution(answer: str) -> str:
    """A labeled example's solution: the reference answer alone, in the form the solve prompt asks for."""
    return f"\\boxed{{{answer.strip()}}}"


def example_parts(text: str) -> tuple[str, str]:
    """(problem, solution) of a worked example's text; a text not in that form is all problem."""
    if not text.startswith("Problem: "):
        return text, ""
    problem, _, solution = text.removeprefix("Problem: ").partition("\nSolution:")
    return problem.strip(), solution.strip()


def example_solutions(library: LibraryVersion) -> dict[str, str]:
    """The solution each worked example of the library shows, by item id."""
    return {item.id: example_parts(item.text)[1] for item in library.items if item.kind == "example"}


_FENCE = re.compile(r"^\s*```")
_OUTPUT_FENCE = re.compile(r"^\s*```\s*(?:output|stdout|console)\b", re.IGNORECASE | re.MULTILINE)


def solution_steps(text: str) -> int:
    """How many lines of working a solution shows: a tokenizer-free measure of its complexity. Lines inside fenced
    code blocks are not counted: a program is not working the reader can follow, and 20 lines of code for
    "-( 0 * 9 )" (the 0.5B on basic_arithmetic) made that example outrank every one worked in prose."""
    steps, fenced = 0, False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
        elif line.strip() and not fenced:
            steps += 1
    return steps


def shows_unrun_output(text: str) -> bool:
    """Whether a solution shows the output of code nobody ran: the model wrote the program and then the "```output"
    block itself. The embedded 0.5B does so in about 0.2% of its answers, right 23% of the time against 49% for the
    rest (77,296 rollouts of stop 29-31's benchmark runs); shown as an example, it teaches inventing results."""
    return bool(_OUTPUT_FENCE.search(text))


# words by which an answer asked with its reference answer shown (`hint.txt`) lets on that it was told: such working
# reads "as given" where a worked example must reach the answer by itself
_HINT_WORDS = re.compile(r"\b(hint|hinted|told|given (?:final )?answer|correct (?:final )?answer|reference answer|"
                         r"we (?:are|were) given that the answer)\b", re.IGNORECASE)


def mentions_hint(text: str) -> bool:
    """Whether an answer asked with its reference answer shown says so (`_HINT_WORDS`)."""
    return bool(_HINT_WORDS.search(text))


COPY_SIMILARITY = 0.8  # difflib's ratio over words at which an answer counts as a worked example's solution again


def copies_example(answer: str, solutions: Iterable[str]) -> bool:
    """Whether an answer repeats one of these worked examples' solutions (difflib's ratio over their words at least
    `COPY_SIMILARITY`) instead of working its own problem. How often the embedded 0.5B does so depends on the family:
    on color_cube_rotation (seed 53, EPYC) 132 of 156 training answers shown an example copied it, right 0.14 of the
    time (the other 24: 0.18), right when the problem's answer happened to be the one the copy boxes; on
    knights_knaves (seed 55) 14 of 144. The cheap upper bounds go first: a long looping answer is refused by its
    length alone."""
    words = answer.split()
    for solution in solutions:
        if not solution:
            continue
        match = difflib.SequenceMatcher(None, words, solution.split(), autojunk=False)
        if (match.real_quick_ratio() >= COPY_SIMILARITY and match.quick_ratio() >= COPY_SIMILARITY
                and match.ratio() >= COPY_SIMILARITY):
            return True
    return False


def answer_in_problem(problem: str, answer: str | None) -> bool:
    """Whether a problem's answer stands in its own statement, as a whole word or number, whatever its case: a
    palindrome to spell backward (`eye`), the GCD of 990 and 330, `8 + 0`, a fraction already in lowest terms. A small
    model is right on such problems by copying the question: the embedded 0.5B's only fully right training answers
    on number_sequence (seed 45) were to the 5 of 16 sequences that end on a repeated term, and on spell_backward (seed
    62) both worked examples it learned were of palindromes (`eye`, `Bob`). In a family whose answers are options
    named in the question (Yes or No, True or False) most problems are like that."""
    answer = (answer or "").strip()
    if not answer:
        return False
    pattern = r"(?<![\w.\-])" + re.escape(answer) + r"(?![\w]|\.\d)"
    return re.search(pattern, problem, flags=re.IGNORECASE) is not None


def problems_held_in(library: LibraryVersion, problems: Iterable[Any]) -> list[str]:
    """Ids of the problems the library holds a worked example of (`Problem: <that very text>\nSolution: ...`):
    measured on them, a library can copy its answer, so they are not held-out problems for it."""
    held = {example_parts(item.text)[0] for item in library.items
            if item.kind == "example" and item.text.startswith("Problem: ")}
    return [p.id for p in problems if p.problem.strip() in held]


# --- rendering: one renderer for rollouts, eval, the learner and the server ---------------------------------------

LIBRARY_HEADER = "Experiences learned from earlier problems (apply the ones that fit):"
EXAMPLES_HEADER = "Worked examples of similar problems, solved correctly:"


def approx_tokens(text: str) -> int:
    """A tokenizer-free estimate (4 bytes a token), so the rendered text is identical whatever model reads it."""
    return math.ceil(len(text.encode()) / 4)


def select_items(library: LibraryVersion, query: str | None = None, leave_out: str | None = None
                 ) -> tuple[Experience, ...]:
    """The items a request with this text is shown, in id order: one deterministic function of (version, query).
    A worked example of the problem `leave_out` is not among them (a training problem's own: `library_messages`).

    Examples: the `policy.examples` whose problems are most like the query's (the most steps first among
    equals, and without a query). Lessons: the
    `policy.lessons` most relevant, or all of them. Then the budget: candidates are taken examples first, then
    lessons newest first, and one that would push the estimate past `policy.max_tokens` is left out, so a new
    lesson always gets in and the oldest ones make room.
    """
    policy = library.policy
    lessons = [i for i in library.items if i.kind == "lesson"]
    examples = [i for i in library.items if i.kind == "example"
                and (leave_out is None or example_parts(i.text)[0] != leave_out.strip())]
    chosen_examples = _most_relevant_examples(examples, query, policy.examples)
    chosen_lessons = _most_relevant(lessons, query, policy.lessons) if policy.lessons else list(reversed(lessons))
    budget = policy.max_tokens
    used, kept, headed = 0, [], set()
    for item in [*chosen_examples, *chosen_lessons]:
        header = (LIBRARY_HEADER if item.kind == "lesson" else EXAMPLES_HEADER) if item.kind not in headed else ""
        cost = approx_tokens(_line(item)) + 1 + (approx_tokens(header) + 1 if header else 0)
        if budget is not None and used + cost > budget:
            continue
        kept.append(item)
        headed.add(item.kind)
        used += cost
    return tuple(sorted(kept, key=lambda i: _number_of(i.id)))


def _most_relevant(items: list[Experience], query: str | None, limit: int) -> list[Experience]:
    if limit <= 0 or not items:
        return []
    if not query:
        return list(reversed(items))[:limit]
    return [items[i] for i in rank([i.text for i in items], query, limit)]


def _most_relevant_examples(examples: list[Experience], query: str | None, limit: int) -> list[Experience]:
    """The worked examples whose problems share the most words with the request; among equals, the one that shows
    the most steps, then the newest.

    Problems are matched with problems (a solution's words are not the request's), with no length normalization:
    in a generated task family every problem follows one template, and normalizing by length would show every
    request the family's shortest, easiest problems. Showing more complex demonstrations is what complexity-based
    prompting found helps (Fu et al., arXiv 2210.00720)."""
    if limit <= 0 or not examples:
        return []
    problems, steps = _problems_and_steps(tuple(e.text for e in examples))
    return [examples[i] for i in rank(problems, query or "", limit, length_norm=False, prior=steps)]


@lru_cache(maxsize=64)
def _problems_and_steps(texts: tuple[str, ...]) -> tuple[list[str], list[float]]:
    """Each worked example's problem and how many steps its solution shows, read once per version's examples."""
    parts = [example_parts(text) for text in texts]
    return [problem for problem, _ in parts], [float(solution_steps(solution)) for _, solution in parts]


def _line(item: Experience) -> str:
    return f"[{item.id}] {item.text}"


def render_items(items: tuple[Experience, ...]) -> str:
    lessons = [_line(i) for i in items if i.kind == "lesson"]
    examples = [_line(i) for i in items if i.kind == "example"]
    parts = []
    if lessons:
        parts.append("\n".join([LIBRARY_HEADER, *lessons]))
    if examples:
        parts.append("\n\n".join([EXAMPLES_HEADER, *examples]))
    return "\n\n".join(parts)


def render_library(library: LibraryVersion, query: str | None = None) -> str:
    """The library as prompt text for a request whose text is `query`. Empty library: empty string."""
    return render_items(select_items(library, query))


def library_messages(library: LibraryVersion, messages: list[dict[str, Any]], leave_out: str | None = None
                     ) -> tuple[list[dict[str, Any]], tuple[str, ...]]:
    """A chat request with the library's items for it (`select_items` over its text), and their ids: what optimize,
    eval and serve send. Lessons, and worked examples unless the policy shows them as turns, go first in the system
    message; as turns, each example is a user message (its problem) and an assistant message (its solution), in
    order before the request's first message that is not a system one, where that one is the user's (else the
    examples stay system text). A small model copies the form and length of
    an answer it has itself given far more than of one it read in its instructions (the 0.5B, answering
    largest_island with two reference answers shown: as system text 0 of 16 right, 11 cut at the token cap; as
    turns 7 of 16, none cut, most of them the shown answer, 10, copied: a scratch probe, 2026-12-06).

    `leave_out` names a problem whose worked example is not shown: optimize names each training problem it asks,
    since a problem shown its own example copies it, and its group then measures the copy, not the
    library a held-out problem meets (with labeled examples, each of caesar_cipher's, survo's and
    string_synthesis's 64 second-epoch rollouts at seed 1206 was shown its own example; right 0.80, 0.63 and 0.27
    of the time, against 0.00 on the test split)."""
    items = select_items(library, request_text(messages), leave_out)
    ids = tuple(i.id for i in items)
    at = next((n for n, m in enumerate(messages) if m.get("role") not in ("system", "developer")), len(messages))
    # turns need a user's message to follow them (a chat that opens with the assistant would get two assistant turns
    # in a row, which strict chat templates refuse) and examples in "Problem: / Solution:" form (imported ones may not)
    as_turns = [i for i in items if i.kind == "example" and all(example_parts(i.text))] if (
        library.policy.examples_as_turns and at < len(messages) and messages[at].get("role") == "user") else []
    out = with_library(messages, render_items(tuple(i for i in items if i not in as_turns)))
    turns = [{"role": role, "content": text} for example in as_turns
             for role, text in zip(("user", "assistant"), example_parts(example.text))]
    at += len(out) - len(messages)  # a system message added in front
    return out[:at] + turns + out[at:], ids


def with_policy(library: LibraryVersion, policy: RenderPolicy | None) -> LibraryVersion:
    """The same items rendered under another policy (a new version id); None keeps the version's own."""
    if policy is None or policy == library.policy:
        return library
    return LibraryVersion.model_validate({**library.model_dump(mode="json"), "policy": policy.model_dump()})


def with_library(messages: list[dict[str, Any]], library_text: str) -> list[dict[str, Any]]:
    """Put the rendered library first in the system message (merged into an existing one, else added first).

    The library goes first so that every request shares the same prefix and prefix caches hit.
    """
    if not library_text:
        return list(messages)
    out = [dict(m) for m in messages]
    for message in out:
        if message.get("role") in ("system", "developer"):
            content = message.get("content")
            if isinstance(content, list):
                message["content"] = [{"type": "text", "text": library_text + "\n\n"}, *content]
            else:
                message["content"] = f"{library_text}\n\n{content}" if content else library_text
            return out
    return [{"role": "system", "content": library_text}, *out]
