"""An LLM judge: asks a model whether a completion reaches the reference answer; CORRECT -> 1.0, INCORRECT -> 0.0."""

from __future__ import annotations

import asyncio
from typing import Any, Protocol, Sequence

JUDGE_PROMPT = """You grade answers. Reference answer: {answer}

Candidate response:
{completion}

Does the candidate's final answer agree with the reference answer? Reply with one word: CORRECT or INCORRECT."""


class Choice(Protocol):
    text: str


class Reply(Protocol):
    choices: Sequence[Choice]


class JudgeBackend(Protocol):
    """Any backend with gym-tf's `generate` shape: one chat, n samples, sampling keywords."""

    async def generate(self, messages: list[dict[str, Any]], n: int = 1, **sampling: Any) -> Reply: ...


class LLMJudge:
    """Reward callable backed by a model. Asynchronous, so it never blocks the rollout engine's event loop.

    >>> judge = LLMJudge(backend)
    >>> await judge(["... so the answer is 12"], answer="12")
    [1.0]
    """

    def __init__(self, backend: JudgeBackend, max_tokens: int = 8):
        self.backend = backend
        self.max_tokens = max_tokens

    async def __call__(self, completions: list[str], answer: str, **_: object) -> list[float | None]:
        verdicts = await asyncio.gather(*(self._grade(c, answer) for c in completions))
        return list(verdicts)

    async def _grade(self, completion: str, answer: str) -> float | None:
        prompt = JUDGE_PROMPT.format(answer=answer, completion=completion)
        reply = await self.backend.generate(
            [{"role": "user", "content": prompt}], n=1, temperature=0.0, max_tokens=self.max_tokens
        )
        verdict = reply.choices[0].text.strip().upper()
        if verdict.startswith("INCORRECT"):
            return 0.0
        if verdict.startswith("CORRECT"):
            return 1.0
        return None  # the judge said neither: no signal rather than a guess


FEEDBACK_JUDGE_PROMPT = """You grade answers to a user's request. There is no reference answer.

Request:
{problem}
{feedback}
Candidate response:
{completion}

Does the candidate answer the request correctly and helpfully{also}? Reply with one word: CORRECT or INCORRECT."""


class FeedbackJudge(LLMJudge):
    """A judge for recorded traffic without a reference answer: it sees the request and, where a user commented on
    the answer they were served, that answer and the comment (`rewards.feedback` passes them as columns).

    >>> await FeedbackJudge(backend)(["... 12"], problem="6+6?", comment="show the steps", served_answer="12")
    [0.0]
    """

    async def __call__(self, completions: list[str], problem: str = "", comment: str | None = None,
                       served_answer: str | None = None, **_: object) -> list[float | None]:
        feedback = ""
        if comment:
            feedback = f"\nA user was served this answer:\n{served_answer or ''}\nand commented:\n{comment}\n"
        also = ", taking the user's comment into account" if comment else ""
        return list(await asyncio.gather(*(
            self._ask(FEEDBACK_JUDGE_PROMPT.format(problem=problem, feedback=feedback, completion=c, also=also))
            for c in completions)))

    async def _ask(self, prompt: str) -> float | None:
        reply = await self.backend.generate(
            [{"role": "user", "content": prompt}], n=1, temperature=0.0, max_tokens=self.max_tokens
        )
        verdict = reply.choices[0].text.strip().upper()
        return 0.0 if verdict.startswith("INCORRECT") else 1.0 if verdict.startswith("CORRECT") else None
