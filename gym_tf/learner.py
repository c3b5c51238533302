"""The learner's three LLM stages (summarize a rollout, compare a group, consolidate a batch) with strict replies.

Every call goes through `LearnerCalls.ask`, which reuses a reply already in the store (so `--resume` spends no
token twice), records each new prompt and reply, and for JSON stages validates the reply as `OpsReply`, retrying
with the validation error shown to the model. A reply that never validates is recorded as rejected.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from dataclasses import dataclass, field
from difflib import SequenceMatcher
from typing import Any, Iterable

from pydantic import ValidationError

from gym_tf.backends import Backend, Choice, Generation, Sampling
from gym_tf.datasets import Problem
from gym_tf.library import LibraryVersion, OpsReply, ops_schema
from gym_tf.prompts import render
from gym_tf.retrieval import tokens
from gym_tf.rollouts import Rollout
from gym_tf.store import RunStore


NUMBER = re.compile(r"\d+(?:[.,]\d+)*")


def numbers_of(problem: Problem) -> frozenset[str]:
    return frozenset(NUMBER.findall(f"{problem.problem} {problem.answer or ''}"))


def repeats_problem(text: str, numbers: frozenset[str]) -> list[str]:
    """The problem's numbers that a lesson repeats, when they make it a note about that problem: any of two or more
    digits, or two or more of any size. "To solve the arithmetic problem 49 + 32, ..." and "3 - 7 + 0 + 3: start
    with 3 - 7 = -4" (both from a 1.5B learner) are; "add two numbers at a time" is not."""
    repeated = sorted(set(NUMBER.findall(text)) & numbers)
    long = [n for n in repeated if sum(c.isdigit() for c in n) >= 2]
    return repeated if long or len(repeated) >= 2 else []


# "Implement a strategy to solve the problem of counting the occurrences of the letter 'n' in the text 'the summer
# they have revolutionized'." (the 0.5B learner on letter_counting, 2026-11-25, on an AMD EPYC): the lesson carries
# the very text the problem quoted, so it is a note about that problem. A passage the problem sets in quotes is its
# own material (a text to count in, a sentence to reverse); one of three or more words, repeated, is refused like the
# problem's numbers. A quoted letter, word or format ("the letter 'n'", "in the form "HH:MM"") is the task's
# vocabulary and passes.
_QUOTED = re.compile(r'"([^"\n]+)"|“([^”\n]+)”|(?<!\w)\'([^\'\n]+)\'(?!\w)')


def passages_of(problem: Problem) -> frozenset[str]:
    """The passages of three or more words that the problem sets in quotes, as its words (`retrieval.tokens`)."""
    found = (tokens(next(g for g in m.groups() if g is not None)) for m in _QUOTED.finditer(problem.problem))
    return frozenset(" ".join(words) for words in found if len(words) >= 3)


def quotes_problem(text: str, passages: frozenset[str]) -> str | None:
    """The first of the quoted passages that a lesson repeats (word for word, any case), or None."""
    words = f" {' '.join(tokens(text))} "
    return next((p for p in sorted(passages) if f" {p} " in words), None)


# "Phoevos is devoted to playing badminton." and "Jules ignores vlogging." (the 0.5B learner on needle_haystack,
# seed 1206, 2026-12-06): sentences of training problems' haystacks, kept as lessons, which every later prompt carried.
# A lesson that is a run of a problem's own words and little else says nothing the problem does not. It is refused
# where the run is that problem's own material: two or more of its words stand in no other problem of the batch (a
# name, an object). The family's template ("Reply only with a name.", in every problem) and general advice in the
# words of the task ("Add the two numbers.", where other problems speak of two numbers too) pass.
RESTATED_WORDS = 3  # the shortest run of a problem's words that makes a lesson a restatement of it
RESTATED_SHARE = 0.8  # ... where the run is at least this share of the lesson's words
OWN_WORDS = 2  # ... and holds this many words that no other problem of the batch has


