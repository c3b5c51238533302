"""Math answer equivalence with HuggingFace math-verify: `\\frac{1}{2}` equals `0.5`, `1,000` equals `1000`."""

from __future__ import annotations

import logging
import threading

from math_verify import parse, verify


class _ThreadTimeoutNotice(logging.Filter):
    """math-verify warns on every call made with its signal timeouts off; off is deliberate here (worker threads)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_ThreadTimeoutNotice())


def math_reward(completions: list[str], answer: str, **_: object) -> list[float | None]:
    """1.0 where the completion's answer is mathematically equal to `answer`, else 0.0.

    The gold answer is wrapped in `\\boxed{}` so LaTeX gold parses like the model's boxed answer.
    math-verify's timeouts use signals, which only the main thread may set: elsewhere they are off.
    """
    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    gold = parse(f"\\boxed{{{answer}}}", parsing_timeout=timeout)
    if not gold:
        gold = parse(str(answer), parsing_timeout=timeout)
    scores: list[float | None] = []
    for completion in completions:
        predicted = parse(completion, parsing_timeout=timeout)
        scores.append(1.0 if predicted and verify(gold, predicted, timeout_seconds=timeout) else 0.0)
    return scores
