"""Many replicas of one model: least outstanding requests, failover without losing a rollout, adaptive limits."""

from __future__ import annotations

import asyncio
import json
import math
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from fake_fleet import SimulatedEngine
from gym_tf.backends import BackendConfig, Sampling, make_backend
from gym_tf.backends.fleet import FleetBackend
from gym_tf.backends.limits import ConcurrencyLimit
from gym_tf.backends.openai_http import OpenAIBackend
from gym_tf.datasets import Problem
from gym_tf.errors import BackendRequestFailed
from gym_tf.library import EMPTY_LIBRARY
from gym_tf.rollouts import rollout_many

TESTS = Path(__file__).parent


def fleet(engines: list[SimulatedEngine], concurrency: int = 4, adaptive: bool = False) -> FleetBackend:
    members = [OpenAIBackend(f"http://{e.name}/v1", "sim", concurrency=concurrency, max_retries=0,
                             transport=e.transport(), adaptive=adaptive) for e in engines]
    return FleetBackend(members, cooldown_s=0.2, retry_wait_s=0.01)


def problems(count: int) -> list[Problem]:
    return [Problem(id=f"p{i}", problem=f"question {i}", answer="1") for i in range(count)]


def length_reward(completions, **_):
    return [float(len(c) > 0) for c in completions]


async def roll(backend, count: int, group: int = 4):
    return await rollout_many(backend, problems(count), EMPTY_LIBRARY, group, Sampling(max_tokens=32), length_reward,
                              seed=0)


async def test_groups_spread_over_replicas_one_request_per_group():
    engines = [SimulatedEngine(f"r{i}", batch=8, token_s=0.001) for i in range(4)]
    groups = await roll(fleet(engines, concurrency=2), 40)
    assert sorted(groups) == sorted(f"p{i}" for i in range(40))
    assert all(len(g) == 4 and all(r.reward == 1.0 for r in g) for g in groups.values())
    # n=G in one request per group: 40 requests in all, every replica took a share, none past its limit of 2.
    assert sum(e.requests for e in engines) == 40
    assert all(e.requests >= 5 for e in engines), [e.requests for e in engines]
    assert max(e.peak_in_flight for e in engines) == 2


async def test_a_replica_killed_mid_run_loses_no_rollout():
    engines = [SimulatedEngine(f"r{i}", batch=8, token_s=0.002) for i in range(3)]
    backend = fleet(engines)

    async def kill_soon():
        await asyncio.sleep(0.15)
        engines[0].down = True

    groups, _ = await asyncio.gather(roll(backend, 60), kill_soon())
    assert sorted(groups) == sorted(f"p{i}" for i in range(60))  # every group, each exactly once
    assert all(len(g) == 4 and {r.sample for r in g} == {0, 1, 2, 3} for g in groups.values())
    assert engines[0].requests > 0 and engines[0].down
    assert backend.replicas[0].failures >= 1
    # the survivors finished what the dead one dropped
    done = sum(len(e.completed) for e in engines[1:])
    assert done >= 4 * 60 - len(engines[0].completed)


async def test_5xx_replica_is_left_and_bad_requests_are_not_retried_elsewhere():
    sick, well = SimulatedEngine("sick"), SimulatedEngine("well")
    sick.fail_5xx = True
    backend = fleet([sick, well])
    groups = await roll(backend, 10)
    assert len(groups) == 10 and len(well.completed) == 40 and not sick.completed

    refusing = httpx.MockTransport(lambda request: httpx.Response(400, json={"error": {"message": "bad n"}}))
    calls = []
    counting = httpx.MockTransport(lambda request: calls.append(1) or httpx.Response(500, json={}))
    two = FleetBackend([OpenAIBackend("http://a/v1", "sim", max_retries=0, transport=refusing),
                        OpenAIBackend("http://b/v1", "sim", max_retries=0, transport=counting)])
    two.replicas[1].down_until = float("inf")  # make the 400 replica the one picked
    with pytest.raises(BackendRequestFailed, match="400"):
        await two.generate([{"role": "user", "content": "x"}], n=1)
    assert not calls


async def test_every_replica_down_fails_with_the_last_error():
    engines = [SimulatedEngine("a"), SimulatedEngine("b")]
    for e in engines:
        e.down = True
    backend = fleet(engines)
    backend.max_rounds = 2
    with pytest.raises(Exception, match="cannot reach"):
        await backend.generate([{"role": "user", "content": "x"}], n=2)


def settle(latency, windows: int = 80, start: int = 1) -> list[int]:
    """The adaptive limit from `start`, fed `latency(in_flight, answers so far)` per token a window at a time: its
    limit after each window."""
    limit = ConcurrencyLimit(start, adaptive=True)
    history, answers = [], 0
    for _ in range(windows):
        in_flight = int(limit.limit)
        for _ in range(max(4, in_flight)):
            limit.observe(latency(in_flight, answers), 1)
            answers += 1
        history.append(int(limit.limit))
    return history


def test_adaptive_limit_keeps_a_continuous_batching_engine_full():
    """An engine whose sequences finish at staggered times: time per token is flat up to 16 in flight, then grows
    with the queue."""
    history = settle(lambda in_flight, _: 0.01 * max(1.0, in_flight / 16))
    assert history[4] >= 16  # doubling from 1 reaches the batch within a few windows
    assert all(32 <= h <= 45 for h in history[-20:]), history[-20:]  # full, with about one batch queued
    limit = ConcurrencyLimit(40, adaptive=True)
    limit.overloaded()
    assert limit.limit == pytest.approx(20) and not limit.slow_start


