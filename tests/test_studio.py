"""The studio driven in-process (Starlette's TestClient) on a workspace made by real optimize runs with the scripted
fake: each page's JSON twin carries the store's own numbers, the HTML shows them, auth is enforced, hostile ids
are 404s, and promote / roll back move the pointer the proxy serves."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from eth_account import Account
from markupsafe import escape
from starlette.testclient import TestClient

from fakes import MemoryIpfs, ScriptedBackend
from gym_tf.compare import compare
from gym_tf.config import OptimizeConfig, RolloutConfig
from gym_tf.datasets import load_dataset
from gym_tf.library import EMPTY_LIBRARY, EXAMPLES_HEADER, ExampleOp, apply_ops, short
from gym_tf.library_io import diff_versions
from gym_tf.optimize import Optimizer
from gym_tf.publishing import publish
from gym_tf.store import RunStore
from gym_tf.studio import StudioConfig, studio_app
from rewards import load_reward
from rewards.answers import last_boxed
from server import ServerConfig, create_app
from server.upstream import Upstream

READER, ADMIN = {"Authorization": "Bearer reader"}, {"Authorization": "Bearer boss"}
# with summaries (off by default), so a lesson's page has every learner stage to lead to
GATED = OptimizeConfig(dataset="quickstart", limit=8, batch_size=4, group_size=4, epochs=2, seed=3,
                       val_dataset="quickstart", val_samples=2, prune=True, summarize=True)


class HurtByLibrary(ScriptedBackend):
    """Answers get worse once any library is in the prompt: its gate rejects every candidate."""

    def skill_for(self, messages) -> float:
        return 0.1 if "Experiences learned" in str(messages[0]["content"]) else 0.8


class HelpedByLibrary(ScriptedBackend):
    """Each item in the prompt makes a right answer likelier: the prune step finds every item helps, keeps them all."""

    def skill_for(self, messages) -> float:
        return min(0.95, 0.4 + 0.1 * str(messages[0]["content"]).count("\n[E"))


def make_workspace(root: Path) -> dict:
    """Two gated optimize runs (one learns, one has every candidate rejected), an eval comparison, a publication
    and two anchors (one of this log's roots, one not)."""
    store = RunStore(root)
    problems = load_dataset("quickstart")
    answers = {p.problem: p.answer for p in problems}
    learned = asyncio.run(Optimizer(GATED, store, HelpedByLibrary(answers)).run())
    hurt = asyncio.run(Optimizer(GATED.model_copy(update={"epochs": 1, "worked_examples": False}), store,
                                 HurtByLibrary(answers)).run())
    library = learned.library
    comparison = asyncio.run(compare(ScriptedBackend(answers), problems[:6], load_reward("math"), 2,
                                     RolloutConfig().sampling(), [("none", EMPTY_LIBRARY, 0), (library.id, library, 0)]))
    evaluation = comparison.record(store, "quickstart")
    publish(store, library.id, Account.create(), MemoryIpfs())
    store.db["anchors"].insert({"tx": "0xgood", "root": store.ledger.root(), "tree_size": store.ledger.size,
                                "rpc_url": "", "created": 1.0})
    store.db["anchors"].insert({"tx": "0xbad", "root": "00" * 32, "tree_size": 1, "rpc_url": "", "created": 2.0})
    store.promote(library.id)
    return {"store": store, "learned": learned, "hurt": hurt, "comparison": comparison, "evaluation": evaluation}


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    return make_workspace(tmp_path_factory.mktemp("studio") / "ws")


@pytest.fixture(scope="module")
def client(ws):
    return TestClient(studio_app(ws["store"], StudioConfig(keys=["reader"], admin_keys=["boss"])))


def get(client, path, **kwargs):
    reply = client.get(path, headers=kwargs.pop("headers", READER), **kwargs)
    assert reply.status_code == 200, (path, reply.status_code, reply.text[:300])
    return reply


# --- the numbers ------------------------------------------------------------------------------------------------------


def test_runs_list_carries_the_stores_numbers(ws, client):
    store = ws["store"]
    shown = {r["id"]: r for r in get(client, "/ui/runs.json").json()["runs"]}
    assert set(shown) == {ws["learned"].run_id, ws["hurt"].run_id}
    for run in store.runs():
        row = shown[run["id"]]
        assert (row["status"], row["model"], row["dataset"], row["kind"]) == ("finished", "scripted", "quickstart", "optimize")
        assert row["steps"] == len(store.steps(run["id"]))
        assert row["tokens"] == store.usage(run["id"])
        assert row["tokens_total"] == sum(u["prompt"] + u["completion"] for u in store.usage(run["id"]).values()) > 0
        assert row["wall_s"] >= 0
    page = get(client, "/ui/runs").text
    assert ws["learned"].run_id in page and str(shown[ws["learned"].run_id]["tokens_total"]) in page


def test_run_page_has_each_steps_reward_validation_gate_and_library_size(ws, client):
    store, run_id = ws["store"], ws["learned"].run_id
    data = get(client, f"/ui/runs/{run_id}.json").json()
    steps = store.steps(run_id)
    assert [s["step"] for s in data["steps"]] == [s["step"] for s in steps] == [1, 2, 3, 4, 5]  # 5: the prune step
    candidates = {v["step"]: v for v in store.versions(run_id)}
    for shown, stored in zip(data["steps"], steps):
        assert shown["train_reward"] == stored["stats"]["mean_reward"]
        assert shown["val_mean"] == stored["stats"]["val_mean"]
        assert shown["library_size"] == len(store.version(stored["version_after"]).items)
        assert (shown["groups_used"], shown["groups_skipped"]) == (stored["stats"]["groups_used"], stored["stats"]["groups_skipped"])
        if shown["step"] in candidates:  # a validated candidate: the gate's interval as recorded
            evaluation = json.loads(store.version_row(candidates[shown["step"]]["id"])["evaluation"])
            assert shown["gate"] == {**{k: evaluation[k] for k in ("diff", "low", "high")},
                                     "verdict": candidates[shown["step"]]["status"], "version": candidates[shown["step"]]["id"]}
    assert any(s["gate"] for s in data["steps"])
    ops = list(store.ops(run_id))
    assert data["ops_applied"] == sum(o["accepted"] for o in ops) == ws["learned"].progress.ops_applied
    assert data["ops_rejected"] == sum(not o["accepted"] for o in ops)
    assert data["library_size"] == len(ws["learned"].library.items)
    assert data["val_baseline"] == store.run(run_id)["summary"]["val_baseline"] is not None
    page = get(client, f"/ui/runs/{run_id}").text
    assert '<path class="train" d="M' in page and 'class="gate ' in page and 'class="baseline"' in page


def test_each_items_credit_from_the_prune_step_shows_on_its_version_and_the_step(ws, client):
    store, run_id = ws["store"], ws["learned"].run_id
    prune = store.steps(run_id)[-1]
    ablation = {a["item"]: a for a in prune["stats"]["ablation"]}
    before = store.version(prune["version_before"])
    assert set(ablation) == {i.id for i in before.items} != set()
    shown = get(client, f"/ui/versions/{before.id}.json").json()
    assert {i["id"]: i["credit"] for i in shown["items"]} == ablation
    version_page = get(client, f"/ui/versions/{before.id}").text
    step_page = get(client, f"/ui/runs/{run_id}/steps/{prune['step']}").text
    for a in ablation.values():
        line = f"{a['verdict']}</span>" + (f": {a['with_item']:.3f} / {a['without_item']:.3f} on "
                                           f"{len(a['problems'])} problems" if a["problems"] else "")
        assert line in version_page and line in step_page
    assert step_page.count("<b>dropped</b>") == sum(not a["keep"] for a in ablation.values())
    # a version no prune step measured says so
    first = get(client, f"/ui/versions/{store.steps(run_id)[0]['version_after']}.json").json()
    assert first["items"] and all(i["credit"] is None for i in first["items"])


def test_a_dropped_item_shows_why_and_its_left_out_rollouts_name_an_unrecorded_version(tmp_path):
    from test_credit import GATED as ONE_STEP, HARMS, ReadsLessons, both_lessons

    store = RunStore(tmp_path / "ws")
    answers = {p.problem: p.answer for p in load_dataset("quickstart")}
    result = asyncio.run(Optimizer(ONE_STEP, store, ReadsLessons(answers, learner=both_lessons)).run())
    prune = store.steps(result.run_id)[-1]
    [dropped] = [a for a in prune["stats"]["ablation"] if not a["keep"]]
    assert store.version(prune["version_before"]).get(dropped["item"]).text == HARMS
    client = TestClient(studio_app(store, StudioConfig(keys=["reader"])))
    step_page = get(client, f"/ui/runs/{result.run_id}/steps/{prune['step']}").text
    assert (f'harms</span>: {dropped["with_item"]:.3f} / {dropped["without_item"]:.3f} on 40 problems · '
            "<b>dropped</b>") in step_page
    assert get(client, f"/ui/versions/{prune['version_before']}").text.count("<b>dropped</b>") == 1
    left_out = store.db.execute("select rowid, library_version from rollouts where step = ? and library_version "
                                "not in (select id from versions) limit 1", [prune["step"]]).fetchone()
    assert left_out is not None
    page = get(client, f"/ui/rollouts/{left_out[0]}").text
    assert "not recorded" in page and f'href="/ui/versions/{left_out[1]}"' not in page


def test_rejected_candidates_show_with_the_gate_verdict(ws, client):
    run_id = ws["hurt"].run_id
    data = get(client, f"/ui/runs/{run_id}.json").json()
    verdicts = [s["gate"]["verdict"] for s in data["steps"] if s["gate"]]
    assert verdicts and set(verdicts) == {"rejected"}
    assert all(s["gate"]["diff"] < 0 for s in data["steps"] if s["gate"])  # each scored below the best so far
    assert 'class="gate rejected"' in get(client, f"/ui/runs/{run_id}").text
    versions = get(client, "/ui/versions.json").json()
    assert versions["by_status"]["rejected"] == sum(1 for v in ws["store"].versions() if v["status"] == "rejected") > 0


def test_every_learner_call_is_one_click_from_the_run_page(ws, client):
    store, run_id = ws["store"], ws["learned"].run_id
    data = get(client, f"/ui/runs/{run_id}.json").json()
    total = store.db["learner_calls"].count_where("run_id = ?", [run_id])
    assert data["calls_total"] == total > 0
    seen = []
    for page in range(1, data["pages"] + 1):
        html = get(client, f"/ui/runs/{run_id}?page={page}").text
        for call in get(client, f"/ui/runs/{run_id}.json?page={page}").json()["calls"]:
            assert f'href="/ui/calls/{call["id"]}"' in html
            seen.append(call["id"])
    assert len(set(seen)) == total
    call = get(client, f"/ui/calls/{seen[-1]}.json").json()
    stored = store.learner_call(run_id, call["step"], call["stage"], call["subject"], call["attempt"])
    assert call["reply"] == stored["reply"] and call["messages"] == json.loads(stored["messages"])
    assert str(escape(stored["reply"])) in get(client, f"/ui/calls/{seen[-1]}").text


def test_item_provenance_leads_to_its_scored_rollouts_and_learner_replies(ws, client):
    store, library = ws["store"], ws["learned"].library
    lessons = [i for i in library.items if i.kind == "lesson"]
    examples = [i for i in library.items if i.kind == "example"]
    assert lessons and examples
    for item in (lessons[0], examples[0]):
        data = get(client, f"/ui/versions/{library.id}/items/{item.id}.json").json()
        assert data["step"] == item.provenance.step and data["op"] == item.provenance.op
        assert [p["id"] for p in data["problems"]] == list(item.provenance.problem_ids)
        assert all(p["text"] for p in data["problems"])  # the problem as the model saw it
        assert {r["key"] for r in data["rollouts"]} == set(item.provenance.rollout_ids)
        for r in data["rollouts"]:
            rollout = get(client, f"/ui/rollouts/{r['id']}.json").json()
            stored = store.db["rollouts"].get(r["key"])
            assert (rollout["reward"], rollout["completion"]) == (stored["reward"], stored["completion"])
        html = get(client, f"/ui/versions/{library.id}/items/{item.id}").text
        assert all(f'href="/ui/rollouts/{r["id"]}"' in html for r in data["rollouts"])
    lesson = get(client, f"/ui/versions/{library.id}/items/{lessons[0].id}.json").json()
    stages = {c["stage"] for c in lesson["learner_calls"]}
    assert {"extract", "consolidate", "summarize"} <= stages
    assert all(c["subject"].split("/")[0] in lesson["item"]["provenance"]["problem_ids"] or c["stage"] == "consolidate"
               for c in lesson["learner_calls"])


def test_versions_history_marks_the_served_one_and_links_parents(ws, client):
    store = ws["store"]
    data = get(client, "/ui/versions.json").json()
    assert data["total"] == len(store.versions())
    assert data["served"] == store.served_version_id() == ws["learned"].library.id
    by_id = {v["id"]: v for v in data["versions"]}
    assert by_id[data["served"]]["served"] and sum(v["served"] for v in data["versions"]) == 1
    for v in store.versions():
        assert by_id[v["id"]]["parent"] == v["parent"] and by_id[v["id"]]["status"] == v["status"]
        assert by_id[v["id"]]["items"] == len(store.version(v["id"]).items)
    version = get(client, f"/ui/versions/{short(data['served'])}.json").json()  # a prefix names it too
    assert version["id"] == data["served"] and version["served"]
    assert [i["id"] for i in version["items"]] == [i.id for i in ws["learned"].library.items]


def test_diff_between_two_versions_matches_library_diff(ws, client):
    store = ws["store"]
    start = store.steps(ws["learned"].run_id)[0]["version_before"]
    end = ws["learned"].library.id
    data = get(client, f"/ui/diff.json?a={start}&b={end}").json()
    expected = diff_versions(store, store.version(start), store.version(end))
    assert data["ancestor"] is True
    assert [i["id"] for i in data["added"]] == [i["id"] for i in expected.added] != []
    assert data["ops"] == expected.ops
    assert [i["id"] for i in data["removed"]] == [i["id"] for i in expected.removed]
    backwards = get(client, f"/ui/diff.json?a={end}&b={start}").json()
    assert backwards["ancestor"] is False and len(backwards["removed"]) == len(data["added"])


def test_evaluations_side_by_side(ws, client):
    listing = get(client, "/ui/evaluations.json").json()
    assert [e["id"] for e in listing["evaluations"]] == [ws["evaluation"]]
    assert listing["gate"] and all("diff" in g["evaluation"] for g in listing["gate"])
    data = get(client, f"/ui/evaluations/{ws['evaluation']}.json").json()
    expected = ws["comparison"].to_dict()
    assert data["arms"] == json.loads(json.dumps(expected["arms"]))
    assert data["names"] == ["none", ws["learned"].library.id]
    per_problem = ws["comparison"].per_problem()
    for row in data["per_problem"]:
        assert row["means"] == [per_problem[n][row["problem"]]["mean"] for n in data["names"]]
    html = get(client, f"/ui/evaluations/{ws['evaluation']}").text
    assert f"{ws['comparison'].arms[1].report.metrics.mean_at_k.value:.3f}" in html
    constant = ws["comparison"].constant  # the most common answer given to every problem, beside the libraries
    assert data["constant_answer"] == {"answer": constant.answer, "mean": constant.mean}
    assert f"“{constant.answer}” always ({constant.mean:.3f})" in html
    assert f"{ws['comparison'].arms[1].mean_vs_constant.value:+.3f}" in html
    learned = ws["comparison"].arms[1]  # its gain where that answer is wrong, and the answers that copied an example
    assert f"“{constant.answer}” is wrong" in html and f"{learned.vs_baseline_uncommon.value:+.3f}" in html
    assert learned.copies is not None and f"{learned.copies.copied} of {learned.copies.of}" in html
    assert learned.full_credit_vs_baseline is None  # quickstart's grader pays 1 or 0: nothing to set apart


class HelpedByExamples(ScriptedBackend):
    def skill_for(self, messages) -> float:
        return 0.9 if EXAMPLES_HEADER in str(messages[0]["content"]) else 0.2


def test_an_evaluation_whose_grader_paid_partial_credit_shows_the_answers_paid_in_full(tmp_path):
    def boxed_anything(completions, answer, **_):  # 1 for the answer, 0.05 for any other boxed answer
        return [1.0 if last_boxed(c) == answer else 0.05 if last_boxed(c) else 0.0 for c in completions]

    store = RunStore(tmp_path / "ws")
    problems = load_dataset("quickstart")[:8]
    library, _ = apply_ops(EMPTY_LIBRARY, [ExampleOp(op="example", text="Problem: 2+2?\nSolution: \\boxed{4}")],
                           step=1)
    comparison = asyncio.run(compare(HelpedByExamples({p.problem: p.answer for p in problems}), problems,
                                     boxed_anything, 2, RolloutConfig().sampling(),
                                     [("none", EMPTY_LIBRARY, 0), ("learned", library, 0)]))
    paid = comparison.arms[1].full_credit_vs_baseline
    assert paid.value > 0
    evaluation = comparison.record(store, "quickstart")
    client = TestClient(studio_app(store, StudioConfig(keys=["reader"], admin_keys=["boss"])))
    data = get(client, f"/ui/evaluations/{evaluation}.json").json()
    assert data["arms"][1]["full_credit_vs_baseline"] == {"value": paid.value, "low": paid.low, "high": paid.high}
    html = get(client, f"/ui/evaluations/{evaluation}").text
    assert "answers paid in full − baseline" in html
    assert f"<td>{paid.value:+.3f} [{paid.low:+.3f}, {paid.high:+.3f}]</td>" in html
    beyond = comparison.arms[1].vs_baseline_beyond_swapped  # and its answers given to other problems
    assert data["arms"][1]["swapped_mean"] == comparison.arms[1].swapped_mean
    assert f"<td class=\"num\">{comparison.arms[1].swapped_mean:.3f}</td>" in html
    assert f"<td>{beyond.value:+.3f} [{beyond.low:+.3f}, {beyond.high:+.3f}]</td>" in html


def test_ledger_root_inclusion_publications_and_anchors(ws, client):
    store = ws["store"]
    data = get(client, "/ui/ledger.json").json()
    assert (data["tree_size"], data["root"]) == (store.ledger.size, store.ledger.root())
    assert data["total"] == len(store.versions()) and all(v["included"] for v in data["versions"])
    assert [p["verified"] for p in data["publications"]] == [True]
    assert {a["tx"]: a["verified"] for a in data["anchors"]} == {"0xgood": True, "0xbad": False}
    assert data["root"] in get(client, "/ui/ledger").text


def test_a_tampered_version_fails_its_inclusion_check(tmp_path):
    store = make_workspace(tmp_path / "ws")["store"]
    victim = store.versions()[-1]["id"]
    store.db.execute("drop trigger if exists leaf_no_update")  # pymerkle's leaf table may guard against edits
    store.db.execute("update leaf set entry = ? where id = ?", [b'{"version": "x"}', store.version_row(victim)["leaf_index"]])
    store.db.conn.commit()
    client = TestClient(studio_app(store))
    rows = {v["id"]: v for v in client.get("/ui/ledger.json").json()["versions"]}
    assert rows[victim]["included"] is False and "another version" in rows[victim]["problem"]
    assert sum(not v["included"] for v in rows.values()) == 1


# --- auth and actions -------------------------------------------------------------------------------------------------


def test_pages_refuse_requests_without_a_valid_key(client):
    for path in ("/ui/runs", "/ui/runs.json", "/ui/versions.json", "/ui/ledger"):
        assert client.get(path).status_code == 401
        assert client.get(path, headers={"Authorization": "Bearer nope"}).status_code == 401
    assert "API key" in client.get("/ui/runs").text  # the login form
    assert client.get("/ui/runs.json", headers=ADMIN).status_code == 200  # an admin key reads too


def test_promote_needs_an_admin_key_and_moves_the_served_pointer(ws, client):
    store = ws["store"]
    target = store.steps(ws["learned"].run_id)[1]["version_after"]
    before = store.served_version_id()
    assert client.post(f"/ui/versions/{target}/promote.json").status_code == 401
    assert client.post(f"/ui/versions/{target}/promote.json", headers=READER).status_code == 403
    assert client.post(f"/ui/versions/{target}/promote.json",
                       headers={**ADMIN, "Origin": "https://evil.example"}).status_code == 403
    assert store.served_version_id() == before
    reply = client.post(f"/ui/versions/{target}/promote.json", headers=ADMIN)
    assert reply.status_code == 200 and reply.json() == {"served": target} and store.served_version_id() == target
    parent = store.version(target).parent
    assert client.post("/ui/rollback.json", headers=ADMIN).json() == {"served": parent}
    assert store.served_version_id() == parent
    assert client.post("/ui/versions/nope/promote.json", headers=ADMIN).status_code == 404
    store.promote(before)


def test_browser_login_sets_a_cookie_that_reads_and_acts(ws):
    store = ws["store"]
    browser = TestClient(studio_app(store, StudioConfig(keys=["reader"], admin_keys=["boss"])))
    assert browser.post("/ui/login", data={"key": "wrong"}).status_code == 401
    reply = browser.post("/ui/login", data={"key": "boss", "next": "//evil.example/x"}, follow_redirects=False)
    assert reply.status_code == 303 and reply.headers["location"] == "/ui/runs"  # never off the studio
    assert "httponly" in reply.headers["set-cookie"].lower() and "samesite=strict" in reply.headers["set-cookie"].lower()
    assert browser.get("/ui/runs.json").status_code == 200
    before = store.served_version_id()
    target = store.steps(ws["learned"].run_id)[0]["version_after"]
    reply = browser.post(f"/ui/versions/{target}/promote", follow_redirects=False)
    assert reply.status_code == 303 and store.served_version_id() == target
    assert 'id="served-mark"' in browser.get(f"/ui/versions/{target}").text
    store.promote(before)
    browser.post("/ui/logout")
    assert browser.get("/ui/runs.json").status_code == 401


def test_a_studio_without_admin_keys_is_read_only(ws):
    open_studio = TestClient(studio_app(ws["store"]))
    assert open_studio.get("/ui/runs.json").status_code == 200  # no keys configured: pages are open
    reply = open_studio.post(f"/ui/versions/{ws['learned'].library.id}/promote.json")
    assert reply.status_code == 403 and "read-only" in reply.json()["error"]


def test_serve_mounts_the_studio_behind_the_api_keys(ws):
    store = ws["store"]
    app = create_app(Upstream("http://127.0.0.1:9/v1"), store, ServerConfig(api_keys=["reader"], admin_keys=["boss"]))
    api = TestClient(app)
    assert api.get("/ui/runs.json").status_code == 401
    assert api.get("/ui/runs.json", headers=READER).json()["runs"]
    assert api.get("/metrics").status_code == 401  # the API itself is still guarded
    assert api.get("/metrics", headers=ADMIN).status_code == 200  # an admin key is an API key too
    before = store.served_version_id()
    target = store.steps(ws["learned"].run_id)[0]["version_after"]
    assert api.post(f"/ui/versions/{target}/promote.json", headers=READER).status_code == 403
    assert api.post(f"/ui/versions/{target}/promote.json", headers=ADMIN).status_code == 200
    assert app.state.registry.resolve(None).id == target  # what the proxy answers with, without a restart
    store.promote(before)
    assert app.state.registry.resolve(None).id == before


# --- hostile input ----------------------------------------------------------------------------------------------------


HOSTILE = ["../../etc/passwd", "%00", "x" * 5000, "' OR 1=1 --", "%25", "_", "b", "E1%27", "😀", "-1",
           "99999999999999999999999", "1e5", "0x10"]


@pytest.mark.parametrize("suffix", ["", ".json"])
def test_hostile_ids_are_404_not_500(ws, client, suffix):
    run_id, version_id = ws["learned"].run_id, ws["learned"].library.id
    paths = []
    for bad in HOSTILE:
        paths += [f"/ui/runs/{bad}", f"/ui/runs/{run_id}/steps/{bad}", f"/ui/calls/{bad}", f"/ui/rollouts/{bad}",
                  f"/ui/versions/{bad}", f"/ui/versions/{version_id}/items/{bad}", f"/ui/evaluations/{bad}"]
    paths += ["/ui/calls/0", "/ui/rollouts/999999", f"/ui/runs/{run_id}/steps/99", "/ui/versions/bafkreinothere"]
    for path in paths:
        reply = client.get(path + suffix, headers=READER)
        assert reply.status_code == 404, (path, reply.status_code, reply.text[:200])
    for query in ("a=zz&b=yy", f"a={version_id}&b=%25", "a=&b=", f"a={version_id}"):
        assert client.get(f"/ui/diff{suffix}?{query}", headers=READER).status_code == 404
    for page in ("abc", "-1", "1" * 30):
        assert client.get(f"/ui/versions{suffix}?page={page}", headers=READER).status_code == 404
    assert client.get(f"/ui/versions{suffix}?page=9999", headers=READER).status_code == 200  # clamped to the last
    assert client.get("/ui/nothing-here", headers=READER).status_code == 404


def test_item_text_is_escaped_not_markup(tmp_path):
    from gym_tf.library import AddOp, apply_ops

    store = RunStore(tmp_path / "ws")
    version, _ = apply_ops(EMPTY_LIBRARY, [AddOp(op="add", text="<script>alert(1)</script> check units")], step=1)
    store.put_version(version, run_id="", status="imported")
    page = TestClient(studio_app(store)).get(f"/ui/versions/{version.id}").text
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_the_studio_ships_no_script_and_fetches_nothing(ws, client):
    for path in ("/ui/runs", f"/ui/runs/{ws['learned'].run_id}", "/ui/versions", "/ui/ledger"):
        html = get(client, path).text
        assert "<script" not in html and "http://" not in html.replace("http://www.w3.org/2000/svg", "")
        assert "https://" not in html
    css = client.get("/ui/static/studio.css")
    assert css.status_code == 200 and "svg.chart" in css.text


def test_gym_tf_ui_refuses_a_missing_workspace(tmp_path):
    from typer.testing import CliRunner

    from gym_tf.cli import app

    result = CliRunner().invoke(app, ["ui", "--workspace", str(tmp_path / "none")])
    assert result.exit_code == 1 and "no workspace" in result.output
    assert not (tmp_path / "none").exists()  # looking does not create one


def test_a_live_run_refreshes_and_a_dead_one_shows_as_crashed(tmp_path):
    store = RunStore(tmp_path / "ws", heartbeat_s=0.05)
    live = store.new_run("optimize", {}, "m", "d", EMPTY_LIBRARY.id)
    dead = store.new_run("optimize", {}, "m", "d", EMPTY_LIBRARY.id)
    store.db["runs"].update(dead, {"owner": "1@another-host/x", "heartbeat": 1.0})  # its process went silent long ago
    client = TestClient(studio_app(store))
    statuses = {r["id"]: r["status"] for r in client.get("/ui/runs.json").json()["runs"]}
    assert statuses == {live: "running", dead: "crashed"}
    assert 'http-equiv="refresh"' in client.get("/ui/runs").text
    assert 'http-equiv="refresh"' in client.get(f"/ui/runs/{live}").text
    assert 'http-equiv="refresh"' not in client.get(f"/ui/runs/{dead}").text
    store.finish_run(live, "budget", {})
    assert client.get(f"/ui/runs/{live}.json").json()["run"]["status"] == "budget"
    assert 'http-equiv="refresh"' not in client.get("/ui/runs").text
