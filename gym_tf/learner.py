"""The learner's three LLM stages (summarize a rollout, compare a group, consolidate a batch) with strict replies.

Every call goes through `LearnerCalls.ask`, which reuses a reply already in the store (so `--resume` spends no
token twice), records each new prompt and reply, and for JSON stages validates the reply as `OpsReply`, retrying
with the validation error shown to the model. A reply that never validates is recorded as rejected.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from gym_tf.backends import Backend, Choice, Generation, Sampling
from gym_tf.datasets import Problem
from gym_tf.library import LibraryVersion, OpsReply, ops_schema
from gym_tf.prompts import render
from gym_tf.rollouts import Rollout
from gym_tf.store import RunStore


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

    async def ask(self, step: int, stage: str, subject: str, prompt: str, max_ops: int | None) -> StageReply:
        """One stage's reply: `max_ops` None asks for text, else for at most `max_ops` typed operations."""
        want_ops = max_ops is not None
        messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
        calls = prompt_tokens = completion_tokens = 0
        error: str | None = None
        text = ""
        for attempt in range(self.max_attempts if want_ops else 1):
            stored = self.store.learner_call(self.run_id, step, stage, subject, attempt)
            if stored is None:
                generation = await self.backend.generate(
                    messages, n=1, **{**self.sampling.__dict__, "json_schema": ops_schema(max_ops) if want_ops else None}
                )
                text = generation.choices[0].text
                calls += 1
                prompt_tokens += generation.prompt_tokens
                completion_tokens += generation.completion_tokens
                ops, error = parse_ops(text, max_ops) if want_ops else ([], None)
                self.store.put_learner_call(
                    self.run_id, step, stage, subject, attempt, messages=messages, reply=text,
                    prompt_tokens=generation.prompt_tokens, completion_tokens=generation.completion_tokens,
                    valid=int(error is None), error=error,
                )
            else:
                text = stored["reply"]
                ops, error = parse_ops(text, max_ops) if want_ops else ([], None)
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


def parse_ops(reply: str, max_ops: int | None = None) -> tuple[list[Any], str | None]:
    """Strictly parse a learner reply into typed ops. Returns (ops, None) or ([], the reason it failed)."""
    body = reply.strip()
    if body.startswith("```"):
        body = body.strip("`").removeprefix("json").strip()
    try:
        ops = list(OpsReply.model_validate_json(body).operations)
        if max_ops is not None and len(ops) > max_ops:
            return [], f"at most {max_ops} operations are allowed, got {len(ops)}"
        return ops, None
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
    verdict = "correct" if (rollout.reward or 0) >= 1 else "incorrect" if rollout.reward is not None else "ungraded"
    shown = [item for item in library.items if item.id in rollout.shown]
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