@pytest.mark.parametrize("batch", [4, 64])
def test_adaptive_limit_refills_an_engine_whose_whole_batch_finishes_at_once(batch):
    """Equal-length answers finish together: a request waits whole batch times, and when the batch ends only what is
    already queued can start at once. A 16-sequence engine with G=4 takes 4 requests; the old tolerance of 1.25
    settled at 7 of them, so a quarter of the batch stood empty each turn (0.80 of capacity in the fleet benchmark)."""
    history = settle(lambda in_flight, _: 0.01 * math.ceil(in_flight / batch))
    restarted = [min(batch, h - batch) / batch for h in history[-20:]]  # share of the batch queued to start at once
    assert min(restarted) >= 0.8, history[-20:]


def test_one_slow_first_window_does_not_end_the_doubling():
    """The first answers wait while the client launches every group at once (3,072 at 64 replicas): 3 of the first
    window's 4 are three times slow; then an engine of 4 requests whose batch finishes together."""
    history = settle(lambda in_flight, answers: 0.01 * math.ceil(in_flight / 4) * (3 if answers < 3 else 1), start=2)
    assert history[0] < 4 and history[3] >= 8, history[:6]  # held back once, then doubling again


async def test_adaptive_limit_fills_a_simulated_engine():
    engine = SimulatedEngine("one", batch=16, token_s=0.01, tokens=16)
    backend = fleet([engine], concurrency=1, adaptive=True)
    await roll(backend, 300, group=1)
    assert engine.peak == 16  # from a limit of 1, the engine was filled
    assert backend.replicas[0].backend.slots.limit >= 8  # timing noise on a busy machine may shrink it some


def test_fixed_limit_never_moves():
    limit = ConcurrencyLimit(3)
    for _ in range(50):
        limit.observe(1.0, 10)
    limit.overloaded()
    assert limit.limit == 3


# --- real servers ---------------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_cli_eval_over_two_base_urls_survives_a_dead_one(tmp_path):
    """`--base-url` twice, the first pointing at nothing: the eval finishes on the live server, every problem."""
    port, dead = free_port(), free_port()
    record = tmp_path / "bodies.jsonl"
    server = subprocess.Popen([sys.executable, str(TESTS / "fake_upstream.py"), str(port), str(record), "1", "0"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=1)
                break
            except httpx.HTTPError:
                import time

                time.sleep(0.1)
        report = tmp_path / "report.json"
        result = subprocess.run(
            [sys.executable, "-m", "gym_tf", "eval", "--dataset", "quickstart", "--limit", "5", "-k", "2",
             "--base-url", f"http://127.0.0.1:{dead}/v1", "--base-url", f"http://127.0.0.1:{port}/v1",
             "--concurrency", "auto", "--report", str(report), "--workspace", str(tmp_path / "ws")],
            capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        bodies = [json.loads(line) for line in record.read_text().splitlines()]
        assert len(bodies) == 5 and all(b["n"] == 2 for b in bodies)  # one request per group, all on the live one
        assert len(json.loads(report.read_text())["problems"]) == 5
    finally:
        server.kill()
        server.wait()


async def test_make_backend_builds_a_fleet_from_replicas():
    config = BackendConfig(base_url="http://127.0.0.1:9/v1", replicas=("http://127.0.0.1:10/v1",), model="m",
                           concurrency=3, adaptive_concurrency=True)
    with pytest.raises(Exception, match="cannot reach"):
        await make_backend(config)  # both down: the fleet's check fails like a single server's would
    with pytest.raises(ValueError, match="replicas need base_url"):
        BackendConfig(replicas=("http://x/v1",))


def test_serve_over_two_upstreams_keeps_answering_when_one_dies(tmp_path):
    """`gym-tf serve --upstream A --upstream B` as a pool: kill A, and plain and streamed requests still succeed."""
    import openai

    from gym_tf.store import RunStore
    from server import ServerConfig, create_app
    from server.upstream import Upstream, UpstreamPool
    from test_server import Running, received, start_fake

    a, url_a, record_a = start_fake(tmp_path)
    b, url_b, record_b = start_fake(tmp_path)
    pool = UpstreamPool([Upstream(url_a), Upstream(url_b)], cooldown_s=30)
    running = Running(create_app(pool, RunStore(tmp_path / "ws"), ServerConfig()))
    client = openai.OpenAI(base_url=running.url, api_key="x", max_retries=0)
    ask = [{"role": "user", "content": "hi"}]
    try:
        for _ in range(4):
            client.chat.completions.create(model="m", messages=ask)
        assert received(record_a) and received(record_b)  # both took a share
        a.kill()
        a.wait()
        before = len(received(record_b))
        for _ in range(3):
            assert client.chat.completions.create(model="m", messages=ask).choices[0].message.content
        chunks = list(client.chat.completions.create(model="m", messages=ask, stream=True))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hello from the fake upstream."
        assert len(received(record_b)) == before + 4
    finally:
        running.stop()
        for p in (a, b):
            p.kill()
            p.wait()
