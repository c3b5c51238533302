"""Rollout throughput against a fleet of simulated vLLM-like replicas, 1 to 64 of them, as a share of the fleet's capacity.

    python benchmarks/fleet_throughput.py
    python benchmarks/fleet_throughput.py --replicas 1,8,64 --waves 20

Each replica (tests/fake_fleet.py) runs up to `--batch` sequences at a fixed time per token and queues the rest, as
vLLM does, on its own clock (it does not wait for this process's event loop to start a queued request); its
capacity is batch / (tokens x time per token). The fleet's capacity is the sum. gym-tf rolls out
groups of G (one `n=G` request each) through its fleet backend, and the ratio printed is the sequences per second it
got in steady state (the middle 60% of completions: ramp-up and the last partial wave are not the fleet's fault)
over the fleet's capacity. Target: >= 0.95 from 1 to 64 replicas.

The aggregate capacity is held the same at every size (each replica is made slower as there are more), so that the
simulated engines never outrun this one Python process: what changes is how the work must be spread. Arms:
`fixed 2` (too few requests per replica to fill its batch: what a fixed limit set too low costs), `fixed 8`, and
`auto` (the adaptive limit, starting at 2). CPU per rollout is this process's CPU time, simulator included, per
sequence: an upper bound on gym-tf's own.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from fake_fleet import SimulatedEngine  # noqa: E402
from gym_tf.backends import Sampling  # noqa: E402
from gym_tf.backends.fleet import FleetBackend  # noqa: E402
from gym_tf.backends.openai_http import OpenAIBackend  # noqa: E402
from gym_tf.datasets import Problem  # noqa: E402
from gym_tf.library import EMPTY_LIBRARY  # noqa: E402
from gym_tf.rollouts import rollout_many  # noqa: E402


def answered(completions, **_):
    return [1.0 if c else 0.0 for c in completions]


def steady_rate(finished: list[float]) -> float:
    """Sequences per second over the middle 60% of finish times: the least-squares slope of sequences finished
    against time. (Batches finish in clusters; counting between two finish times over- or understates the rate by
    where the window's edges fall among the clusters: 0.99 to 1.03 of capacity on one full engine.)"""
    middle = sorted(finished)[int(0.2 * len(finished)):int(0.8 * len(finished))]
    mean_t, mean_i = sum(middle) / len(middle), (len(middle) - 1) / 2
    spread = sum((t - mean_t) ** 2 for t in middle)
    return sum((t - mean_t) * (i - mean_i) for i, t in enumerate(middle)) / max(1e-12, spread)


async def arm(replicas: int, concurrency: int, adaptive: bool, args) -> dict:
    token_s = replicas * args.batch / (args.rate * args.tokens)
    engines = [SimulatedEngine(f"r{i}", batch=args.batch, token_s=token_s, tokens=args.tokens) for i in range(replicas)]
    fleet = FleetBackend([OpenAIBackend(f"http://r{i}/v1", "sim", concurrency=concurrency, max_retries=0,
                                        transport=e.transport(), adaptive=adaptive) for i, e in enumerate(engines)])
    # at least --min-sequences: a few replicas at 12 waves finish only a few hundred sequences, a short base for
    # the slope
    groups = max(args.waves * replicas * args.batch, args.min_sequences) // args.group
    problems = [Problem(id=f"p{i}", problem=f"question {i}", answer="1") for i in range(groups)]
    cpu, wall = time.process_time(), time.perf_counter()
    done = await rollout_many(fleet, problems, EMPTY_LIBRARY, args.group, Sampling(max_tokens=args.tokens), answered,
                              seed=0)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    sequences = sum(len(g) for g in done.values())
    assert sequences == groups * args.group, "a rollout was lost"
    capacity = sum(e.capacity for e in engines)
    rate = steady_rate([t for e in engines for t in e.completed])
    await fleet.aclose()
    return {"ratio": rate / capacity, "rate": rate, "capacity": capacity, "cpu_ms": 1000 * cpu / sequences,
            "wall": wall, "limit": sum(r.backend.slots.limit for r in fleet.replicas) / replicas,
            "spread": min(e.requests for e in engines) / max(1, max(e.requests for e in engines))}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", default="1,2,4,8,16,32,64")
    parser.add_argument("--batch", type=int, default=16, help="sequences one replica runs at once")
    parser.add_argument("--tokens", type=int, default=32, help="tokens per answer")
    parser.add_argument("--group", type=int, default=4, help="G: samples per problem, one request")
    parser.add_argument("--rate", type=float, default=400.0, help="the fleet's capacity, sequences per second")
    parser.add_argument("--waves", type=int, default=12, help="work per run, in full batches of every replica")
    parser.add_argument("--min-sequences", type=int, default=1536, help="work per run, at least")
    args = parser.parse_args()
    console = Console()
    table = Table(title=f"gym-tf rollouts / fleet capacity (batch {args.batch}, G {args.group}, "
                        f"{args.rate:.0f} sequences/s in all)")
    for column in ("replicas", "arm", "ratio", "sequences/s", "mean limit", "spread (min/max requests)",
                   "CPU ms / rollout", "wall s"):
        table.add_column(column, justify="right")
    for replicas in [int(r) for r in args.replicas.split(",")]:
        for name, concurrency, adaptive in (("fixed 2", 2, False), ("fixed 8", 8, False), ("auto", 2, True)):
            r = await arm(replicas, concurrency, adaptive, args)
            table.add_row(str(replicas), name, f"{r['ratio']:.3f}", f"{r['rate']:.0f}", f"{r['limit']:.1f}",
                          f"{r['spread']:.2f}", f"{r['cpu_ms']:.2f}", f"{r['wall']:.1f}")
            console.print(f"{replicas:>3} replicas {name:>8}: ratio {r['ratio']:.3f}", highlight=False)
    console.print(table)


if __name__ == "__main__":
    asyncio.run(main())