def restates_problem(text: str, problems: tuple[tuple[str, ...], ...], elsewhere: tuple[frozenset[str], ...]
                     ) -> str | None:
    """The run of one of `problems`' words (`retrieval.tokens`) that a lesson restates, when the lesson is little
    else and the run is that problem's own (`OWN_WORDS` of its words not among its `elsewhere`, the words of the
    batch's other problems; with none to tell by, any run is), or None."""
    words = tokens(text)
    for problem, others in zip(problems, elsewhere):
        found = SequenceMatcher(None, words, problem, autojunk=False).find_longest_match(0, len(words), 0, len(problem))
        if found.size < max(RESTATED_WORDS, RESTATED_SHARE * len(words)):
            continue
        run = words[found.a:found.a + found.size]
        if len(set(run) - others) >= OWN_WORDS or not others:
            return " ".join(run)
    return None


# "The approach is to use Python's built-in functions to handle calculations." (the 0.5B learner, four such lessons in
# the README's main command): a solver asked in text runs no code, so such advice makes it write a program and invent
# its output (stored rollouts: right 23% of the time with an invented output block, 49% without). Where the problems
# themselves are about code (a coding assistant's traffic), code is the answer, and advice about it is welcome.
# A heuristic: a verb of using before the tool; "Do not write code" and "Never use a calculator" are fine advice.
_USES_CODE = re.compile(r"\b(?:use|uses|using|write|writing|run|running|call|calling|import|with|in|via)\s+"
                        r"(?:\w+\s+){0,2}?(?:python|javascript|code|programs?|scripts?|calculators?|numpy|sympy|"
                        r"built-in\s+(?:functions?|librar(?:y|ies)|data))\b", re.IGNORECASE)
_NEGATED = re.compile(r"\b(?:not|never|without|avoid|avoiding|don't|no|instead\s+of|rather\s+than)\b", re.IGNORECASE)
_ABOUT_CODE = re.compile(r"\b(?:python|javascript|typescript|java|rust|sql|bash|code|coding|programs?|programming|"
                         r"scripts?)\b", re.IGNORECASE)


def advises_code(text: str) -> str | None:
    """The words of a lesson that tell the solver to use code or a calculator, or None."""
    for found in _USES_CODE.finditer(text):
        clause = re.split(r"[.,;:!?]", text[:found.start()])[-1]  # "Instead of guessing, use Python" is not negated
        if not _NEGATED.search(clause):
            return found.group(0)
    return None


@dataclass(frozen=True)
class OpRules:
    """What a reply's ops may name and say beyond the ops schema: only the ids of the library's lessons, not the
    numbers of a problem they were learned from, and no code unless the problems are about code. The schema holds the
    first where decoding is constrained; all are checked on every reply, and a reply that breaks one is asked again
    with the reason."""

    ids: tuple[str, ...] = ()
    numbers: tuple[frozenset[str], ...] = ()  # one set per problem
    passages: frozenset[str] = frozenset()  # the problems' quoted passages
    about_code: bool = False  # whether any of the problems names code: only then may a lesson name it
    words: tuple[tuple[str, ...], ...] = ()  # each problem's words
    elsewhere: tuple[frozenset[str], ...] = ()  # ... and, for each, the words of the batch's other problems

    @classmethod
    def of(cls, library: LibraryVersion, problems: Iterable[Problem] = (), batch: Iterable[Problem] = ()
           ) -> OpRules:
        """The rules for ops learned from `problems`, which came in `batch` (the other problems tell a problem's own
        words from the family's; with no batch, every run of a problem's words is its own)."""
        problems = list(problems)
        words = tuple(tuple(tokens(p.problem)) for p in problems)
        batch = {p.problem: frozenset(tokens(p.problem)) for p in batch}
        elsewhere = tuple(frozenset().union(*(w for text, w in batch.items() if text != p.problem)) for p in problems)
        return cls(tuple(i.id for i in library.items if i.kind == "lesson"), tuple(numbers_of(p) for p in problems),
                   frozenset().union(*map(passages_of, problems)), any(_ABOUT_CODE.search(p.problem) for p in problems),
                   words, elsewhere)

    def schema(self, max_ops: int) -> dict[str, Any]:
        return ops_schema(max_ops, self.ids)

    def broken_by(self, ops: list[Any]) -> str | None:
        for n, op in enumerate(ops):
            text = getattr(op, "text", "")
            named = [op.id] if hasattr(op, "id") else list(getattr(op, "ids", ()))
            unknown = [i for i in named if i not in self.ids]
            if unknown:
                known = ", ".join(self.ids) if self.ids else "none yet: use add or none"
                return f"unknown id {unknown[0]} at operations.{n}: the library's lessons are {known}"
            for numbers in self.numbers:
                repeated = repeats_problem(text, numbers)
                if repeated:
                    return (f"the lesson at operations.{n} repeats the problem's numbers ({', '.join(repeated)}): "
                            "state the general rule, without them")
            quoted = quotes_problem(text, self.passages)
            if quoted:
                return (f'the lesson at operations.{n} repeats the text the problem quotes ("{quoted}"): '
                        "state the general rule, for any text")
            restated = restates_problem(text, self.words, self.elsewhere) if text else None
            if restated:
                return (f'the lesson at operations.{n} restates the problem ("{restated}"): state what to do, for any '
                        "problem of this kind")
            advice = None if self.about_code else advises_code(text)
            if advice:
                return (f'the lesson at operations.{n} says "{advice}", but the solver runs no code and these '
                        "problems are not about code: give advice for working it out in words")
        return None


