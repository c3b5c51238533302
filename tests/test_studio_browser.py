"""The studio in a real browser: Debian's headless Chromium driven by Playwright (the system browser, named by path;
nothing is downloaded), against `gym-tf serve`'s app on loopback in front of a fake upstream.

It logs in, opens every page, finds no console errors, sees the run curve's SVG path, follows an item to one of
its scored rollouts, promotes a version and sees the proxy answer with it, then rolls back. A second case does the
same on a workspace made by a real `gym-tf optimize` on the embedded model. Screenshots go to
$GYM_TF_STUDIO_SCREENSHOTS (the README's are in docs/studio/) or the test's temporary folder; the real run's are
named `real-*`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from conftest import free_port, run_cli, wait_for
from test_server import Running, start_fake
from test_studio import make_workspace
from gym_tf.library import short
from gym_tf.store import RunStore
from server import ServerConfig, create_app
from server.app import VERSION_HEADER
from server.upstream import Upstream

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
playwright = pytest.importorskip("playwright.sync_api", reason="Playwright for Python is not installed "
                                 "(pip install playwright; no browser download is needed)")
pytestmark = [pytest.mark.server,
              pytest.mark.skipif(CHROMIUM is None, reason="no system Chromium (apt-get install chromium)")]


@pytest.fixture
def served(tmp_path):
    ws = make_workspace(tmp_path / "ws")
    process, url, _ = start_fake(tmp_path)
    running = Running(create_app(Upstream(url), ws["store"], ServerConfig(api_keys=["reader"], admin_keys=["boss"])))
    yield ws, f"http://127.0.0.1:{running.port}"
    running.stop()
    process.kill()
    process.wait()


def answered_by(base: str) -> str:
    """The library version the proxy answers an unpinned request with."""
    reply = httpx.post(f"{base}/v1/chat/completions", headers={"Authorization": "Bearer reader"},
                       json={"model": "m", "messages": [{"role": "user", "content": "What is 2 + 2?"}]}, timeout=30)
    assert reply.status_code == 200, reply.text
    return reply.headers[VERSION_HEADER]


def test_every_page_in_a_real_browser(served, tmp_path):
    ws, base = served
    store, run_id, library = ws["store"], ws["learned"].run_id, ws["learned"].library
    shots = Path(os.environ.get("GYM_TF_STUDIO_SCREENSHOTS") or tmp_path / "shots")
    shots.mkdir(parents=True, exist_ok=True)
    problems: list[str] = []
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.on("console", lambda m: problems.append(f"console {m.type}: {m.text} at {m.location}") if m.type == "error" else None)
        page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
        page.on("response", lambda r: problems.append(f"{r.status} {r.url}") if r.status >= 400 else None)

        def visit(path: str, shot: str | None = None) -> None:
            reply = page.goto(base + path)
            assert reply is not None and reply.status == 200, (path, reply and reply.status)
            if shot:
                page.screenshot(path=str(shots / f"{shot}.png"), full_page=False)

        # --- log in with the admin key (a browser cannot send a bearer header)
        visit("/ui/login")
        page.fill("input[name=key]", "boss")
        page.click("#login")
        page.wait_for_url(f"{base}/ui/runs")
        assert run_id in page.content()
        page.screenshot(path=str(shots / "runs.png"), full_page=False)

        # --- the run: the curve is drawn, by the server, as an SVG path
        visit(f"/ui/runs/{run_id}", "run")
        curve = page.locator("svg.chart path.train")
        assert curve.count() == 1 and curve.is_visible()
        assert curve.get_attribute("d").startswith("M") and curve.get_attribute("d").count("L") == 3  # 4 steps
        assert page.locator("svg.chart g.gate").count() >= 1
        page.click("table >> text=consolidate >> nth=0")  # a learner call is one click away
        assert "Reply" in page.content() and page.locator("#reply").inner_text().strip()

        # --- an item's provenance, followed to one of its scored rollouts
        lesson = next(i for i in library.items if i.kind == "lesson")
        visit(f"/ui/versions/{library.id}")
        page.click(f"a.item-link >> text={lesson.id}")
        page.wait_for_url(f"**/items/{lesson.id}")
        page.screenshot(path=str(shots / "item.png"), full_page=False)
        page.locator("a.rollout-link").first.click()
        page.wait_for_url("**/ui/rollouts/*")
        key = page.locator("h1 .id").inner_text()
        assert key in lesson.provenance.rollout_ids
        assert float(page.locator("#reward").inner_text()) == store.db["rollouts"].get(key)["reward"]

        # --- the other pages
        start = store.steps(run_id)[0]["version_before"]
        for path, shot in [("/ui/versions", "versions"), (f"/ui/diff?a={start}&b={library.id}", "diff"),
                           (f"/ui/runs/{run_id}/steps/1", None), ("/ui/evaluations", None),
                           (f"/ui/evaluations/{ws['evaluation']}", "evaluation"), ("/ui/ledger", "ledger"),
                           (f"/ui/runs/{ws['hurt'].run_id}", "run-rejected")]:
            visit(path, shot)
            visit(path.replace("?", ".json?", 1) if "?" in path else path + ".json")

        # --- promote an older version: the proxy answers with it at once; then roll back to its parent
        assert answered_by(base) == library.id
        target = next(v["id"] for v in store.versions(run_id) if v["status"] == "promoted" and v["id"] != library.id)
        visit(f"/ui/versions/{target}")
        page.click("#promote")
        page.wait_for_selector("#served-mark")
        assert answered_by(base) == target == store.served_version_id()
        assert short(target) in page.locator("header .served").inner_text()
        page.click("#rollback")
        page.wait_for_selector("#served-mark")
        parent = store.version(target).parent
        assert answered_by(base) == parent and page.url.endswith(f"/ui/versions/{parent}")
        browser.close()
    assert problems == [], "\n".join(problems)


@pytest.mark.embedded
def test_a_real_embedded_run_in_the_browser(tmp_path):
    """What a user does: `gym-tf optimize` on the embedded model, then `gym-tf ui`, read in a browser. The pages'
    numbers are the CLI's, and every item's provenance leads to the real rollout it came from."""
    ws = tmp_path / "ws"
    made = run_cli("optimize", "--dataset", "quickstart", "--limit", "4", "--batch-size", "2", "--epochs", "1", "-G",
                   "2", "--max-completion-tokens", "256", "--no-summarize", "--workspace", str(ws))
    assert made.returncode == 0, made.stderr
    store = RunStore(ws)
    [run] = store.runs()
    library = store.version(run["current_version"])
    assert library.items, f"the embedded model solved none of 4 quickstart problems:\n{made.stdout}"
    printed = dict(re.findall(r"(\w+) (\d+\+\d+)", made.stdout.split("tokens by stage:")[1].splitlines()[0]))
    shown = run_cli("library", "show", "latest", "--workspace", str(ws))
    assert shown.returncode == 0 and all(item.id in shown.stdout for item in library.items), shown.stdout

    shots = Path(os.environ.get("GYM_TF_STUDIO_SCREENSHOTS") or tmp_path / "shots")
    shots.mkdir(parents=True, exist_ok=True)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    ui = subprocess.Popen([sys.executable, "-m", "gym_tf", "ui", "--workspace", str(ws), "--port", str(port),
                           "--api-key", "reader"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    problems: list[str] = []
    try:
        wait_for(f"{base}/ui/login", ui)
        assert httpx.get(f"{base}/ui/runs.json", timeout=10).status_code == 401  # no key, no pages
        with playwright.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
            page = browser.new_page()
            page.on("console", lambda m: problems.append(f"console: {m.text}") if m.type == "error" else None)
            page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
            page.on("response", lambda r: problems.append(f"{r.status} {r.url}") if r.status >= 400 else None)
            page.goto(f"{base}/ui/login")
            page.fill("input[name=key]", "reader")
            page.click("#login")
            page.wait_for_url(f"{base}/ui/runs")

            def twin(path: str) -> dict:
                return json.loads(page.evaluate(f"fetch({path!r}).then(r => r.text())"))

            page.screenshot(path=str(shots / "real-runs.png"))
            listed = twin("/ui/runs.json")["runs"][0]
            assert listed["id"] == run["id"] and listed["status"] == "finished"
            assert {stage: f"{t['prompt']}+{t['completion']}" for stage, t in listed["tokens"].items()} == printed
            page.goto(f"{base}/ui/runs/{run['id']}")
            curve = page.locator("svg.chart path.train")
            assert curve.count() == 1 and curve.get_attribute("d").count("L") == len(store.steps(run["id"])) - 1
            page.screenshot(path=str(shots / "real-run.png"))
            assert twin(f"/ui/runs/{run['id']}.json")["library_size"] == len(library.items)
            page.goto(f"{base}/ui/versions/{library.id}")
            page.screenshot(path=str(shots / "real-version.png"))
            for item in library.items:
                page.goto(f"{base}/ui/versions/{library.id}")
                page.click(f"a.item-link >> text={item.id}")
                page.wait_for_url(f"**/items/{item.id}")
                page.screenshot(path=str(shots / f"real-item-{item.kind}.png"))
                page.locator("a.rollout-link").first.click()
                page.wait_for_url("**/ui/rollouts/*")
                page.screenshot(path=str(shots / f"real-rollout-{item.kind}.png"))
                key = page.locator("h1 .id").inner_text()
                stored = store.db["rollouts"].get(key)
                assert key in item.provenance.rollout_ids
                assert float(page.locator("#reward").inner_text()) == stored["reward"]
                if item.kind == "example":  # the example is that rollout's own verified answer
                    assert stored["reward"] == 1.0 and stored["completion"].strip() in item.text
            # every other page of this real workspace opens without an error (the listeners above record any)
            first = store.steps(run["id"])[0]
            for path in ["/ui/versions", f"/ui/runs/{run['id']}/steps/{first['step']}", "/ui/evaluations", "/ui/ledger",
                         f"/ui/diff?a={first['version_before']}&b={library.id}"]:
                reply = page.goto(base + path)
                assert reply is not None and reply.status == 200, path
            ledger = twin("/ui/ledger.json")
            assert ledger["tree_size"] == store.ledger.size
            assert ledger["versions"] and all(v["included"] for v in ledger["versions"])
            browser.close()
    finally:
        ui.terminate()
        ui.wait(timeout=30)
    assert problems == [], "\n".join(problems)
