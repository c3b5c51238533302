"""Serving replicas without a shared disk: a replica follows its primary's promotions through IPFS, verified first.

Two real `gym-tf serve` apps on loopback, each with its own workspace (SQLite file), a real Kubo node (the embedded
one) standing in for the IPFS network, the official openai client against the replica, a recording fake upstream.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import openai
import pytest
from eth_account import Account

from gym_tf.library import EMPTY_LIBRARY, AddOp, apply_ops, render_library
from gym_tf.publishing import publish
from gym_tf.store import RunStore
from ledger.ipfs import EmbeddedNode
from server import ServerConfig, create_app
from server.follow import Follower
from server.upstream import Upstream
from test_server import Running, received, start_fake


def wait_until(condition, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    return EmbeddedNode(tmp_path_factory.mktemp("ipfs") / "repo")


def test_a_replica_serves_what_the_primary_promotes_once_published_and_verified(tmp_path, node):
    signer, stranger = Account.create(), Account.create()
    primary = RunStore(tmp_path / "primary")
    v1, _ = apply_ops(EMPTY_LIBRARY, [AddOp(op="add", text="Check units before answering.")], step=1)
    v2, _ = apply_ops(v1, [AddOp(op="add", text="Verify the arithmetic twice.")], step=2)
    v3, _ = apply_ops(v2, [AddOp(op="add", text="A lesson signed by the wrong key.")], step=3)
    for v in (v1, v2, v3):
        primary.put_version(v, run_id="", status="promoted")
    publish(primary, v1.id, signer, node)
    primary.promote(v1.id)

    # Each server has a workspace connection of its own, as `gym-tf serve` has: a store's connection is used by one
    # thread at a time (gym_tf.store), and this test's writes and reads are another process's, in effect.
    process, upstream_url, record = start_fake(tmp_path)
    primary_server = Running(create_app(Upstream(upstream_url), RunStore(primary.root), ServerConfig(api_keys=["p"])))
    replica_store = RunStore(tmp_path / "replica")
    follower = Follower(RunStore(replica_store.root), primary_server.url, node, signer.address, api_key="p",
                        interval_s=0.1)
    replica = Running(create_app(Upstream(upstream_url), follower.store, ServerConfig(api_keys=["r"]),
                                 follower=follower))
    client = openai.OpenAI(base_url=replica.url, api_key="r", max_retries=0)
    ask = [{"role": "user", "content": "units?"}]
    try:
        assert wait_until(lambda: replica_store.served_version_id() == v1.id)
        reply = client.chat.completions.with_raw_response.create(model="m", messages=ask)
        assert reply.headers["x-gym-tf-library-version"] == v1.id
        assert received(record)[-1]["messages"][0]["content"] == render_library(v1, "units?")

        # promoted on the primary but not published: the replica keeps v1 and says why
        primary.promote(v2.id)
        assert wait_until(lambda: "has not published" in (follower.last_problem or ""))
        assert replica_store.served_version_id() == v1.id

        # published: it arrives, and the next request is answered with it
        start = time.monotonic()
        publish(primary, v2.id, signer, node)
        assert wait_until(lambda: replica_store.served_version_id() == v2.id), follower.last_problem
        arrived = time.monotonic() - start
        reply = client.chat.completions.with_raw_response.create(model="m", messages=ask)
        assert reply.headers["x-gym-tf-library-version"] == v2.id and arrived < 10

        # signed by someone else: refused for good, v2 stays
        bad = publish(primary, v3.id, stranger, node).manifest_address
        primary.promote(v3.id)
        assert wait_until(lambda: bad in follower.refused)
        assert "signature" in follower.last_problem and replica_store.served_version_id() == v2.id
        assert replica_store.version_row(v2.id)["status"] == "imported"  # verified import, like `gym-tf fetch`
    finally:
        replica.stop()
        primary_server.stop()
        process.kill()
        process.wait()


async def test_an_unreachable_primary_is_reported_and_nothing_changes(tmp_path, node):
    store = RunStore(tmp_path / "replica")
    follower = Follower(store, "http://127.0.0.1:9/v1", node, Account.create().address, interval_s=0.05)
    task = asyncio.create_task(follower.run())
    await asyncio.sleep(0.3)
    task.cancel()
    await follower.aclose()
    assert "cannot read http://127.0.0.1:9/v1/library" in follower.last_problem
    assert store.served_version_id() is None


async def test_a_replica_whose_workspace_fails_during_a_fetch_asks_again_and_does_not_refuse(tmp_path, node):
    """A full or locked workspace is the replica's trouble, not the manifest's: the next poll fetches it again."""
    import httpx

    from gym_tf.errors import StoreError

    store = RunStore(tmp_path / "replica")
    primary = httpx.MockTransport(lambda request: httpx.Response(200, json={"version": "v", "manifest": "bafy-manifest"}))
    follower = Follower(store, "http://primary/v1", node, Account.create().address, transport=primary)
    tries = []

    def fetch_fails(manifest):
        tries.append(manifest)
        raise StoreError(f"cannot write to the workspace {store.root} (database or disk is full)")

    follower._fetch = fetch_fails
    assert await follower.poll() is None and await follower.poll() is None
    assert tries == ["bafy-manifest", "bafy-manifest"] and not follower.refused
    assert "cannot fetch manifest bafy-manifest" in follower.last_problem and "disk is full" in follower.last_problem
    await follower.aclose()


async def test_a_replica_whose_workspace_fails_to_promote_asks_again_and_then_serves_it(tmp_path, node):
    """Fetched and verified, but the promotion's write failed (workspace locked past the busy wait, disk full): the
    next poll takes the manifest again and promotes it, rather than the follower stopping for good."""
    import httpx

    from gym_tf.errors import StoreError

    store = RunStore(tmp_path / "replica")
    version, _ = apply_ops(EMPTY_LIBRARY, [AddOp(op="add", text="Check units before answering.")], step=1)
    primary = httpx.MockTransport(lambda request: httpx.Response(200, json={"version": version.id,
                                                                            "manifest": "bafy-manifest"}))
    follower = Follower(store, "http://primary/v1", node, Account.create().address, transport=primary)

    def fetch(manifest):
        store.put_version(version, run_id="", status="imported")
        return version, {}

    promote, failures = store.promote, ["database is locked"]

    def promote_fails_once(version_id):
        if failures:
            raise StoreError(f"cannot write to the workspace {store.root} ({failures.pop()})")
        promote(version_id)

    follower._fetch, store.promote = fetch, promote_fails_once
    assert await follower.poll() is None and store.served_version_id() is None
    assert "database is locked" in follower.last_problem and not follower.refused
    assert await follower.poll() == version.id and store.served_version_id() == version.id
    assert follower.last_problem is None and follower.applied == "bafy-manifest"
    await follower.aclose()


async def test_a_poll_that_fails_unexpectedly_is_reported_and_the_follower_keeps_asking(tmp_path, node):
    store = RunStore(tmp_path / "replica")
    follower = Follower(store, "http://primary/v1", node, Account.create().address, interval_s=0.01)
    polls = []

    async def poll():
        polls.append(time.monotonic())
        if len(polls) == 1:
            raise RuntimeError("a bug in one poll")

    follower.poll = poll
    task = asyncio.create_task(follower.run())
    deadline = time.monotonic() + 10
    while len(polls) < 3 and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await follower.aclose()
    assert len(polls) >= 3, "the follower stopped asking after a failed poll"
    assert follower.last_problem == "one poll failed: RuntimeError: a bug in one poll"
