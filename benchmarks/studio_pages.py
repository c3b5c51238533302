"""Studio page times on a workspace of real size: 10,000 rollouts, 1,000 library versions, 20,000 learner calls.

    python benchmarks/studio_pages.py [--workspace DIR] [--repeats 5]

The workspace is generated through the store's own write paths (`put_rollouts`, `put_learner_call`,
`commit_step`, which also appends each version to the Merkle log), as one optimize run of 1,000 steps (2 problems x
5 samples and 20 learner calls a step, a library held near 40 items by adding one lesson and deleting the oldest,
10% of candidates rejected by the gate) beside five small runs, an eval report, a publication and an anchor. Each
page, HTML and its JSON twin, is then requested in-process through the ASGI app (Starlette's TestClient): one
warm-up, then `--repeats` timed requests; the table shows the median and the slowest. Target: every page < 300 ms.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table
from starlette.testclient import TestClient

from gym_tf.library import EMPTY_LIBRARY, AddOp, DeleteOp, ExampleOp, Provenance, apply_ops
from gym_tf.rollouts import Rollout
from gym_tf.store import RunStore, rollout_key
from gym_tf.studio import StudioConfig, studio_app

STEPS, PROBLEMS, SAMPLES, CALLS, KEEP = 1000, 2, 5, 20, 40
PROMPT = "Solve the problem step by step and put the final answer in \\boxed{}. " * 12
console = Console()


def generate(root: Path) -> dict:
    store = RunStore(root)
    run_id = store.new_run("optimize", {"bench": True}, "bench-model", "bench.jsonl", EMPTY_LIBRARY.id)
    library = EMPTY_LIBRARY
    first_item_version = None
    for step in range(1, STEPS + 1):
        pids = [f"p{(step * PROBLEMS + i) % 500}" for i in range(PROBLEMS)]
        rollouts = [Rollout(problem_id=pid, sample=s, messages=[{"role": "system", "content": PROMPT},
                                                               {"role": "user", "content": f"What is {step} + {s}?"}],
                            completion=f"Adding step by step... \\boxed{{{step + s}}}" * 4, finish_reason="stop",
                            prompt_tokens=180, completion_tokens=60, latency_s=0.5, reward=float((step + s) % 2),
                            library_version=library.id, shown=tuple(i.id for i in library.items[:5]))
                    for pid in pids for s in range(SAMPLES)]
        store.put_rollouts(run_id, 0, step, rollouts)
        for c in range(CALLS):
            stage = "summarize" if c < 10 else "extract" if c < 18 else "consolidate"
            subject = f"{pids[c % PROBLEMS]}/{c % SAMPLES}" if stage == "summarize" else pids[c % PROBLEMS] \
                if stage == "extract" else "batch"
            store.put_learner_call(run_id, step, stage, subject, c, messages=[{"role": "user", "content": PROMPT * 3}],
                                   reply=json.dumps({"operations": [{"op": "add", "text": f"Lesson {step}.{c}: check work."}]}),
                                   prompt_tokens=900, completion_tokens=40, valid=1, error=None)
        ops = [AddOp(op="add", text=f"Lesson from step {step}: re-check every carry before boxing.")]
        if len(library.items) >= KEEP:
            ops.append(DeleteOp(op="delete", id=library.items[0].id))
        if step % 50 == 0:
            ops.append(ExampleOp(op="example", text=f"Problem: What is {step} + 1?\nSolution: {step + 1}"))
        origin = Provenance(step=step, op="add", problem_ids=tuple(pids),
                            rollout_ids=tuple(rollout_key(run_id, step, pid, s) for pid in pids for s in range(SAMPLES)))
        candidate, verdicts = apply_ops(library, ops + [DeleteOp(op="delete", id="E999999")], step,
                                        {i: origin for i in range(len(ops))})
        rejected = step % 10 == 0
        evaluation = {"val_mean": 0.5 + (step % 7) / 100, "diff": -0.05 if rejected else 0.02,
                      "low": -0.09 if rejected else -0.03, "high": -0.01 if rejected else 0.07}
        stats = {"groups_used": PROBLEMS, "groups_skipped": 0, "mean_reward": 0.5, "ops_applied": len(ops),
                 "ops_rejected": 1, "val_mean": evaluation["val_mean"], "best_scores": None}
        store.commit_step(run_id, step, 0, step, library, candidate, [("apply", v) for v in verdicts],
                          "rejected" if rejected else "promoted", {"rollout": {"prompt": 1, "completion": 1}}, stats,
                          "hash", evaluation)
        if not rejected:
            library = candidate
            first_item_version = first_item_version or candidate.id
    store.finish_run(run_id, "finished", {"steps": STEPS, "val_baseline": 0.5})
    for extra in range(5):
        small = store.new_run("optimize", {"small": extra}, "bench-model", "small.jsonl", EMPTY_LIBRARY.id)
        store.finish_run(small, "finished", {"steps": 0})
    store.promote(library.id)
    arms = [{"name": n, "library_version": v, "library_items": k,
             "metrics": {m: {"value": 0.5, "low": 0.4, "high": 0.6} for m in ("mean_at_k", "pass_at_k", "majority")},
             "tokens": {"prompt": 1, "completion": 1, "prompt_per_call": 1.0, "learning": 0},
             "mean_vs_baseline": None, "majority_vs_baseline": None, "mean_vs_baseline_majority": None}
            for n, v, k in (("none", EMPTY_LIBRARY.id, 0), (library.id, library.id, len(library.items)))]
    per_problem = {a["name"]: {f"p{i}": {"mean": 0.5, "majority": 1.0, "rewards": [1, 0]} for i in range(200)}
                   for a in arms}
    evaluation_id = store.put_evaluation({"arms": arms, "baseline": "none", "per_problem": per_problem},
                                         "bench.jsonl", "bench-model", 200, 2)
    store.db["publications"].insert({"manifest": "bafkreimanifest", "version_id": library.id, "transport": "memory",
                                     "signer": "0x0", "created": time.time(), "direction": "out"})
    store.db["anchors"].insert({"tx": "0xabc", "root": store.ledger.root(), "tree_size": store.ledger.size,
                                "rpc_url": "", "created": time.time()})
    return {"store": store, "run": run_id, "library": library, "first": first_item_version,
            "evaluation": evaluation_id}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workspace", type=Path, help="generate here (default: a temporary folder)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    root = args.workspace or Path(tempfile.mkdtemp()) / "ws"
    start = time.perf_counter()
    ws = generate(root)
    store = ws["store"]
    counts = {t: store.db[t].count for t in ("rollouts", "versions", "learner_calls", "ops", "leaf")}
    console.print(f"generated in {time.perf_counter() - start:.1f} s: {counts}; "
                  f"{(root / 'gym-tf.db').stat().st_size / 1e6:.0f} MB", highlight=False)
    run, library = ws["run"], ws["library"]
    call = store.db.execute("select max(rowid) from learner_calls").fetchone()[0]
    rollout = store.db.execute("select max(rowid) from rollouts").fetchone()[0]
    item = library.items[-1]
    pages = {
        "runs": "/ui/runs", "run": f"/ui/runs/{run}", "run, calls page 100": f"/ui/runs/{run}?page=100",
        "step": f"/ui/runs/{run}/steps/500", "learner call": f"/ui/calls/{call}", "rollout": f"/ui/rollouts/{rollout}",
        "versions": "/ui/versions", "versions page 10": "/ui/versions?page=10", "version": f"/ui/versions/{library.id}",
        "item provenance": f"/ui/versions/{library.id}/items/{item.id}",
        "diff, 1,000 steps apart": f"/ui/diff?a={EMPTY_LIBRARY.id}&b={library.id}",
        "diff, parent": f"/ui/diff?a={library.parent}&b={library.id}",
        "evaluations": "/ui/evaluations", "evaluation": f"/ui/evaluations/{ws['evaluation']}",
        "ledger": "/ui/ledger", "ledger page 10": "/ui/ledger?page=10",
    }
    client = TestClient(studio_app(store, StudioConfig(keys=["k"])))
    headers = {"Authorization": "Bearer k"}
    table = Table(title=f"studio pages, ms (median / slowest of {args.repeats}); target < 300 ms")
    for column in ("page", "HTML", "JSON", "KB"):
        table.add_column(column, justify="left" if column == "page" else "right")
    worst = 0.0
    for name, path in pages.items():
        cells = []
        for url in (path, path.replace("?", ".json?", 1) if "?" in path else path + ".json"):
            assert client.get(url, headers=headers).status_code == 200, url  # warm-up (and a check)
            times = []
            for _ in range(args.repeats):
                t = time.perf_counter()
                reply = client.get(url, headers=headers)
                times.append((time.perf_counter() - t) * 1000)
            worst = max(worst, max(times))
            cells.append(f"{statistics.median(times):.0f} / {max(times):.0f}")
        table.add_row(name, *cells, f"{len(reply.content) / 1000:.0f}")
    console.print(table)
    console.print(f"slowest request: {worst:.0f} ms ({'within' if worst < 300 else 'OVER'} the 300 ms target)")


if __name__ == "__main__":
    main()
