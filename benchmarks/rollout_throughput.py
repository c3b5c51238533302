"""Rollout throughput: gym-tf's rollout engine versus a plain client on the same backend, in the same run.

    python benchmarks/rollout_throughput.py                 # embedded model and llama.cpp's server on loopback
    python benchmarks/rollout_throughput.py --only embedded

It first prints the CPU, its vector flags and what the llama.cpp build uses, then the engine's tok/s on this CPU.
If llama-cpp-python is installed (a native build, compiled for this very CPU), the embedded table adds it as an arm:
the price of the portable prebuilt engine, measured in the same run.

Each arm does the same work, a rollout being an answer plus its score: the same prompts, seeds, sampling and token
limit, each group scored by the same reward. Throughput is completion tokens per second.
The ratio that matters: gym-tf / best plain client at the same concurrency (target >= 0.95: the backend is the
limit, not gym-tf). Arms run in alternating order, several times, and the best of each is kept, against machine noise.
The embedded table also runs gym-tf on a one-slot engine, a group's samples one after another, as the engine decoded
before groups went in one batch: its line is the speed-up of batching on this CPU. With `--group` below the engine's
slots (validation's pairs: `--group 2`) it also runs gym-tf on an engine with exactly `--group` slots, one group at
a time, standing in for the engine before requests shared its slots (then it had 4 slots behind a lock): the last
line is what sharing gains (at `--group 1` the one-slot line above is). Give it at least `4 / --group` problems.
The server table runs llama.cpp's server with the slots `gym-tf serve` gives the embedded model, and the concurrent
client once more on a one-slot server, as `serve` started it before: its last line is what concurrent requests gain
from the slots.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import subprocess
import sys
import time
from pathlib import Path

import openai
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from gym_tf.backends import Sampling  # noqa: E402
from gym_tf.backends.embedded import (SLOTS, EmbeddedBackend, cpu_info, default_model_path,  # noqa: E402
                                     engine_features)
from gym_tf.backends.openai_http import OpenAIBackend  # noqa: E402
from gym_tf.datasets import load_dataset  # noqa: E402
from gym_tf.library import EMPTY_LIBRARY  # noqa: E402
from gym_tf.rollouts import build_messages, group_seed, rollout_many  # noqa: E402
from rewards import load_reward  # noqa: E402

console = Console()
REWARD = load_reward("math")


def workload(problems: int):
    return load_dataset("quickstart", limit=problems)


async def gym_tf_arm(backend, problems, group, max_tokens) -> tuple[int, float]:
    start = time.perf_counter()
    groups = await rollout_many(backend, problems, EMPTY_LIBRARY, group, Sampling(temperature=0.7, max_tokens=max_tokens),
                                REWARD, seed=0)
    elapsed = time.perf_counter() - start
    return sum(r.completion_tokens for g in groups.values() for r in g), elapsed


def plain_engine_arm(complete, problems, group, max_tokens) -> tuple[int, float]:
    """What a user would write by hand: a loop over problems and samples calling the engine, scoring each group.
    `complete` takes and returns an OpenAI-shaped chat completion dict."""
    start, tokens = time.perf_counter(), 0
    for problem in problems:
        seed = group_seed(0, "", problem.id)
        texts = []
        for i in range(group):
            reply = complete(dict(messages=build_messages(problem)[0], temperature=0.7, top_p=1.0, max_tokens=max_tokens,
                                  seed=seed + i))
            tokens += reply["usage"]["completion_tokens"]
            texts.append(reply["choices"][0]["message"]["content"])
        REWARD(texts, answer=problem.answer)
    return tokens, time.perf_counter() - start


def cpu_report() -> str:
    """The CPU's name, the vector flags that decide llama.cpp's kernels, and what the installed build uses."""
    name, flags = cpu_info()
    wanted = ["avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8",
              "amx_bf16"]
    used = [name for name, on in engine_features().items() if on == "1"]
    return (f"CPU: {name}; flags: {' '.join(f for f in wanted if f in flags) or 'none of ' + ','.join(wanted)}; "
            f"llama.cpp build uses: {' '.join(used)}")


async def plain_http_arm(base_url, model, problems, group, max_tokens, concurrency) -> tuple[int, float]:
    """The official client, one request per sample, `concurrency` in flight (1 = a sequential loop)."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key="EMPTY")
    slots = asyncio.Semaphore(concurrency)

    async def one(problem, i):
        async with slots:
            reply = await client.chat.completions.create(
                model=model, messages=build_messages(problem)[0], temperature=0.7, top_p=1.0, max_tokens=max_tokens,
                seed=group_seed(0, "", problem.id) + i)
            return reply.usage.completion_tokens, reply.choices[0].message.content

    async def group_of(problem):
        replies = await asyncio.gather(*(one(problem, i) for i in range(group)))
        REWARD([text for _, text in replies], answer=problem.answer)
        return sum(tokens for tokens, _ in replies)

    start = time.perf_counter()
    tokens = sum(await asyncio.gather(*(group_of(p) for p in problems)))
    elapsed = time.perf_counter() - start
    await client.close()
    return tokens, elapsed