@dataclass(frozen=True)
class StageReply:
    """What one stage got: parsed ops (JSON stages) or text, plus why it failed when it did."""

    text: str
    ops: list[Any]
    error: str | None
    calls: int
    prompt_tokens: int
    completion_tokens: int


class LearnerCalls:
    def __init__(self, backend: Backend, store: RunStore, run_id: str, sampling: Sampling, max_attempts: int = 3):
        self.backend = backend
        self.store = store
        self.run_id = run_id
        self.sampling = sampling
        self.max_attempts = max_attempts

    async def ask(self, step: int, stage: str, subject: str, prompt: str, max_ops: int | None,
                  rules: OpRules | None = None) -> StageReply:
        """One stage's reply: `max_ops` None asks for text, else for at most `max_ops` typed operations that keep
        `rules` (default: any ids, any text)."""
        want_ops = max_ops is not None
        messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
        calls = prompt_tokens = completion_tokens = 0
        error: str | None = None
        text = ""
        schema = (rules.schema(max_ops) if rules else ops_schema(max_ops)) if want_ops else None
        for attempt in range(self.max_attempts if want_ops else 1):
            stored = self.store.learner_call(self.run_id, step, stage, subject, attempt)
            if stored is None:
                generation = await self.backend.generate(
                    messages, n=1, **{**self.sampling.__dict__, "json_schema": schema}
                )
                text = generation.choices[0].text
                calls += 1
                prompt_tokens += generation.prompt_tokens
                completion_tokens += generation.completion_tokens
                ops, error = parse_ops(text, max_ops, rules) if want_ops else ([], None)
                self.store.put_learner_call(
                    self.run_id, step, stage, subject, attempt, messages=messages, reply=text,
                    prompt_tokens=generation.prompt_tokens, completion_tokens=generation.completion_tokens,
                    valid=int(error is None), error=error,
                )
            else:
                text = stored["reply"]
                ops, error = parse_ops(text, max_ops, rules) if want_ops else ([], None)
            if error is None:
                return StageReply(text, ops, None, calls, prompt_tokens, completion_tokens)
            messages = [*messages, {"role": "assistant", "content": text},
                        {"role": "user", "content": render("retry", error=error)}]
        return StageReply(text, [], error, calls, prompt_tokens, completion_tokens)


