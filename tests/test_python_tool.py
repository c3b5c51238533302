"""The policy's Python tool: a real child Python runs the program the (fake) model wrote, and the model's second
reply, after seeing what it printed, is the answer graded."""

from __future__ import annotations

import asyncio
import re
import time

from gym_tf.backends import Choice, Generation
from gym_tf.config import OptimizeConfig
from gym_tf.datasets import Problem
from gym_tf.evaluate import evaluate
from gym_tf.optimize import Optimizer
from gym_tf.python_tool import WALL_SECONDS, PythonTool, last_program, run_program
from gym_tf.store import RunStore
from rewards import load_reward

PRODUCT = 123456789 * 987654321


class Coder:
    """Writes a program for 123456789 x 987654321 and invents a wrong output; shown a real output, boxes it."""

    model = "coder"

    def __init__(self, program: str = "print(123456789 * 987654321)", cut: bool = False):
        self.program = program
        self.cut = cut  # the reply runs to the token cap inside its program
        self.calls: list[list[dict]] = []

    async def generate(self, messages, n=1, **sampling):
        self.calls.append(messages)
        last = messages[-1]["content"]
        if last.startswith("The program printed:"):
            seen = re.search(r"```\n(.*?)\n```", last, re.DOTALL).group(1)
            texts = [f"So the answer is \\boxed{{{seen}}}"]
        elif "You can run Python" in messages[0]["content"]:
            texts = [f"```python\n{self.program}" if self.cut else
                     f"```python\n{self.program}\n```\nOutput: 41\n\\boxed{{41}}"] * n
        else:
            texts = ["It is about 10**17, \\boxed{41}"] * n
        return Generation([Choice(t, "stop", 10) for t in texts], prompt_tokens=100 * len(texts),
                          completion_tokens=10 * len(texts), latency_s=0.0)

    def describe(self):
        return "coder"

    async def aclose(self):
        pass


PROBLEM = Problem(id="p0", problem="What is 123456789 x 987654321?", answer=str(PRODUCT), row={})


def test_a_program_runs_and_the_answer_after_its_output_is_the_one_graded():
    coder = Coder()
    reward = load_reward("math")
    without = asyncio.run(evaluate(coder, [PROBLEM], reward, 2, sampling(), seed=1))
    with_tool = asyncio.run(evaluate(PythonTool(coder), [PROBLEM], reward, 2, sampling(), seed=1))
    assert without.metrics.mean_at_k.value == 0.0  # the invented output, boxed
    assert with_tool.metrics.mean_at_k.value == 1.0
    completion = with_tool.rollouts["p0"][0].completion
    assert f"The program printed:\n```\n{PRODUCT}\n```" in completion
    assert completion.rstrip().endswith(f"\\boxed{{{PRODUCT}}}")
    assert "Output: 41" not in completion and "boxed{41}" not in completion  # what it invented after the program
    assert coder.calls[-1][-2]["content"].endswith("```")  # nor is the model shown it again
    # both calls paid for: two first replies in one request, then one second call each
    assert sum(r.completion_tokens for r in with_tool.rollouts["p0"]) == 2 * 10 + 2 * 10
    assert with_tool.prompt_tokens == 200 + 2 * 100
    # the tool's paragraph joins the system message; without the tool it is not there
    assert "You can run Python" in coder.calls[1][0]["content"]
    assert "You can run Python" not in coder.calls[0][0]["content"]


def test_a_reply_without_a_complete_program_makes_one_call():
    coder = Coder(cut=True)
    tool = PythonTool(coder)
    cut = asyncio.run(tool.generate([{"role": "user", "content": "x"}], n=1))
    assert len(coder.calls) == 1 and "The program printed" not in cut.choices[0].text  # no system message: one added
    assert coder.calls[0][0] == {"role": "system", "content": coder.calls[0][0]["content"]}
    assert last_program("```python\nprint(1)\n") is None
    assert last_program("```python\nprint(1)\n```\nthen\n```python\nprint(2)\n```\nOutput: 2")[0] == "print(2)\n"


def test_the_child_is_limited_in_time_output_and_environment(monkeypatch):
    assert asyncio.run(run_program("import os; print(dict(os.environ).get('HOME'))")) == "None"
    assert "ZeroDivisionError" in asyncio.run(run_program("1 / 0"))
    flood = asyncio.run(run_program("while True: print('x' * 1000)"))
    assert 0 < len(flood) <= 1500
    monkeypatch.setattr("gym_tf.python_tool.WALL_SECONDS", 1.0)
    start = time.perf_counter()
    stopped = asyncio.run(run_program("import time; time.sleep(30)"))
    assert time.perf_counter() - start < 5 and "stopped after 1 s" in stopped
    assert WALL_SECONDS == 10.0


def test_an_optimize_run_with_the_tool_runs_the_policy_s_programs_but_not_the_learner_s(tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text('{"problem": "What is 2 + 2?", "answer": "4"}\n')
    config = OptimizeConfig(dataset=str(data), python_tool=True)
    coder, learner = Coder(), Coder()
    optimizer = Optimizer(config, RunStore(tmp_path / "ws"), coder, learner)
    assert isinstance(optimizer.backend, PythonTool) and optimizer.backend.inner is coder
    assert optimizer.learner_backend is learner
    assert optimizer.store.run(optimizer.run_id)["config"]["python_tool"] is True
    plain = OptimizeConfig(dataset=str(data))
    assert "python_tool" not in plain.recorded()  # runs made before the tool keep their config hash


def sampling():
    from gym_tf.backends import Sampling

    return Sampling(max_tokens=64)
