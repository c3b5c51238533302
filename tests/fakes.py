"""Small deterministic fakes at the seams (the LLM client, IPFS). The real engines are exercised in the *_real tests."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from typing import Any, Callable

from gym_tf.backends import Choice, Generation
from ledger.cid import cid
from ledger.errors import TransportError


def _stage(prompt: str) -> str:
    if prompt.startswith("A model attempted a problem"):
        return "summarize"
    if prompt.startswith(("Several attempts", "Every attempt")):
        return "extract"
    if prompt.startswith("You maintain a library"):
        return "consolidate"
    if prompt.startswith("Your reply could not be used"):
        return "retry"
    if prompt.startswith("You grade answers"):
        return "judge"
    return "solve"


def default_learner(stage: str, prompt: str, attempt: int = 0) -> str:
    """A well-behaved learner: one lesson per group, consolidation adds every proposal with its source."""
    if stage == "summarize":
        return "Set up the arithmetic, computed step by step, boxed the result."
    if stage == "extract":
        problem = re.search(r"Problem:\n(.*)\n", prompt).group(1)
        # letters only: a lesson carrying the problem's numbers would be refused
        tag = hashlib.sha256(problem.encode()).hexdigest()[:6].translate(str.maketrans("0123456789", "ghijklmnop"))
        return json.dumps({"operations": [{"op": "add", "text": f"Re-check each arithmetic step (lesson {tag})."}]})
    if stage == "consolidate":
        proposals = re.findall(r"^(\d+)\. \(from problem [^)]*\) (.*)$", prompt, re.MULTILINE)
        ops = [{**json.loads(body), "sources": [int(n)]} for n, body in proposals]
        return json.dumps({"operations": ops})
    return "CORRECT"


def solve_text(problem: str, answer: str) -> str:
    """A scripted answer: working of its own problem (words of its digest: answers to two problems are not one
    text, which a worked example would refuse as a copy), then the boxed answer."""
    digest = hashlib.sha256(problem.encode()).hexdigest()
    return f"Work {digest[:4]} {digest[4:8]}... so \\boxed{{{answer}}}"


class ScriptedBackend:
    """Answers solve prompts right or wrong by a hash of (problem, seed): deterministic and order-independent.

    `answers` maps problem text to the gold answer; `skill` is the chance of a right answer.
    """

    model = "scripted"

    def __init__(self, answers: dict[str, str], learner: Callable[[str, str, int], str] = default_learner,
                 skill: float = 0.5, delay: float = 0.0):
        self.answers = answers
        self.learner = learner
        self.skill = skill
        self.delay = delay
        self.calls: list[dict[str, Any]] = []

    def describe(self) -> str:
        return "scripted fake"

    async def generate(self, messages, n=1, **sampling) -> Generation:
        first = messages[0]
        # gym-tf's solve prompt opens with a system message; a recorded conversation may be one user message
        solve = first["role"] == "system" or (isinstance(messages[-1]["content"], str)
                                               and messages[-1]["content"] in self.answers)
        stage = "solve" if solve else _stage(first["content"])
        attempt = (len(messages) - 1) // 2  # learner retries append (assistant, user) pairs
        skill = self.skill_for(messages)  # read once: concurrent calls must not see each other's
        choices = []
        for i in range(n):
            if self.delay:
                await asyncio.sleep(self.delay)
            if solve:
                problem = messages[-1]["content"]
                gold = self.answers[problem]
                draw = int(hashlib.sha256(f"{problem}:{sampling.get('seed')}:{i}".encode()).hexdigest(), 16) % 1000
                text = solve_text(problem, gold if draw < skill * 1000 else "wrong")
            else:
                text = self.learner(stage, first["content"], attempt)
            choices.append(Choice(text=text, finish_reason="stop", completion_tokens=len(text.split())))
        prompt_tokens = sum(len(str(m["content"]).split()) for m in messages) * n
        completion_tokens = sum(c.completion_tokens for c in choices)
        self.calls.append({"stage": stage, "n": n, "attempt": attempt, "seed": sampling.get("seed"),
                           "problem": messages[-1]["content"] if solve else None, "prompt_tokens": prompt_tokens,
                           "completion_tokens": completion_tokens, "json_schema": sampling.get("json_schema")})
        return Generation(choices, prompt_tokens, completion_tokens, 0.0)

    def skill_for(self, messages) -> float:
        """The chance of a right answer for this prompt; a subclass may make it depend on the library."""
        return self.skill

    async def aclose(self) -> None:
        pass


class MemoryIpfs:
    """A content-addressed store in a dict: what fetch reads is exactly the bytes under test."""

    name = "memory"

    def __init__(self):
        self.blocks: dict[str, bytes] = {}

    def add(self, data: bytes) -> str:
        self.blocks[cid(data)] = data
        return cid(data)

    def cat(self, address: str) -> bytes:
        if address not in self.blocks:
            raise TransportError(f"memory: no block {address}")
        return self.blocks[address]
