"""What the studio shows, read from the workspace database: one function per page, each a few indexed queries.

Every function takes a read-only connection and returns plain JSON-ready values. The HTML page and its `.json`
twin render the same value, so the numbers a person sees are the numbers a test or a script reads.
Unknown or malformed ids raise `UnknownRun`, `UnknownVersion` or `UnknownRecord` (a 404, never a 500).
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

from gym_tf.errors import UnknownRecord, UnknownRun, UnknownVersion
from gym_tf.library import example_parts
from gym_tf.store import HINTED_ANSWER, LEARNER_ANSWER, ROLLOUT_STAGE_SQL, reference_answer, shown_status
from ledger.cid import cid
from ledger.errors import LedgerError
from ledger.log import MerkleLog, verify_entry

PAGE_SIZE = 100
MAX_ID = 200  # longer ids than this name nothing we store; refused before any query


def _rows(con: sqlite3.Connection, sql: str, args: Any = ()) -> list[dict[str, Any]]:
    cursor = con.execute(sql, args)
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row)) for row in cursor.fetchall()]


def _one(con: sqlite3.Connection, sql: str, args: Any, missing: Exception) -> dict[str, Any]:
    rows = _rows(con, sql, args)
    if not rows:
        raise missing
    return rows[0]


def _has_table(con: sqlite3.Connection, name: str) -> bool:
    return con.execute("select 1 from sqlite_master where type = 'table' and name = ?", [name]).fetchone() is not None


def _check_id(value: str, what: Exception) -> str:
    if not value or len(value) > MAX_ID or "\x00" in value:
        raise what
    return value


def served_version_id(con: sqlite3.Connection) -> str | None:
    row = con.execute("select version_id from serving where name = 'default'").fetchone()
    return row[0] if row else None


def _usage_by_run(con: sqlite3.Connection, run_id: str | None = None) -> dict[str, dict[str, dict[str, int]]]:
    """Prompt and completion tokens per run and stage, as `RunStore.usage` sums them."""
    where = "where run_id = ?" if run_id else ""
    args = [run_id, run_id] if run_id else []
    totals: dict[str, dict[str, dict[str, int]]] = {}
    for run, stage, prompt, completion in con.execute(
        f"select run_id, {ROLLOUT_STAGE_SQL}, sum(prompt_tokens), "
        f"sum(completion_tokens) from rollouts {where} group by 1, 2 union all "
        f"select run_id, stage, sum(prompt_tokens), sum(completion_tokens) from learner_calls {where} group by 1, 2",
        args,
    ):
        if prompt is not None:
            totals.setdefault(run, {})[stage] = {"prompt": prompt, "completion": completion}
    return totals


# --- runs -------------------------------------------------------------------------------------------------------------


def runs(con: sqlite3.Connection, root: Path) -> dict[str, Any]:
    """Every run, newest first: status (a dead heartbeat shows as crashed), model, dataset, steps, tokens per stage,
    wall time."""
    steps = {r: n for r, n in con.execute("select run_id, count(*) from steps group by run_id")}
    usage = _usage_by_run(con)
    now = time.time()
    out = []
    for row in _rows(con, "select id, kind, status, created, updated, model, dataset, current_version, owner, "
                          "heartbeat from runs order by created desc"):
        status = shown_status(root, row)
        tokens = usage.get(row["id"], {})
        out.append({
            "id": row["id"], "kind": row["kind"], "status": status, "model": row["model"], "dataset": row["dataset"],
            "current_version": row["current_version"], "steps": steps.get(row["id"], 0), "tokens": tokens,
            "tokens_total": sum(t["prompt"] + t["completion"] for t in tokens.values()),
            "created": row["created"],
            "wall_s": round((now if status == "running" else row["updated"]) - row["created"], 1),
        })
    return {"runs": out, "live": any(r["status"] == "running" for r in out)}


def run(con: sqlite3.Connection, root: Path, run_id: str, page: int = 1) -> dict[str, Any]:
    """A run: per step its train reward, validation score with the gate's interval, library size, groups and ops;
    its rejected ops with reasons; its learner calls, a page at a time."""
    _check_id(run_id, UnknownRun(f"no run {run_id!r}"))
    row = _one(con, "select * from runs where id = ?", [run_id], UnknownRun(f"no run {run_id!r}"))
    summary = json.loads(row["summary"] or "{}")
    status = shown_status(root, row)
    candidates = {r["step"]: r for r in _rows(
        con, "select id, step, status, evaluation from versions where run_id = ? and step > 0", [run_id])}
    step_rows = _rows(con, "select step, epoch, batch, status, version_before, version_after, tokens, stats, committed "
                           "from steps where run_id = ? order by step", [run_id])
    sizes = item_counts(con, [s["version_after"] for s in step_rows])
    steps = []
    for s in step_rows:
        stats = json.loads(s["stats"] or "{}")
        candidate = candidates.get(s["step"])
        evaluation = json.loads(candidate["evaluation"] or "{}") if candidate else {}
        steps.append({
            "step": s["step"], "epoch": s["epoch"], "status": s["status"],
            "train_reward": stats.get("mean_reward", stats.get("reward")),
            "val_mean": stats.get("val_mean"),
            "gate": ({"diff": evaluation["diff"], "low": evaluation["low"], "high": evaluation["high"],
                      "verdict": candidate["status"], "version": candidate["id"]} if "diff" in evaluation else None),
            "library_size": sizes.get(s["version_after"], 0), "groups_used": stats.get("groups_used"),
            "groups_skipped": stats.get("groups_skipped"), "ops_applied": stats.get("ops_applied"),
            "ops_rejected": stats.get("ops_rejected"), "version_after": s["version_after"],
            "tokens": sum(t.get("prompt", 0) + t.get("completion", 0) for t in json.loads(s["tokens"] or "{}").values()),
        })
    ops = dict(con.execute("select accepted, count(*) from ops where run_id = ? group by accepted", [run_id]))
    rejected = _rows(con, "select step, stage, seq, op, reason from ops where run_id = ? and accepted = 0 "
                          "order by step, seq limit 500", [run_id])
    calls_total = con.execute("select count(*) from learner_calls where run_id = ?", [run_id]).fetchone()[0]
    page = max(1, min(page, max(1, -(-calls_total // PAGE_SIZE))))
    calls = _rows(con, "select rowid as id, step, stage, subject, attempt, valid, error, prompt_tokens, "
                       "completion_tokens from learner_calls where run_id = ? order by step, rowid limit ? offset ?",
                  [run_id, PAGE_SIZE, (page - 1) * PAGE_SIZE])
    tokens = _usage_by_run(con, run_id).get(run_id, {})
    return {
        "run": {"id": row["id"], "kind": row["kind"], "status": status, "model": row["model"],
                "dataset": row["dataset"], "current_version": row["current_version"], "created": row["created"],
                "wall_s": round((time.time() if status == "running" else row["updated"]) - row["created"], 1),
                "config": json.loads(row["config"] or "{}"), "summary": summary},
        "val_baseline": summary.get("val_baseline"),
        "steps": steps,
        "groups_used": sum(s["groups_used"] or 0 for s in steps),
        "groups_skipped": sum(s["groups_skipped"] or 0 for s in steps),
        "library_size": steps[-1]["library_size"] if steps else 0,
        "ops_applied": ops.get(1, 0), "ops_rejected": ops.get(0, 0),
        "rejected_ops": [{**r, "op": _loads(r["op"])} for r in rejected],
        "tokens": tokens, "tokens_total": sum(t["prompt"] + t["completion"] for t in tokens.values()),
        "calls": calls, "calls_total": calls_total, "page": page, "pages": max(1, -(-calls_total // PAGE_SIZE)),
        "live": status == "running",
    }


def step(con: sqlite3.Connection, run_id: str, number: int) -> dict[str, Any]:
    """One step: its stats, every op with its verdict, its learner calls and its rollouts."""
    _check_id(run_id, UnknownRun(f"no run {run_id!r}"))
    missing = UnknownRecord(f"run {run_id!r} has no step {number}")
    row = _one(con, "select * from steps where run_id = ? and step = ?", [run_id, number], missing)
    return {
        "run_id": run_id, "step": number, "status": row["status"], "stats": json.loads(row["stats"] or "{}"),
        "version_before": row["version_before"], "version_after": row["version_after"],
        "ops": [{**o, "op": _loads(o["op"])} for o in _rows(
            con, "select stage, seq, version_id, op, accepted, reason from ops where run_id = ? and step = ? "
                 "order by seq", [run_id, number])],
        "calls": _rows(con, "select rowid as id, stage, subject, attempt, valid, error, prompt_tokens, "
                            "completion_tokens from learner_calls where run_id = ? and step = ? order by rowid",
                       [run_id, number]),
        "rollouts": _rows(con, "select rowid as id, problem_id, sample, reward, finish_reason, prompt_tokens, "
                               "completion_tokens from rollouts where run_id = ? and step = ? "
                               "order by problem_id, sample", [run_id, number]),
    }


def learner_call(con: sqlite3.Connection, call_id: int) -> dict[str, Any]:
    row = _one(con, "select rowid as id, * from learner_calls where rowid = ?", [call_id],
               UnknownRecord(f"no learner call {call_id}"))
    return {**row, "messages": _loads(row["messages"])}


def rollout(con: sqlite3.Connection, rollout_id: int) -> dict[str, Any]:
    row = _one(con, "select rowid as id, * from rollouts where rowid = ?", [rollout_id],
               UnknownRecord(f"no rollout {rollout_id}"))
    recorded = con.execute("select 1 from versions where id = ?", [row["library_version"]]).fetchone() is not None
    # a prune step's left-out versions are measured, never recorded: their rollouts name a version with no page
    return {**row, "messages": _loads(row["messages"]), "shown": _loads(row["shown"] or "[]"),
            "version_recorded": recorded}


_ITEM_COUNTS: dict[str, int] = {}  # version id -> items; versions are immutable, so this never goes stale


def item_counts(con: sqlite3.Connection, version_ids: list[str]) -> dict[str, int]:
    """How many items each version holds, parsed once per process (a run page lists a thousand of them)."""
    missing = list({v for v in version_ids if v and v not in _ITEM_COUNTS})
    for start in range(0, len(missing), 500):
        chunk = missing[start:start + 500]
        _ITEM_COUNTS.update(con.execute("select id, json_array_length(content, '$.items') from versions where id in "
                                        f"({','.join('?' * len(chunk))})", chunk).fetchall())
    if len(_ITEM_COUNTS) > 200_000:  # a bound, not an eviction policy: refilled on the next page
        _ITEM_COUNTS.clear()
    return {v: _ITEM_COUNTS.get(v, 0) for v in version_ids}


def _loads(text: str | None) -> Any:
    try:
        return json.loads(text) if text else None
    except json.JSONDecodeError:
        return text  # a rejected reply is kept as its raw text


# --- versions ---------------------------------------------------------------------------------------------------------


def resolve_version(con: sqlite3.Connection, ref: str) -> str:
    """A full version id from an id or a unique prefix (compared as text, never as a LIKE pattern)."""
    missing = UnknownVersion(f"no library version {ref!r}")
    _check_id(ref, missing)
    rows = [r[0] for r in con.execute("select id from versions where substr(id, 1, ?) = ? limit 2", [len(ref), ref])]
    if ref in rows:
        return ref
    if len(rows) != 1:
        raise missing if not rows else UnknownVersion(f"{ref!r} names several versions")
    return rows[0]


def versions(con: sqlite3.Connection, page: int = 1) -> dict[str, Any]:
    """The history, newest first: parent, run, step, status (promoted, rejected by the gate, imported, start), items."""
    total = con.execute("select count(*) from versions").fetchone()[0]
    pages = max(1, -(-total // PAGE_SIZE))
    page = max(1, min(page, pages))
    served = served_version_id(con)
    rows = _rows(con, "select id, parent, run_id, step, status, created, evaluation, "
                      "json_array_length(content, '$.items') as items from versions order by created desc, rowid desc "
                      "limit ? offset ?", [PAGE_SIZE, (page - 1) * PAGE_SIZE])
    for r in rows:
        r["evaluation"] = json.loads(r["evaluation"] or "{}")
        r["served"] = r["id"] == served
    counts = dict(con.execute("select status, count(*) from versions group by status"))
    return {"versions": rows, "total": total, "page": page, "pages": pages, "served": served, "by_status": counts}


def version(con: sqlite3.Connection, ref: str) -> dict[str, Any]:
    """One version: its items (each a link to its provenance, and its credit where a prune step left it out in turn
    on validation), parent, children, the ops that made it, the gate."""
    version_id = resolve_version(con, ref)
    row = _one(con, "select * from versions where id = ?", [version_id], UnknownVersion(ref))
    content = json.loads(row["content"])
    children = _rows(con, "select id, status, step from versions where parent = ? order by created", [version_id])
    ops = _rows(con, "select run_id, step, seq, op, accepted, reason from ops where version_id = ? and stage = 'apply' "
                     "order by step, seq", [version_id])
    credit = {a["item"]: a for (stats,) in con.execute(
        "select json_extract(stats, '$.ablation') from steps where version_before = ? and "
        "json_extract(stats, '$.ablation') is not null", [version_id]) for a in json.loads(stats)}
    return {
        "id": version_id, "parent": row["parent"], "run_id": row["run_id"], "step": row["step"],
        "status": row["status"], "created": row["created"], "leaf_index": row["leaf_index"],
        "config_hash": row["config_hash"], "evaluation": json.loads(row["evaluation"] or "{}"),
        "policy": content.get("policy"), "served": served_version_id(con) == version_id,
        "items": [{"id": i["id"], "kind": i.get("kind", "lesson"), "text": i["text"], "step": i["provenance"]["step"],
                   "op": i["provenance"]["op"], "problems": len(i["provenance"].get("problem_ids", [])),
                   "rollouts": len([k for k in i["provenance"].get("rollout_ids", []) if not reference_answer(k)]),
                   "credit": credit.get(i["id"])}
                  for i in content["items"]],
        "children": children, "ops": [{**o, "op": _loads(o["op"])} for o in ops],
    }


def item(con: sqlite3.Connection, ref: str, item_id: str) -> dict[str, Any]:
    """An item's provenance: the step and op that set its text, the problems, the scored rollouts, and the learner
    replies of that step about those problems (summaries, group comparisons, the batch's consolidation)."""
    version_id = resolve_version(con, ref)
    content = json.loads(con.execute("select content from versions where id = ?", [version_id]).fetchone()[0])
    found = next((i for i in content["items"] if i["id"] == item_id), None)
    if found is None:
        raise UnknownRecord(f"version {version_id[:16]} has no item {item_id[:40]!r}")
    origin = found["provenance"]
    keys = list(origin.get("rollout_ids", []))
    rollouts = []
    for start in range(0, len(keys), 500):  # SQLite's bound-parameter limit
        chunk = keys[start:start + 500]
        rollouts += _rows(con, "select rowid as id, key, run_id, step, problem_id, sample, reward, finish_reason, "
                               "completion, messages from rollouts where key in "
                               f"({','.join('?' * len(chunk))}) order by problem_id, sample", chunk)
    problems: dict[str, str] = {}
    for r in rollouts:
        messages = _loads(r.pop("messages")) or []
        users = [m.get("content") for m in messages if isinstance(m, dict) and m.get("role") == "user"]
        problems.setdefault(r["problem_id"].removeprefix(LEARNER_ANSWER).removeprefix(HINTED_ANSWER),
                            users[-1] if users and isinstance(users[-1], str) else "")
    run_id = rollouts[0]["run_id"] if rollouts else content_run(con, version_id)
    problem_ids = list(origin.get("problem_ids", []))
    if found.get("kind") == "example" and len(problem_ids) == 1:  # a labeled example has no rollout to read it from
        problems.setdefault(problem_ids[0], example_parts(found["text"])[0])
    calls = []
    if run_id and problem_ids:
        wanted = set(problem_ids)
        for c in _rows(con, "select rowid as id, stage, subject, attempt, valid, error, reply from learner_calls "
                            "where run_id = ? and step = ? order by rowid", [run_id, origin["step"]]):
            if c["stage"] == "consolidate" or c["subject"] in wanted or c["subject"].rsplit("/", 1)[0] in wanted:
                calls.append(c)
    return {
        "version": version_id, "item": found, "kind": found.get("kind", "lesson"), "run_id": run_id,
        "step": origin["step"], "op": origin["op"],
        "problems": [{"id": p, "text": problems.get(p, "")} for p in problem_ids],
        "rollouts": rollouts, "learner_calls": calls,
    }


def content_run(con: sqlite3.Connection, version_id: str) -> str | None:
    row = con.execute("select run_id from versions where id = ?", [version_id]).fetchone()
    return row[0] if row and row[0] else None


def diff(con: sqlite3.Connection, a: str, b: str) -> dict[str, Any]:
    """Items added, removed and changed from A to B, and the accepted ops on the path from A to B when A is an
    ancestor of B (as `gym-tf library diff` prints them)."""
    old_id, new_id = resolve_version(con, a), resolve_version(con, b)
    old, new = (json.loads(con.execute("select content from versions where id = ?", [v]).fetchone()[0])
                for v in (old_id, new_id))
    before = {i["id"]: i for i in old["items"]}
    after = {i["id"]: i for i in new["items"]}
    chain = [r[0] for r in con.execute(
        "with recursive up(id, parent, depth) as (select id, parent, 0 from versions where id = ? union all "
        "select v.id, v.parent, up.depth + 1 from versions v join up on v.id = up.parent where up.id != ?) "
        "select id from up order by depth", [new_id, old_id])]
    ops: list[Any] = []
    ancestor = old_id in chain
    if ancestor:
        path = list(reversed(chain[:chain.index(old_id)]))
        for version_id in path:
            ops += [_loads(o[0]) for o in con.execute(
                "select op from ops where version_id = ? and accepted = 1 and stage = 'apply' order by step, seq",
                [version_id])]
    return {
        "a": old_id, "b": new_id, "ancestor": ancestor,
        "added": [after[i] for i in after if i not in before],
        "removed": [before[i] for i in before if i not in after],
        "changed": [{"before": before[i], "after": after[i]} for i in after
                    if i in before and before[i]["text"] != after[i]["text"]],
        "ops": ops,
    }


# --- evaluations ------------------------------------------------------------------------------------------------------


def evaluations(con: sqlite3.Connection) -> dict[str, Any]:
    """Stored `gym-tf eval` reports, and the validation gate's verdict on every candidate version."""
    stored = []
    if _has_table(con, "evaluations"):
        for r in _rows(con, "select id, created, dataset, model, problems, samples, report from evaluations "
                            "order by created desc"):
            report = json.loads(r.pop("report"))
            r["arms"] = [{"name": a["name"], "mean_at_k": a["metrics"]["mean_at_k"],
                          "majority": a["metrics"]["majority"]} for a in report.get("arms", [])]
            stored.append(r)
    gated = _rows(con, "select id, run_id, step, status, evaluation from versions where evaluation not in ('{}', '') "
                       "and evaluation is not null order by created desc limit 500")
    for g in gated:
        g["evaluation"] = json.loads(g["evaluation"])
    return {"evaluations": stored, "gate": gated}


def evaluation(con: sqlite3.Connection, evaluation_id: str) -> dict[str, Any]:
    """One report, libraries side by side: Mean@k, Pass@k, Majority@k with intervals, paired differences against
    the baseline and against the most common answer given to every problem, and each problem's mean reward under
    every library."""
    missing = UnknownRecord(f"no evaluation {evaluation_id[:40]!r}")
    _check_id(evaluation_id, missing)
    if not _has_table(con, "evaluations"):
        raise missing
    row = _one(con, "select * from evaluations where id = ?", [evaluation_id], missing)
    report = json.loads(row.pop("report"))
    per_problem = report.get("per_problem", {})
    names = [a["name"] for a in report.get("arms", [])]
    problem_ids = list(dict.fromkeys(p for arm in per_problem.values() for p in arm))
    table = [{"problem": p, "means": [per_problem.get(n, {}).get(p, {}).get("mean") for n in names]}
             for p in problem_ids]
    return {**row, "baseline": report.get("baseline"), "arms": report.get("arms", []), "names": names,
            "constant_answer": report.get("constant_answer"), "per_problem": table}


# --- the ledger -------------------------------------------------------------------------------------------------------


def ledger(con: sqlite3.Connection, log: MerkleLog, page: int = 1) -> dict[str, Any]:
    """The log's root and size; for a page of versions, whether its entry's inclusion proof verifies against
    today's root; publications (the library bytes still hash to their CID) and anchors (the anchored root is
    this log's root at the anchored size; the chain itself is asked by `gym-tf verify-anchor`)."""
    size = log.size
    root = log.root(size)
    total = con.execute("select count(*) from versions").fetchone()[0]
    pages = max(1, -(-total // PAGE_SIZE))
    page = max(1, min(page, pages))
    rows = _rows(con, "select id, status, leaf_index from versions order by leaf_index desc limit ? offset ?",
                 [PAGE_SIZE, (page - 1) * PAGE_SIZE])
    for r in rows:
        r["included"], r["problem"] = _inclusion(log, r["leaf_index"], size, root, r["id"])
    publications = _rows(con, "select p.manifest, p.version_id, p.transport, p.signer, p.created, p.direction, "
                              "v.content from publications p left join versions v on v.id = p.version_id "
                              "order by p.created desc")
    for p in publications:
        content = p.pop("content")
        p["verified"] = content is not None and cid(content.encode()) == p["version_id"]
        p["check"] = "library recorded; its bytes hash to its CID" if p["verified"] else \
            "library missing or its bytes no longer hash to its CID"
    anchors = _rows(con, "select * from anchors order by created desc")
    for a in anchors:
        matches = 0 < (a["tree_size"] or 0) <= size and log.root(a["tree_size"]) == a["root"]
        a["verified"] = matches
        a["check"] = (f"root is this log's root at size {a['tree_size']}" if matches
                      else "root is not this log's root at the anchored size")
    return {"tree_size": size, "root": root, "versions": rows, "page": page, "pages": pages, "total": total,
            "publications": publications, "anchors": anchors}


def _inclusion(log: MerkleLog, index: int | None, size: int, root: str, version_id: str) -> tuple[bool, str]:
    if not isinstance(index, int) or not 1 <= index <= size:
        return False, f"leaf index {index} names no leaf"
    try:
        entry = log.entry(index)
        if json.loads(entry).get("version") != version_id:
            return False, f"leaf {index} is about another version"
        verify_entry(entry, root, log.prove(index, size))
    except (LedgerError, ValueError) as exc:
        return False, str(exc)
    return True, ""
