"""`--report-to mlflow`: a run or an evaluation, as the workspace recorded it, logged to an MLflow tracking store
through MLflow's own client (as TRL's `report_to` does), so teams find gym-tf beside their other experiments.

What is logged is read back from the workspace after the command ends, through the studio's own queries: the
numbers in MLflow are the numbers `gym-tf ui` shows. Params: the run's full config, flattened. Metrics per step:
train reward, validation score and the gate's interval, library size, groups and ops, tokens. Artifacts: every
library version the run made (`gym-tf library export` format) and evaluation reports with a per-problem table.
The studio stays the place for what MLflow cannot show: items, provenance, diffs, the ledger.

The tracking store is `--mlflow-tracking-uri`, else `$MLFLOW_TRACKING_URI`, else a local `./mlruns` folder (MLflow
keeps its file store in maintenance mode; gym-tf opts in to it only for that default).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from gym_tf.errors import ConfigError
from gym_tf.library_io import FORMAT
from gym_tf.store import RunStore
from gym_tf.studio import queries

STEP_METRICS = ("train_reward", "val_mean", "library_size", "groups_used", "groups_skipped", "ops_applied",
                "ops_rejected", "tokens")


def _mlflow(tracking_uri: str | None, experiment: str) -> Any:
    try:
        import mlflow
    except ImportError:
        raise ConfigError("--report-to mlflow needs MLflow's client: pip install 'gym-tf[mlflow]'") from None
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or Path("mlruns").resolve().as_uri()
    if uri.startswith("file:") or "://" not in uri:
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment(experiment)
    return mlflow


def _flat(config: Any, prefix: str = "") -> dict[str, str]:
    """Nested settings as MLflow params (`backend.model`, ...); values cut to MLflow's 6,000 characters."""
    if not isinstance(config, dict):
        return {prefix: str(config)[:6000]}
    out: dict[str, str] = {}
    for key, value in config.items():
        out.update(_flat(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def _key(name: str) -> str:
    """A metric name MLflow accepts (letters, digits, `_-./ `)."""
    return re.sub(r"[^A-Za-z0-9_\-./ ]", "_", name)[:250]


def report_run(store: RunStore, run_id: str, tracking_uri: str | None = None, experiment: str = "gym-tf") -> str:
    """Log one optimize or train run; returns the MLflow run id."""
    mlflow = _mlflow(tracking_uri, experiment)
    data = queries.run(store.db.conn, store.root, store.run(run_id)["id"])
    run = data["run"]
    with mlflow.start_run(run_name=run["id"]) as active:
        mlflow.set_tags({"gym_tf.run_id": run["id"], "gym_tf.kind": run["kind"], "gym_tf.status": run["status"],
                         "gym_tf.model": run["model"], "gym_tf.dataset": run["dataset"]})
        params = _flat(run["config"])
        for start in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            mlflow.log_params(dict(list(params.items())[start:start + 100]))
        for step in data["steps"]:
            metrics = {name: float(step[name]) for name in STEP_METRICS if step.get(name) is not None}
            if step["gate"]:
                metrics.update({f"gate_{k}": float(step["gate"][k]) for k in ("diff", "low", "high")})
            mlflow.log_metrics(metrics, step=step["step"])
        totals = {f"tokens_{stage}_{kind}": float(n) for stage, t in data["tokens"].items() for kind, n in t.items()}
        if data["val_baseline"] is not None:
            totals["val_baseline"] = float(data["val_baseline"])
        mlflow.log_metrics({**totals, "ops_applied_total": float(data["ops_applied"]),
                            "ops_rejected_total": float(data["ops_rejected"]), "wall_s": float(run["wall_s"])})
        for version in store.versions(run["id"]):
            library = store.version(version["id"])
            document = {"format": FORMAT, "id": library.id, "library": library.model_dump(mode="json")}
            mlflow.log_dict(document, f"libraries/step-{version['step']:04d}-{version['status']}-{library.id}.json")
        for step in store.steps(run["id"]):
            if step["stats"].get("ablation"):  # the prune step: each item's credit on validation
                mlflow.log_dict(step["stats"]["ablation"], "item_credit.json")
        if run["current_version"]:
            library = store.version(run["current_version"])
            mlflow.log_dict({"format": FORMAT, "id": library.id, "library": library.model_dump(mode="json")},
                            "library.json")
        return active.info.run_id


def report_evaluation(store: RunStore, evaluation_id: str, tracking_uri: str | None = None,
                      experiment: str = "gym-tf") -> str:
    """Log one recorded `gym-tf eval` report; returns the MLflow run id."""
    mlflow = _mlflow(tracking_uri, experiment)
    data = queries.evaluation(store.db.conn, evaluation_id)
    with mlflow.start_run(run_name=f"eval {evaluation_id}") as active:
        mlflow.set_tags({"gym_tf.evaluation_id": evaluation_id, "gym_tf.kind": "eval"})
        mlflow.log_params({"dataset": data["dataset"], "model": data["model"], "problems": data["problems"],
                           "samples": data["samples"], "baseline": data["baseline"],
                           "libraries": ", ".join(data["names"])[:6000]})
        for index, arm in enumerate(data["arms"]):
            label = _key(f"{index}_{arm['name'][:24]}")
            metrics = {f"{label}.{m}{suffix}": float(arm["metrics"][m][end])
                       for m in ("mean_at_k", "pass_at_k", "majority")
                       for suffix, end in (("", "value"), (".low", "low"), (".high", "high"))}
            for diff in ("mean_vs_baseline", "majority_vs_baseline", "mean_vs_baseline_majority"):
                if arm.get(diff):
                    metrics.update({f"{label}.{diff}{suffix}": float(arm[diff][end])
                                    for suffix, end in (("", "value"), (".low", "low"), (".high", "high"))})
            mlflow.log_metrics(metrics)
        mlflow.log_dict({"arms": data["arms"], "baseline": data["baseline"]}, "evaluation.json")
        mlflow.log_table({"problem": [row["problem"] for row in data["per_problem"]],
                          **{_key(name): [row["means"][i] for row in data["per_problem"]]
                             for i, name in enumerate(data["names"])}}, "per_problem.json")
        return active.info.run_id