def report(title: str, results: dict[str, tuple[int, float]], baseline: str, ours: str) -> None:
    table = Table(title=title)
    for column in ("arm", "tokens", "seconds", "tokens/s", "ratio to best plain"):
        table.add_column(column)
    best = max(t / s for name, (t, s) in results.items() if name.startswith("plain") or "native" in name)
    for name, (tokens, seconds) in results.items():
        table.add_row(name, str(tokens), f"{seconds:.1f}", f"{tokens / seconds:.1f}", f"{tokens / seconds / best:.3f}")
    console.print(table)
    ratio = (results[ours][0] / results[ours][1]) / best
    console.print(f"{title}: gym-tf / best plain client = {ratio:.3f} (target >= 0.95)")


def keep_best(results, name, value):
    if name not in results or value[0] / value[1] > results[name][0] / results[name][1]:
        results[name] = value


def bench_embedded(args) -> None:
    """One engine alive at a time: a second idle engine in the same process slows the first by about a quarter."""
    problems = workload(args.problems)
    results: dict[str, tuple[int, float]] = {}

    def on_engine(slots, run):
        def arm():
            backend = EmbeddedBackend(threads=args.threads, slots=slots)
            try:
                return run(backend)
            finally:
                asyncio.run(backend.aclose())
                del backend
                gc.collect()
        return arm

    arms = [
        ("plain loop on the engine", on_engine(1, lambda backend: plain_engine_arm(
            backend.server.handle_chat_completions, problems, args.group, args.max_tokens))),
        ("gym-tf engine", on_engine(SLOTS, lambda backend: asyncio.run(
            gym_tf_arm(backend, problems, args.group, args.max_tokens)))),
        # the engine as it was before groups decoded together: its samples one after another
        ("gym-tf engine, 1 slot", on_engine(1, lambda backend: asyncio.run(
            gym_tf_arm(backend, problems, args.group, args.max_tokens)))),
    ]
    if 1 < args.group < SLOTS:  # groups smaller than the engine (validation's pairs; at 1, the 1-slot arm above)
        arms.append((f"gym-tf engine, {args.group} slots", on_engine(args.group, lambda backend: asyncio.run(
            gym_tf_arm(backend, problems, args.group, args.max_tokens)))))
    try:  # a native llama.cpp build, if this machine has one, for the price of portability
        from llama_cpp import Llama

        def native_arm():
            native = Llama(model_path=str(default_model_path()), n_ctx=4096, n_threads=args.threads, verbose=False)
            try:
                return plain_engine_arm(lambda request: native.create_chat_completion(**request), problems,
                                        args.group, args.max_tokens)
            finally:
                native.close()
        arms.append(("llama-cpp-python, native build", native_arm))
    except ImportError:
        pass
    for repeat in range(args.repeats):
        for name, arm in arms if repeat % 2 == 0 else arms[::-1]:
            keep_best(results, name, arm())
    report(f"embedded (llama.cpp in-process, {args.threads} threads)", results, "plain loop on the engine",
           "gym-tf engine")
    tokens, seconds = results["gym-tf engine"]
    console.print(f"engine throughput on this CPU: {tokens / seconds:.1f} tok/s (target >= 18 on 2 threads)")
    alone = results["gym-tf engine, 1 slot"]
    console.print(f"gym-tf's engine ({SLOTS} slots) / every sample one after another (G={args.group}): "
                  f"{tokens / seconds / (alone[0] / alone[1]):.2f}x")
    if 1 < args.group < SLOTS:  # as the engine ran before concurrent requests shared its slots: one group at a time
        one_at_a_time = results[f"gym-tf engine, {args.group} slots"]
        console.print(f"groups of {args.group} sharing {SLOTS} slots / one group at a time: "
                      f"{tokens / seconds / (one_at_a_time[0] / one_at_a_time[1]):.2f}x")