class JudgeCalls:
    """The backend an LLM-judge reward asks, with every call stored and counted (stage `judge`) like the learner's:
    a resumed run reuses each verdict already stored, so no judge call is paid twice."""

    def __init__(self, backend: Backend, store: RunStore, run_id: str):
        self.backend, self.store, self.run_id = backend, store, run_id
        self.model = backend.model
        self._asking: dict[str, asyncio.Future] = {}  # the same question asked twice at once is paid once

    async def generate(self, messages: list[dict[str, Any]], n: int = 1, **sampling: Any) -> Generation:
        subject = hashlib.sha256(json.dumps([messages, n, sampling], sort_keys=True).encode()).hexdigest()[:32]
        if subject in self._asking:
            await asyncio.shield(self._asking[subject])
        stored = self.store.learner_call(self.run_id, 0, "judge", subject, 0)
        if stored is not None:
            return Generation([Choice(text=stored["reply"], finish_reason="stop", completion_tokens=0)], 0, 0, 0.0)
        done = self._asking[subject] = asyncio.get_running_loop().create_future()
        try:
            generation = await self.backend.generate(messages, n=n, **sampling)
            self.store.put_learner_call(self.run_id, 0, "judge", subject, 0, messages=messages,
                                        reply=generation.choices[0].text, prompt_tokens=generation.prompt_tokens,
                                        completion_tokens=generation.completion_tokens, valid=1, error=None)
        finally:
            done.set_result(None)
            self._asking.pop(subject, None)
        return generation


def parse_ops(reply: str, max_ops: int | None = None, rules: OpRules | None = None) -> tuple[list[Any], str | None]:
    """Strictly parse a learner reply into typed ops that keep `rules`. Returns (ops, None) or ([], the reason it
    failed)."""
    body = reply.strip()
    if body.startswith("```"):
        body = body.strip("`").removeprefix("json").strip()
    try:
        ops = list(OpsReply.model_validate_json(body).operations)
        if max_ops is not None and len(ops) > max_ops:
            return [], f"at most {max_ops} operations are allowed, got {len(ops)}"
        broken = rules.broken_by(ops) if rules else None
        return ([], broken) if broken else (ops, None)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        return [], f"{first['msg']} at {where or 'top level'}" + (f" ({len(exc.errors())} errors)" if len(exc.errors()) > 1 else "")


# --- the stage prompts ------------------------------------------------------------------------------------------


def library_for_learner(library: LibraryVersion) -> str:
    """The lessons the learner may update, merge or delete (worked examples are the verifier's, not the learner's)."""
    return _listing([i for i in library.items if i.kind == "lesson"])


def _listing(items: list[Any]) -> str:
    return "\n".join(f"[{i.id}] {i.text}" for i in items) or "(none)"


def summarize_prompt(problem: Problem, rollout: Rollout, library: LibraryVersion) -> str:
    """The lessons the attempt was shown, not its worked examples: a prompt carrying whole solutions besides the
    attempt made the 0.5B summarizer copy them out, 400 to 512 tokens (11 of 12 summaries of the quickstart's second
    step), and the later stages edit lessons only."""
    verdict = "correct" if (rollout.reward or 0) >= 1 else "incorrect" if rollout.reward is not None else "ungraded"
    shown = [item for item in library.items if item.id in rollout.shown and item.kind == "lesson"]
    return render("summarize", problem=problem.problem, answer=problem.answer, verdict=verdict,
                  completion=rollout.completion, library=_listing(shown))


def group_prompt(problem: Problem, summaries: list[tuple[Rollout, str]], library: LibraryVersion,
                 max_ops: int, hard: bool) -> str:
    attempts = "\n\n".join(
        f"Attempt {r.sample + 1} (reward {r.reward if r.reward is not None else 'none'}):\n{summary}"
        for r, summary in summaries
    )
    if hard:
        solution = problem.row.get("solution") if problem.row.get("solution") != problem.answer else None
        reference = f"Reference solution:\n{solution}\n" if solution else ""
        return render("group_hard", problem=problem.problem, answer=problem.answer, reference_solution=reference,
                      attempts=attempts, library=library_for_learner(library), max_ops=max_ops)
    return render("group_advantage", problem=problem.problem, answer=problem.answer, attempts=attempts,
                  library=library_for_learner(library), max_ops=max_ops)


def consolidate_prompt(proposals: list[tuple[str, Any]], library: LibraryVersion) -> str:
    lines = [f"{n}. (from problem {pid}) {json.dumps(op.model_dump(exclude={'sources'}))}"
             for n, (pid, op) in enumerate(proposals, start=1)]
    return render("consolidate", library=library_for_learner(library), proposals="\n".join(lines))
