"""`--report-to mlflow` against a real local MLflow store (a `mlruns` folder), read back with MLflow's own client:
the params, per-step metrics, library versions and evaluation tables are the workspace's."""

from __future__ import annotations

import json

import pytest

from test_studio import make_workspace
from gym_tf.library import LibraryVersion
from gym_tf.report_mlflow import report_evaluation, report_run

mlflow = pytest.importorskip("mlflow", reason="MLflow's client is not installed (pip install 'gym-tf[mlflow]')")


@pytest.fixture
def logged(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    ws = make_workspace(tmp_path / "ws")
    uri = (tmp_path / "mlruns").as_uri()
    return ws, uri, mlflow.MlflowClient(tracking_uri=uri)


def test_a_run_is_logged_with_its_params_step_metrics_and_library_versions(logged, tmp_path):
    ws, uri, client = logged
    store, run_id = ws["store"], ws["learned"].run_id
    logged_id = report_run(store, run_id, uri)
    run = client.get_run(logged_id)
    assert run.data.tags["gym_tf.run_id"] == run_id and run.data.tags["gym_tf.status"] == "finished"
    config = store.run(run_id)["config"]
    assert run.data.params["seed"] == str(config["seed"]) and run.data.params["rollout.temperature"] == "0.7"
    steps = store.steps(run_id)
    history = client.get_metric_history(logged_id, "train_reward")
    # the prune step samples no training problems: it has no train reward
    assert [(m.step, m.value) for m in history] == [(s["step"], s["stats"]["mean_reward"]) for s in steps
                                                    if s["stats"]["mean_reward"] is not None]
    sizes = client.get_metric_history(logged_id, "library_size")
    assert [m.value for m in sizes] == [len(store.version(s["version_after"]).items) for s in steps]
    assert client.get_metric_history(logged_id, "gate_high")  # the gate's interval, where a candidate was validated
    usage = store.usage(run_id)
    assert run.data.metrics["tokens_rollout_prompt"] == usage["rollout"]["prompt"]
    artifacts = [a.path for a in client.list_artifacts(logged_id, "libraries")]
    assert len(artifacts) == len(store.versions(run_id)) > 0
    final = json.loads(open(client.download_artifacts(logged_id, "library.json", str(tmp_path))).read())
    assert LibraryVersion.model_validate(final["library"]).id == final["id"] == ws["learned"].library.id
    credit = json.loads(open(client.download_artifacts(logged_id, "item_credit.json", str(tmp_path))).read())
    assert credit == steps[-1]["stats"]["ablation"] != []


def test_an_evaluation_is_logged_with_every_library_and_its_per_problem_table(logged, tmp_path):
    ws, uri, client = logged
    logged_id = report_evaluation(ws["store"], ws["evaluation"], uri)
    run = client.get_run(logged_id)
    comparison = ws["comparison"]
    for index, arm in enumerate(comparison.arms):
        label = f"{index}_{arm.name[:24]}"
        assert run.data.metrics[f"{label}.mean_at_k"] == arm.report.metrics.mean_at_k.value
        assert run.data.metrics[f"{label}.majority.high"] == arm.report.metrics.majority.high
    assert run.data.metrics[f"1_{comparison.arms[1].name[:24]}.mean_vs_baseline"] == comparison.arms[1].vs_baseline.value
    table = json.load(open(client.download_artifacts(logged_id, "per_problem.json", str(tmp_path))))
    assert len(table["data"]) == comparison.problems


def test_report_to_rejects_an_unknown_target(tmp_path):
    from typer.testing import CliRunner

    from gym_tf.cli import app

    result = CliRunner().invoke(app, ["optimize", "--report-to", "wandb", "--workspace", str(tmp_path / "ws")])
    assert result.exit_code == 1 and "--report-to must be none or mlflow" in result.output


def test_eval_records_its_report_in_the_workspace_and_logs_it_to_mlflow(tmp_path, monkeypatch):
    """The CLI end to end, against the fake OpenAI-compatible upstream: the report lands in the workspace (the
    studio's evaluations page) and in the MLflow store."""
    from conftest import run_cli

    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)  # the CLI opts in by itself for a file store
    from gym_tf.store import RunStore
    from test_server import start_fake

    process, url, _ = start_fake(tmp_path)
    try:
        uri = (tmp_path / "mlruns").as_uri()
        result = run_cli("eval", "--base-url", url, "--model", "fake-model", "--dataset", "quickstart", "--limit", "3", "-k", "2",
                         "--report", str(tmp_path / "r.json"), "--workspace", str(tmp_path / "ws"),
                         "--report-to", "mlflow", "--mlflow-tracking-uri", uri, timeout=300)
    finally:
        process.kill()
        process.wait()
    assert result.returncode == 0, result.stderr
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # for this test's own client
    rows = list(RunStore(tmp_path / "ws").db["evaluations"].rows)
    assert len(rows) == 1 and rows[0]["problems"] == 3 and rows[0]["samples"] == 2
    assert f"/ui/evaluations/{rows[0]['id']}" in result.stdout
    logged_id = result.stdout.split("logged to MLflow: run ")[1].split()[0]
    run = mlflow.MlflowClient(tracking_uri=uri).get_run(logged_id)
    assert run.data.tags["gym_tf.evaluation_id"] == rows[0]["id"] and run.data.params["problems"] == "3"
    assert run.data.metrics["0_none.mean_at_k"] == json.loads(rows[0]["report"])["arms"][0]["metrics"]["mean_at_k"]["value"]
