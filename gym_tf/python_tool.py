"""The policy's Python tool: the frozen model may write a program, gym-tf runs it and shows it what it printed.

The reference method's math runs answered with a code interpreter (ReAct); a small model asked to sort 40 numbers or
count the bits of 2**31 - 1 writes a correct program and then invents its output. `PythonTool` wraps the policy's
backend: its system message gains one paragraph (`prompts/python_tool.txt`); where an answer holds a complete
```python block, the last one runs in a child Python (`run_program`), and the model, shown what it printed, answers
again. The answer recorded, scored and learned from is the whole exchange: the first reply to the end of its
program, the output, the second reply (whose `\\boxed{}` comes last, so it is the one graded). One round: a second
program is not run.

The child is limited, not sandboxed: isolated mode (`-I`, no site packages or environment), an empty environment and
a temporary working directory, `CPU_SECONDS` of CPU, `MEMORY_BYTES` of address space, `OUTPUT_BYTES` of output,
`WALL_SECONDS` of wall time. It can still read what the user running gym-tf can read: turn the tool on only where
running the model's code is acceptable (it is off by default; `serve` never runs code, that is the client's tool).
"""

from __future__ import annotations

import asyncio
import re
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gym_tf.backends import Backend, Choice, Generation
from gym_tf.backends.base import Messages, gather_or_cancel
from gym_tf.prompts import render, template

CPU_SECONDS = 5
WALL_SECONDS = 10.0
MEMORY_BYTES = 1 << 30
OUTPUT_BYTES = 64 * 1024
SHOWN_CHARS = 1500  # of the output, the model is shown at most this much (its end, where a traceback names the error)

_PROGRAM = re.compile(r"```(?:python|py|python3)[ \t]*\n(.*?)```", re.DOTALL)


def last_program(text: str) -> tuple[str, str] | None:
    """The last complete ```python block of a reply and the reply up to its end, or None (a block cut off by the
    token cap is not run). What the model wrote after its program (an output it imagined, an answer from it) is
    not kept: it is shown the real output instead, and a worked example made of the exchange shows no invented one.

    >>> last_program("Sort them:\\n```python\\nprint(sorted([3, 1]))\\n```\\nOutput: [1, 3]")
    ('print(sorted([3, 1]))\\n', 'Sort them:\\n```python\\nprint(sorted([3, 1]))\\n```')
    >>> last_program("```python\\nprint(1") is None
    True
    """
    programs = [m for m in _PROGRAM.finditer(text) if m[1].strip()]
    return (programs[-1][1], text[:programs[-1].end()]) if programs else None


def _limits() -> None:  # in the child, before it runs Python
    import resource

    resource.setrlimit(resource.RLIMIT_CPU, (CPU_SECONDS, CPU_SECONDS))
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))
    resource.setrlimit(resource.RLIMIT_FSIZE, (OUTPUT_BYTES, OUTPUT_BYTES))


async def run_program(program: str) -> str:
    """What `program` printed (stdout and stderr, their last `SHOWN_CHARS`), or why it printed nothing."""
    with tempfile.TemporaryDirectory(prefix="gym-tf-python-") as folder:
        printed = Path(folder) / "printed"
        with printed.open("wb") as out:
            child = await asyncio.create_subprocess_exec(
                sys.executable, "-I", "-c", program, cwd=folder, env={}, stdin=asyncio.subprocess.DEVNULL,
                stdout=out, stderr=out, preexec_fn=_limits, start_new_session=True)
            try:
                code = await asyncio.wait_for(child.wait(), WALL_SECONDS)
            except TimeoutError:
                child.kill()
                await child.wait()
                return f"(the program was stopped after {WALL_SECONDS:g} s)"
        text = printed.read_bytes()[:OUTPUT_BYTES].decode("utf-8", errors="replace").strip()
    if code < 0 and not text:
        return f"(the program was killed by signal {-code}: it ran out of time or memory)"
    return text[-SHOWN_CHARS:] if text else "(the program printed nothing)"


def with_tool_note(messages: Messages) -> Messages:
    """The messages with the tool's paragraph at the end of the system message (a new one first if there is none)."""
    note = template("python_tool")
    if messages and messages[0].get("role") == "system" and isinstance(messages[0].get("content"), str):
        return [{**messages[0], "content": f"{messages[0]['content']}\n\n{note}"}, *messages[1:]]
    return [{"role": "system", "content": note}, *messages]


@dataclass
class PythonTool:
    """A backend whose answers may run one program each (see the module's docstring). Other calls (the learner's)
    should go to the wrapped backend itself."""

    inner: Backend

    @property
    def model(self) -> str:
        return self.inner.model

    def describe(self) -> str:
        return f"{self.inner.describe()}, with a Python tool"

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def generate(self, messages: Messages, n: int = 1, **sampling: Any) -> Generation:
        start = time.perf_counter()
        asked = with_tool_note(messages)
        first = await self.inner.generate(asked, n=n, **sampling)
        seed = sampling.get("seed") or 0
        answers = await gather_or_cancel(*(self._answer(asked, c, sampling, seed + 1 + i)
                                           for i, c in enumerate(first.choices)))
        return Generation(
            choices=[choice for choice, _ in answers],
            prompt_tokens=first.prompt_tokens + sum(p for _, p in answers),
            completion_tokens=sum(c.completion_tokens for c, _ in answers),
            latency_s=time.perf_counter() - start,
        )

    async def _answer(self, asked: Messages, choice: Choice, sampling: dict[str, Any],
                      seed: int) -> tuple[Choice, int]:
        """The choice, completed by a second reply after its program's output where it wrote one; and the prompt
        tokens of that second call (0 where there was none)."""
        found = last_program(choice.text)
        if found is None:
            return choice, 0
        program, reply = found
        shown = render("python_output", output=await run_program(program))
        follow = await self.inner.generate(
            [*asked, {"role": "assistant", "content": reply}, {"role": "user", "content": shown}],
            n=1, **{**sampling, "seed": seed})
        second = follow.choices[0]
        text = f"{reply}\n\n{shown}\n\n{second.text}"
        return Choice(text=text, finish_reason=second.finish_reason,
                      completion_tokens=choice.completion_tokens + second.completion_tokens), follow.prompt_tokens
