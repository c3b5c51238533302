"""Math answer equivalence with HuggingFace math-verify: `\\frac{1}{2}` equals `0.5`, `1,000` equals `1000`.

math-verify can compute for ever on a pathological completion (`\\boxed{9^{9^{9^{9}}}}` makes sympy build the
power), and its own timeouts use signals, which only a process's main thread may set, while gym-tf scores groups in
worker threads. So every check runs in a worker process, in its main thread, where those timeouts work; and the
caller waits at most `time_limit_s` per completion: a worker stuck past that (in C code that no signal interrupts)
is killed, the completion scores None (no signal), and the next check starts a fresh worker.
"""

from __future__ import annotations

import atexit
import functools
import json
import logging
import os
import select
import subprocess
import sys
import threading

logger = logging.getLogger(__name__)

SIGNAL_TIMEOUT_S = 5  # math-verify's own limit per parse and per comparison, inside the worker
STARTUP_LIMIT_S = 120.0  # importing sympy on a loaded 2-core machine


def math_reward(completions: list[str], answer: str, time_limit_s: float = 30.0, **_: object) -> list[float | None]:
    """1.0 where the completion's answer is mathematically equal to `answer`, else 0.0; None where checking one
    completion took longer than `time_limit_s`.

    The gold answer is wrapped in `\\boxed{}` so LaTeX gold parses like the model's boxed answer.
    """
    return [_VERIFIER.check(str(answer), completion, time_limit_s) for completion in completions]


class _Verifier:
    """One worker process, shared by every thread (a lock orders the checks), started on first use."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._worker: subprocess.Popen[str] | None = None

    def check(self, answer: str, completion: str, time_limit_s: float) -> float | None:
        with self._lock:
            if self._worker is None or self._worker.poll() is not None:
                self._worker = self._start()
            worker = self._worker
            assert worker.stdin and worker.stdout
            worker.stdin.write(json.dumps([answer, completion]) + "\n")
            worker.stdin.flush()
            if select.select([worker.stdout], [], [], time_limit_s)[0]:
                reply = worker.stdout.readline()
                if not reply:
                    raise RuntimeError(f"the math-verify worker exited with status {worker.wait()} (see its stderr)")
                return json.loads(reply)
            self.close()
            logger.warning("math-verify took over %s s on a completion (killed; scored None): %.200r",
                           time_limit_s, completion)
            return None

    def _start(self) -> subprocess.Popen[str]:
        # The worker imports this module by name (no __main__ re-run), from the parent's own sys.path.
        worker = subprocess.Popen(
            [sys.executable, "-c", f"from {__name__} import _serve; _serve()"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, encoding="utf-8",
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )
        assert worker.stdout
        ready = select.select([worker.stdout], [], [], STARTUP_LIMIT_S)[0] and worker.stdout.readline()
        if ready != "ready\n":
            worker.kill()
            raise RuntimeError(f"the math-verify worker did not start within {STARTUP_LIMIT_S} s (see its stderr)")
        return worker

    def close(self) -> None:
        if self._worker is not None:
            self._worker.kill()
            self._worker.wait()
            self._worker = None


_VERIFIER = _Verifier()
atexit.register(_VERIFIER.close)


# --- the worker process ----------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=256)
def _gold(answer: str) -> list:
    from math_verify import parse

    return parse(f"\\boxed{{{answer}}}", parsing_timeout=SIGNAL_TIMEOUT_S) or parse(
        answer, parsing_timeout=SIGNAL_TIMEOUT_S)


def _verify(answer: str, completion: str) -> float:
    from math_verify import parse, verify

    predicted = parse(completion, parsing_timeout=SIGNAL_TIMEOUT_S)
    return 1.0 if predicted and verify(_gold(answer), predicted, timeout_seconds=SIGNAL_TIMEOUT_S) else 0.0


def _serve() -> None:
    """Answer one JSON line `[answer, completion]` per line of stdin with one score per line of stdout."""
    import math_verify  # noqa: F401  (imported before "ready", so the caller's limit does not count it)

    replies, sys.stdout = sys.stdout, sys.stderr  # the protocol owns stdout; stray prints go to stderr
    replies.write("ready\n")
    replies.flush()
    for line in sys.stdin:
        replies.write(json.dumps(_verify(*json.loads(line))) + "\n")
        replies.flush()