@contextlib.contextmanager
def llama_server(port: int, slots: int):
    """llama.cpp's own server with `slots` slots in a child process (tests/llama_server.py), as `gym-tf serve` starts
    it in-process when no upstream is named; its base URL once it answers."""
    import httpx

    server = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve().parents[1] / "tests" / "llama_server.py"),
         str(default_model_path()), str(port), "m", str(slots)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(240):  # /v1/models answers while the model still loads; /health says 200 once it can decode
            if server.poll() is not None:
                raise RuntimeError(f"llama.cpp's server on port {port} exited with {server.returncode}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        else:
            raise RuntimeError(f"llama.cpp's server on port {port} not ready after 120 s")
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.terminate()
        server.wait()


def bench_server(args) -> None:
    """On llama.cpp's server with `SLOTS` slots, as `serve` starts it; and the same concurrent client on a one-slot
    server, as `serve` started it before: the speed-up that concurrent requests get from decoding together."""
    problems = workload(args.problems)
    results: dict[str, tuple[int, float]] = {}
    in_flight = f"plain client, {args.concurrency} in flight"
    for repeat in range(args.repeats):
        with llama_server(8765, SLOTS) as url:
            keep_best(results, "plain client, sequential",
                      asyncio.run(plain_http_arm(url, "m", problems, args.group, args.max_tokens, 1)))
            keep_best(results, in_flight,
                      asyncio.run(plain_http_arm(url, "m", problems, args.group, args.max_tokens, args.concurrency)))

            async def ours():
                backend = OpenAIBackend(url, "m", concurrency=args.concurrency)
                try:
                    return await gym_tf_arm(backend, problems, args.group, args.max_tokens)
                finally:
                    await backend.aclose()

            keep_best(results, "gym-tf engine", asyncio.run(ours()))
        with llama_server(8766, 1) as url:
            keep_best(results, f"1-slot server: {in_flight}", asyncio.run(
                plain_http_arm(url, "m", problems, args.group, args.max_tokens, args.concurrency)))
    report(f"OpenAI-compatible server (llama.cpp's server on loopback, {SLOTS} slots)", results,
           "plain client, sequential", "gym-tf engine")
    one_slot = results[f"1-slot server: {in_flight}"]
    many = results[in_flight]
    console.print(f"{args.concurrency} requests in flight, {SLOTS} slots / 1 slot: "
                  f"{many[0] / many[1] / (one_slot[0] / one_slot[1]):.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", type=int, default=3)
    parser.add_argument("--group", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--only", choices=["embedded", "server"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reward", default="math", help="the reward every arm scores with")
    args = parser.parse_args()
    REWARD = load_reward(args.reward)
    console.print(cpu_report(), highlight=False)
    if args.only != "server":
        bench_embedded(args)
    if args.only != "embedded":
        bench_server(args)
