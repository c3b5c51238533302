"""Learning from production: a tenant's recorded traffic and feedback in, a gated library version served out.

    config = from_traffic(store, base_config, tenant="acme", since=parse_since("7d"), val_fraction=0.3)
    result = await Optimizer(config, store, backend).run()        # the ordinary loop, resumable as any run
    promoted = promote_if_passed(store, result.run_id)             # moves acme's served pointer, or explains why not

`watch` repeats this whenever enough new feedback has arrived. The served pointer moves only to a version that
passed the run's gate (validation on `--val-dataset`, or on a held-out slice of the feedback-labelled traffic)
and scores at least as well on it as the library it replaces; each promotion is recorded with that evidence.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from gym_tf.config import OptimizeConfig, TrafficSource
from gym_tf.errors import ConfigError
from gym_tf.optimize import GATE_TOLERANCE
from gym_tf.store import RunStore
from gym_tf.tenants import check_tenant
from gym_tf.traffic import TrafficLog, traffic_dataset
from ledger.cid import canonical


def from_traffic(store: RunStore, base: OptimizeConfig, tenant: str = "default", since: float = 0.0,
                 val_fraction: float = 0.0, fallback_reward: str = "majority") -> OptimizeConfig:
    """`base` with its problems replaced by a frozen snapshot of the tenant's traffic (a JSONL file in the
    workspace), its start library by the tenant's served version, and the traffic source recorded."""
    check_tenant(tenant)
    until = time.time()
    log = TrafficLog(store.root)
    try:
        train, val, counts = traffic_dataset(log, tenant, store.root / "traffic-snapshots", since, until, val_fraction)
    finally:
        log.close()
    if val_fraction and val is None:
        raise ConfigError(f"--val-fraction {val_fraction}: none of tenant {tenant!r}'s recorded requests has feedback "
                          "with an answer (a correction or a thumbs up) to hold out")
    source = TrafficSource(tenant=tenant, since=since, until=until, fallback_reward=fallback_reward,
                           val_fraction=val_fraction)
    return base.model_copy(update={
        "dataset": str(train), "val_dataset": str(val) if val else base.val_dataset, "problem_field": None,
        "answer_field": None, "start_library": store.served_version_id(tenant) or "empty", "traffic": source,
    })


@dataclass(frozen=True)
class Promotion:
    version_id: str | None  # None: nothing promoted
    reason: str


def promote_if_passed(store: RunStore, run_id: str) -> Promotion:
    """Serve the run's final library to its tenant if it passed the run's gate and is not worse on the held-out
    problems than the library the run started from. Recorded in `promotions` with the evaluation."""
    run = store.run(run_id)
    tenant = (run["config"].get("traffic") or {}).get("tenant", "default")
    if not run["config"].get("val_dataset"):
        return Promotion(None, "the run had no gate (--val-dataset or --val-fraction): nothing is promoted")
    if run["status"] != "finished":
        return Promotion(None, f"the run ended {run['status']}: nothing is promoted")
    steps = store.steps(run_id)
    start = steps[0]["version_before"] if steps else run["current_version"]
    final = run["current_version"]
    if final == start:
        return Promotion(None, "no candidate passed the gate: the served library stays")
    row = store.version_row(final)
    evaluation = json.loads(row["evaluation"] or "{}")
    baseline = run["summary"].get("val_baseline")
    if row["status"] != "promoted" or not evaluation or baseline is None:
        return Promotion(None, f"version {final} has no passing evaluation: the served library stays")
    if evaluation["val_mean"] < baseline - GATE_TOLERANCE:
        return Promotion(None, f"version {final} scores {evaluation['val_mean']:.3f} on the held-out problems, below "
                               f"the start library's {baseline:.3f}: the served library stays")
    before = store.served_version_id(tenant)
    evidence = {"evaluation": evaluation, "val_baseline": baseline, "val_dataset": run["config"]["val_dataset"]}
    with store.db.atomic():  # the pointer, the promotion row and its ledger leaf commit together
        store.promote(final, name=tenant)
        leaf = store.log_event(promotion_entry(final, tenant, run_id, before, evidence))
        store.db["promotions"].insert(
            {"version_id": final, "tenant": tenant, "run_id": run_id, "replaced": before, "created": time.time(),
             "evidence": json.dumps(evidence), "leaf_index": leaf}, alter=True)
    return Promotion(final, f"serving {final} to tenant {tenant!r} (held-out {evaluation['val_mean']:.3f} "
                            f"against {baseline:.3f})")


def promotion_entry(version_id: str, tenant: str, run_id: str, replaced: str | None,
                    evidence: dict[str, Any]) -> dict[str, Any]:
    """A promotion's Merkle log entry: what was served to whom, replacing what, and the digest of the evidence."""
    return {"kind": "promotion", "version": version_id, "tenant": tenant, "run": run_id, "replaced": replaced,
            "evidence_sha256": hashlib.sha256(canonical(evidence)).hexdigest()}


def last_learned(store: RunStore, tenant: str) -> float:
    """When the tenant's newest from-traffic run froze its snapshot (0: never)."""
    times = [run["config"]["traffic"]["until"] for run in (store.run(r["id"]) for r in store.runs()
             if r["kind"] == "optimize") if (run["config"].get("traffic") or {}).get("tenant") == tenant]
    return max(times, default=0.0)


def promotions(store: RunStore, tenant: str | None = None) -> list[dict[str, Any]]:
    if "promotions" not in store.db.table_names():
        return []
    where, args = ("tenant = ?", [tenant]) if tenant else (None, None)
    return [{**r, "evidence": json.loads(r["evidence"])}
            for r in store.db["promotions"].rows_where(where, args, order_by="created")]


async def watch(store: RunStore, make_config: Callable[[], OptimizeConfig],
                run: Callable[[OptimizeConfig], Awaitable[str]], tenant: str, min_feedback: int,
                interval_s: float = 60.0, rounds: int | None = None,
                on_round: Callable[[str], None] = lambda line: None) -> list[Promotion]:
    """Learn whenever `min_feedback` new feedback rows have arrived for the tenant since its last learning run
    (any from-traffic run of that tenant, this process's or an earlier one's); promote only what passes.
    `run(config)` runs one optimize and returns its run id; `rounds` bounds the learning runs (None: forever)."""
    log = TrafficLog(store.root)
    done: list[Promotion] = []
    try:
        while rounds is None or len(done) < rounds:
            fresh = log.counts(tenant, since=last_learned(store, tenant))["feedback"]
            if fresh < min_feedback:
                on_round(f"{fresh} new feedback for {tenant!r}, waiting for {min_feedback}")
                await asyncio.sleep(interval_s)
                continue
            try:
                config = make_config()
            except ConfigError as exc:  # e.g. nothing labelled to hold out yet: wait for more feedback
                on_round(f"not learning yet: {exc}")
                await asyncio.sleep(interval_s)
                continue
            run_id = await run(config)
            done.append(promote_if_passed(store, run_id))
            on_round(f"run {run_id}: {done[-1].reason}")
    finally:
        log.close()
    return done
