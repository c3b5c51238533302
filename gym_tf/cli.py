"""The `gym-tf` command. Each command parses options, calls the library once, and prints the result.

Domain errors become a one-line `error: ...` on stderr and exit status 1.
"""

from __future__ import annotations

import asyncio
import functools
import json
import sys
import time
from pathlib import Path
from typing import Annotated, Any, Callable, Optional

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from gym_tf.backends import BackendConfig, make_backend
from gym_tf.config import OptimizeConfig, RolloutConfig
from gym_tf.datasets import load_dataset
from gym_tf.display import diff_text, library_table, metrics_table, progress_line, rendered_prompt, runs_table
from gym_tf.errors import ConfigError, GymTFError
from ledger.errors import LedgerError
from gym_tf.library import short, with_policy
from gym_tf.library_io import diff_versions, export_library, read_library_file, resolve_library
from gym_tf.optimize import Optimizer, resume_config
from gym_tf.python_tool import PythonTool
from gym_tf.store import RunStore
from rewards import ANSWER_FREE, RewardLoadError, load_reward

app = typer.Typer(help="Training-Free GRPO: learn an experience library for a frozen LLM.", no_args_is_help=True,
                  pretty_exceptions_enable=False)
library_app = typer.Typer(help="Inspect, compare, export and import library versions.", no_args_is_help=True)
app.add_typer(library_app, name="library")
console = Console(soft_wrap=True)  # ids and CIDs are never broken across lines
err = Console(stderr=True, soft_wrap=True)

# --- shared options -------------------------------------------------------------------------------------------------
BaseUrl = Annotated[Optional[list[str]], typer.Option(
    help="OpenAI-compatible server (.../v1); repeat for replicas of one model; none: the embedded model")]
Model = Annotated[Optional[str], typer.Option(help="model name on the server, or a local HF directory (vllm)")]
ApiKey = Annotated[Optional[str], typer.Option(envvar="GYM_TF_API_KEY", help="API key for the server")]
ModelFile = Annotated[Optional[str], typer.Option(help="a local GGUF file for the embedded backend")]
PythonToolOption = Annotated[bool, typer.Option(
    "--python-tool", help="the model may write a Python program; it is run (limited, not sandboxed) and the model "
                          "answers again after seeing what it printed (eval: as the run that made the library). Runs "
                          "the model's code on this machine")]
BackendKind = Annotated[str, typer.Option(help="auto | embedded | openai | vllm | transformers")]
Concurrency = Annotated[str, typer.Option(
    help="requests in flight at once per server, or `auto`: adapt to what each server sustains")]
Timeout = Annotated[float, typer.Option(help="per-request timeout, seconds")]
Workspace = Annotated[Optional[Path], typer.Option(envvar="GYM_TF_WORKSPACE", help="workspace folder (default ./.gym-tf)")]
ReportTo = Annotated[str, typer.Option(help="also log params, per-step metrics, library versions and evaluation "
                                              "tables to: none | mlflow (MLflow's client; needs gym-tf[mlflow])")]
MlflowUri = Annotated[Optional[str], typer.Option(help="MLflow tracking store (default: $MLFLOW_TRACKING_URI, else ./mlruns)")]
ProblemField = Annotated[Optional[str], typer.Option(help="column holding the problem")]
AnswerField = Annotated[Optional[str], typer.Option(help="column holding the answer")]


def fails_cleanly(command: Callable[..., Any]) -> Callable[..., Any]:
    """Turn domain errors into one line on stderr and exit status 1."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except (GymTFError, RewardLoadError, LedgerError) as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(1) from None
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(map(str, first["loc"]))
            typer.echo(f"error: invalid setting{' ' + where if where else ''}: {first['msg']}", err=True)
            raise typer.Exit(1) from None

    return wrapper


def backend_config(backend: str, base_url: list[str] | None, model: str | None, api_key: str | None,
                   model_file: str | None, concurrency: str, timeout: float) -> BackendConfig:
    urls = base_url or []
    return BackendConfig(backend=backend, base_url=urls[0] if urls else None, replicas=tuple(urls[1:]), model=model,
                         api_key=api_key, model_file=model_file, timeout_s=timeout, **concurrency_settings(concurrency))


def concurrency_settings(value: str) -> dict:
    """`8` is a fixed limit per server; `auto` starts at 8 and adapts."""
    if value == "auto":
        return {"concurrency": 8, "adaptive_concurrency": True}
    if not value.isdigit():
        raise ConfigError(f"--concurrency must be a number or `auto`, not {value!r}")
    return {"concurrency": int(value)}


def check_target(report_to: str) -> str:
    from gym_tf.errors import ConfigError

    if report_to not in ("none", "mlflow"):
        raise ConfigError(f"--report-to must be none or mlflow, not {report_to!r}")
    return report_to


def report_to_mlflow(report_to: str, tracking_uri: str | None, run: tuple | None = None,
                     evaluation: tuple | None = None) -> None:
    """`--report-to mlflow`: log what the command recorded in the workspace, and say where it went."""
    if check_target(report_to) == "none":
        return
    from gym_tf.report_mlflow import report_evaluation, report_run

    mlflow_id = report_run(*run, tracking_uri) if run else report_evaluation(*evaluation, tracking_uri)
    console.print(f"logged to MLflow: run {mlflow_id}", highlight=False)


# --- eval -------------------------------------------------------------------------------------------------------------


@app.command("eval")
@fails_cleanly
def eval_command(
    dataset: Annotated[str, typer.Option(help="problems file, `datasets` directory, or `quickstart`")] = "quickstart",
    samples: Annotated[int, typer.Option("--samples", "-k", help="samples per problem (k)")] = 4,
    library: Annotated[Optional[list[str]], typer.Option(
        help="`none`, a version id, `latest`, or an exported library file; repeat to compare several on the same "
             "problems and seeds (the first is the baseline; `none` is added first if missing)")] = None,
    reward: Annotated[str, typer.Option(help="reward name or module:function")] = "math",
    limit: Annotated[Optional[int], typer.Option(help="only the first N problems")] = None,
    python_tool: PythonToolOption = False,
    temperature: float = 0.7,
    max_completion_tokens: Annotated[int, typer.Option(help="longest answer, tokens")] = 512,
    max_library_tokens: Annotated[Optional[int], typer.Option(
        help="override the cap each version records (default: render it as its run did)")] = None,
    seed: int = 0,
    report: Annotated[Path, typer.Option(help="JSON report file")] = Path("eval-report.json"),
    plot: Annotated[Optional[Path], typer.Option(help="PNG of the comparison (default: beside the report)")] = None,
    problem_field: ProblemField = None,
    answer_field: AnswerField = None,
    backend: BackendKind = "auto",
    base_url: BaseUrl = None,
    model: Model = None,
    api_key: ApiKey = None,
    model_file: ModelFile = None,
    concurrency: Concurrency = "8",
    timeout: Timeout = 600.0,
    report_to: ReportTo = "none",
    mlflow_tracking_uri: MlflowUri = None,
    workspace: Workspace = None,
) -> None:
    """Mean@k, Pass@k and majority@k with 95% intervals for one library, or a paired comparison of several."""
    check_target(report_to)
    from gym_tf.compare import compare, plot as plot_comparison
    from gym_tf.display import comparison_table

    problems = load_dataset(dataset, problem_field, answer_field, require_answer=reward not in ANSWER_FREE, limit=limit)
    store = RunStore(workspace)
    refs = ["none" if r in ("none", "empty") else r for r in (library or ["none"])]
    if len(refs) > 1 and refs[0] != "none":
        refs = ["none", *[r for r in refs if r != "none"]]
    arms = []
    for ref in refs:
        lib = resolve_library(store, None if ref == "none" else ref)
        spent = learning_tokens(store, lib)
        if max_library_tokens is not None:
            lib = with_policy(lib, lib.policy.model_copy(update={"max_tokens": max_library_tokens}))
        arms.append((ref, lib, spent))
    config = backend_config(backend, base_url, model, api_key, model_file, concurrency, timeout)
    sampling = RolloutConfig(temperature=temperature, max_completion_tokens=max_completion_tokens).sampling()

    async def main():
        engine = await make_backend(config)
        solver = PythonTool(engine) if python_tool else engine
        try:
            scorer = load_reward(reward, judge_backend=engine)
            sampled = len({lib.id for _, lib, _ in arms})  # a version named twice is sampled once (compare)
            with progress_bar("eval", len(problems) * sampled) as advance:
                return await compare(solver, problems, scorer, samples, sampling, arms, seed,
                                     on_group=lambda name, p, g: advance(f"eval library {name}", key=name),
                                     constant=reward != "judge" and len(arms) > 1)  # shown beside libraries
        finally:
            await engine.aclose()

    result = asyncio.run(main())
    result.extra.update(dataset=dataset, model=result.baseline.report.model)
    recorded = result.record(store, dataset)
    report_to_mlflow(report_to, mlflow_tracking_uri, evaluation=(store, recorded))
    if len(arms) == 1:
        only = result.baseline.report
        only.extra["dataset"] = dataset
        only.write(report)
        console.print(metrics_table(only.metrics, f"{only.model} | library {short(arms[0][1].id)} ({len(arms[0][1].items)} items)"))
        console.print(f"tokens: {only.prompt_tokens} prompt + {only.completion_tokens} completion; report: {report} "
                      f"(studio: /ui/evaluations/{recorded})", highlight=False)
        return
    result.extra["reports"] = {a.name: a.report.to_dict() for a in result.arms}
    result.write(report)
    picture = plot or report.with_suffix(".png")
    plot_comparison(result, picture, f"{result.baseline.report.model}: {dataset}, {len(problems)} problems x {samples}")
    console.print(comparison_table(result))
    console.print(f"report: {report}; plot: {picture}; studio: /ui/evaluations/{recorded}", highlight=False)


def learning_tokens(store: RunStore, lib: Any) -> int:
    """Tokens the run that made this version spent, all stages (0 for no library or one from a file)."""
    try:
        run_id = store.version_row(lib.id)["run_id"]
    except Exception:  # noqa: BLE001 - a library read from a file or an unrecorded re-rendering: unknown cost
        return 0
    return sum(u["prompt"] + u["completion"] for u in store.usage(run_id).values()) if run_id else 0


class progress_bar:
    """A bar on a terminal; where stderr is no terminal (CI, nohup, a job runner), a plain line at least every
    `every` seconds and on each `advance(label)` whose label changed, so a log shows the command alive."""

    def __init__(self, label: str, total: int | None, every: float = 30.0):
        self.label, self.total, self.every = label, total, every
        self.done, self.last_line, self.last_label = 0, 0.0, None
        self.start = time.monotonic()

    def __enter__(self) -> Callable[..., None]:
        if err.is_terminal:
            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn(), console=err)
            self.bar.__enter__()
            self.task = self.bar.add_task(self.label, total=self.total)
        return self.advance

    def advance(self, label: str | None = None, completed: int | None = None, total: int | None = None,
                key: object = None) -> None:
        self.done = self.done + 1 if completed is None else completed
        self.total = total if total is not None else self.total
        if err.is_terminal:
            self.bar.update(self.task, completed=self.done, total=self.total, description=label or self.label)
            return
        now = time.monotonic()
        key = label if key is None else key
        if key != self.last_label or now - self.last_line >= self.every:
            of = f"/{self.total}" if self.total else ""
            print(f"[{now - self.start:5.0f}s] {label or self.label} ({self.done}{of})", file=sys.stderr, flush=True)
            self.last_line, self.last_label = now, key

    def __exit__(self, *exc: object) -> None:
        if err.is_terminal:
            self.bar.__exit__(*exc)


# --- optimize ---------------------------------------------------------------------------------------------------------


@app.command()
@fails_cleanly
def optimize(
    dataset: Annotated[str, typer.Option(help="training problems file, `datasets` directory, or `quickstart`")] = "quickstart",
    epochs: int = 3,
    batch_size: Annotated[int, typer.Option(help="problems per step")] = 8,
    group_size: Annotated[int, typer.Option("--group-size", "-G", help="answers per problem")] = 4,
    seed: int = 0,
    reward: Annotated[str, typer.Option(help="reward name or module:function")] = "math",
    limit: Annotated[Optional[int], typer.Option(help="only the first N training problems")] = None,
    val_dataset: Annotated[Optional[str], typer.Option(help="held-out problems for the validation gate")] = None,
    val_samples: int = 4,
    prune: Annotated[bool, typer.Option(help="with --val-dataset: after the last step, leave each item out in turn "
                                             "(its credit) and drop the lessons that showed no help")] = True,
    max_tokens: Annotated[Optional[int], typer.Option(help="token budget for the whole run")] = None,
    learn_minutes: Annotated[Optional[float], typer.Option(
        help="start no learning step after this many minutes of learning; the prune step still runs")] = None,
    max_completion_tokens: Annotated[int, typer.Option(help="longest answer, tokens")] = 512,
    max_library_tokens: Annotated[Optional[int], typer.Option(help="cap on the rendered library")] = 1024,
    retrieve_lessons: Annotated[Optional[int], typer.Option(help="show each problem only its N most relevant lessons")] = None,
    examples_per_prompt: Annotated[int, typer.Option(help="worked examples shown per problem (most relevant first)")] = 2,
    worked_examples: Annotated[bool, typer.Option(help="keep verified correct answers as worked examples")] = True,
    examples_as_turns: Annotated[bool, typer.Option(
        help="show worked examples as earlier turns of the chat, not as system-message text (recorded in each "
             "version, so eval and serve show them alike)")] = False,
    examples_per_answer: Annotated[Optional[int], typer.Option(
        help="keep at most N worked examples with the same final answer (none: no limit)")] = None,
    refuse_copied_examples: Annotated[bool, typer.Option(
        help="keep no answer that copies a worked example's solution as another worked example")] = False,
    refuse_answer_in_problem: Annotated[bool, typer.Option(
        help="keep no worked example of a problem whose answer stands in its own statement (a palindrome to spell "
             "backward), unless most problems are like that")] = False,
    learner_examples: Annotated[int, typer.Option(help="where the model answered a problem right in no showable way, "
                                                       "the learner answers it N times; a verified answer becomes "
                                                       "the worked example")] = 0,
    hinted_examples: Annotated[int, typer.Option(help="where no answer to a problem is fit to show, the model answers "
                                                      "it N times told its reference answer; a verified answer that "
                                                      "does not say it was told becomes the worked example")] = 0,
    labeled_examples: Annotated[bool, typer.Option(
        help="where still no answer to a problem is fit to show, its reference answer alone (no working) becomes the "
             "worked example: it shows the answer's form and length, for a model that solves almost none")] = False,
    python_tool: PythonToolOption = False,
    temperature: float = 0.7,
    summarize: Annotated[bool, typer.Option(
        help="summarize each rollout first (the paper's design; off by default: on the 0.5B it cost 19% more "
             "learning tokens for the same gain)")] = False,
    hard_groups: Annotated[str, typer.Option(help="all-fail groups: skip | reference")] = "skip",
    resume: Annotated[Optional[str], typer.Option(help="continue a crashed or stopped run by id")] = None,
    problem_field: ProblemField = None,
    answer_field: AnswerField = None,
    backend: BackendKind = "auto",
    base_url: BaseUrl = None,
    model: Model = None,
    api_key: ApiKey = None,
    model_file: ModelFile = None,
    concurrency: Concurrency = "8",
    timeout: Timeout = 600.0,
    learner_base_url: Annotated[Optional[list[str]], typer.Option(
        help="a different server for the learning stages; repeat for replicas")] = None,
    learner_model: Annotated[Optional[str], typer.Option(help="the learning stages' model")] = None,
    learner_model_file: Annotated[Optional[str], typer.Option(
        help="a local GGUF file for the learning stages, run by the embedded engine (e.g. a larger model than "
             "the policy)")] = None,
    from_traffic: Annotated[bool, typer.Option(help="learn from the requests `serve --record` kept and their "
                                                    "feedback, instead of --dataset")] = False,
    tenant: Annotated[str, typer.Option(help="with --from-traffic: whose traffic, and whose library line")] = "default",
    since: Annotated[Optional[str], typer.Option(help="with --from-traffic: only requests since 7d / 12h / an ISO "
                                                      "date")] = None,
    val_fraction: Annotated[float, typer.Option(help="with --from-traffic: share of feedback-labelled requests held "
                                                     "out as the gate")] = 0.0,
    traffic_fallback: Annotated[str, typer.Option(help="with --from-traffic: reward for requests without feedback")] = "majority",
    promote: Annotated[bool, typer.Option(help="serve the result to the tenant if it passed the gate (needs "
                                               "--val-dataset or --val-fraction)")] = False,
    report_to: ReportTo = "none",
    mlflow_tracking_uri: MlflowUri = None,
    workspace: Workspace = None,
) -> None:
    """Learn an experience library for the frozen model (Training-Free GRPO) and print it."""
    from gym_tf.learn import from_traffic as traffic_config, promote_if_passed
    from gym_tf.traffic import parse_since

    check_target(report_to)
    store = RunStore(workspace)
    if resume:
        run_id, config = resume_config(store, resume, max_tokens, learn_minutes)
        config = config.model_copy(update={"backend": config.backend.model_copy(update={"api_key": api_key})})
    else:
        run_id = None
        learner = None
        if learner_base_url or learner_model or learner_model_file:
            learner_url = learner_base_url or (None if learner_model_file else base_url)
            learner = backend_config("auto", learner_url, learner_model, api_key, learner_model_file,
                                     concurrency, timeout)
        config = OptimizeConfig(
            dataset=dataset, problem_field=problem_field, answer_field=answer_field, limit=limit, epochs=epochs,
            batch_size=batch_size, group_size=group_size, seed=seed, reward=reward, val_dataset=val_dataset,
            val_samples=val_samples, prune=prune, max_tokens=max_tokens, learn_minutes=learn_minutes,
            max_library_tokens=max_library_tokens,
            retrieve_lessons=retrieve_lessons, examples_per_prompt=examples_per_prompt, worked_examples=worked_examples,
            examples_as_turns=examples_as_turns,
            examples_per_answer=examples_per_answer, refuse_copied_examples=refuse_copied_examples,
            refuse_answer_in_problem=refuse_answer_in_problem,
            learner_examples=learner_examples, hinted_examples=hinted_examples, labeled_examples=labeled_examples,
            summarize=summarize,
            hard_groups=hard_groups, python_tool=python_tool,
            rollout=RolloutConfig(temperature=temperature, max_completion_tokens=max_completion_tokens),
            backend=backend_config(backend, base_url, model, api_key, model_file, concurrency, timeout), learner=learner,
        )
        if from_traffic:
            config = traffic_config(store, config, tenant, parse_since(since) if since else 0.0, val_fraction,
                                    traffic_fallback)
    if promote and not config.val_dataset:
        raise ConfigError("--promote needs a gate: --val-dataset, or --val-fraction with --from-traffic")

    result = asyncio.run(run_optimizer(config, store, run_id))
    print_result(store, result)
    report_to_mlflow(report_to, mlflow_tracking_uri, run=(store, result.run_id))
    if promote:
        console.print(promote_if_passed(store, result.run_id).reason, highlight=False)


async def run_optimizer(config: OptimizeConfig, store: RunStore, run_id: str | None = None) -> Any:
    """One optimize run (new or resumed) with its backends and a progress bar; the RunResult."""
    engine = await make_backend(config.backend)
    learner_engine = await make_backend(config.learner) if config.learner else None
    try:
        with progress_bar("starting", None) as advance:

            def show(p):
                advance(progress_line(p), completed=max(0, p.step - 1), total=p.total_steps, key=(p.epoch, p.step))

            optimizer = Optimizer(config, store, engine, learner_engine, run_id=run_id, on_progress=show)
            err.print(f"run {optimizer.run_id} on {engine.describe()}", highlight=False)
            result = await optimizer.run()
            advance(progress_line(result.progress), total=result.progress.total_steps,
                    completed=result.progress.total_steps if result.status == "finished" else result.progress.step)
            return result
    finally:
        await engine.aclose()
        if learner_engine:
            await learner_engine.aclose()


def print_result(store: RunStore, result: Any) -> None:
    console.print(library_table(result.library))
    usage = store.usage(result.run_id)
    console.print("tokens by stage: " + ", ".join(f"{s} {u['prompt']}+{u['completion']}" for s, u in usage.items()))
    for note in result.progress.notes:
        console.print(note)
    console.print(f"run {result.run_id} {result.status}; library {short(result.library.id)}")
    if result.library.items:
        console.print(f"compare it with no library on held-out problems: gym-tf eval --dataset HELD_OUT.jsonl "
                      f"--library none --library {short(result.library.id)} -k 4"
                      + (" --python-tool" if store.run(result.run_id)["config"].get("python_tool") else ""),
                      highlight=False)


# --- gradient training ----------------------------------------------------------------------------------------------


@app.command()
@fails_cleanly
def train(
    model: Annotated[Optional[str], typer.Option(help="local Hugging Face model directory (not with --resume)")] = None,
    method: Annotated[str, typer.Option(help="grpo | gspo")] = "grpo",
    dataset: Annotated[str, typer.Option(help="training problems file, `datasets` directory, or `quickstart`")] = "quickstart",
    reward: Annotated[str, typer.Option(help="reward name or module:function")] = "math",
    lora: Annotated[bool, typer.Option(help="train LoRA adapters (PEFT) instead of all weights")] = False,
    lora_rank: int = 16,
    lora_alpha: int = 32,
    rslora: Annotated[bool, typer.Option(help="rank-stabilized LoRA scaling")] = False,
    merge: Annotated[bool, typer.Option(help="also write the adapter merged into a full model (OUTPUT/merged)")] = False,
    group_size: Annotated[int, typer.Option("--group-size", "-G")] = 4,
    prompts_per_step: int = 2,
    max_steps: Annotated[Optional[int], typer.Option(help="optimizer steps [default: 10]; with --resume, raise it "
                                                          "to train on past the run's end")] = None,
    learning_rate: float = 1e-5,
    beta: Annotated[float, typer.Option(help="KL coefficient to the frozen reference")] = 0.0,
    num_iterations: Annotated[int, typer.Option(help="policy updates per generated batch")] = 1,
    max_completion_tokens: int = 128,
    limit: Optional[int] = None,
    seed: int = 0,
    output: Annotated[Path, typer.Option(help="checkpoints and the final adapter / model")] = Path("gym-tf-train"),
    resume: Annotated[Optional[str], typer.Option(help="continue a train run by id, with its own settings, from the "
                                                       "last checkpoint in its output folder")] = None,
    report_to: ReportTo = "none",
    mlflow_tracking_uri: MlflowUri = None,
    workspace: Workspace = None,
) -> None:
    """Gradient RL (GRPO / GSPO, optionally LoRA) on the same data and rewards as optimize (needs gym-tf[train])."""
    from gym_tf.train import TrainConfig, merge_adapter, resume_train_config
    from gym_tf.train import train as run_training

    check_target(report_to)
    store = RunStore(workspace)
    if resume:
        run_id, config = resume_train_config(store, resume, max_steps)
    elif model is None:
        raise ConfigError("--model is required (or --resume RUN_ID to continue a train run)")
    else:
        run_id = None
        steps = {} if max_steps is None else {"max_steps": max_steps}
        config = TrainConfig(method=method, model=model, dataset=dataset, reward=reward, lora=lora, lora_rank=lora_rank,
                             lora_alpha=lora_alpha, rslora=rslora, group_size=group_size,
                             prompts_per_step=prompts_per_step, learning_rate=learning_rate, beta=beta,
                             num_iterations=num_iterations, max_completion_tokens=max_completion_tokens, limit=limit,
                             seed=seed, output_dir=str(output), **steps)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err) as bar:
        task = bar.add_task("training", total=config.max_steps)

        def show(log: dict) -> None:
            bar.update(task, completed=log["step"], description=f"step {log['step']} loss {log.get('loss', 0):.4f} "
                       f"reward {log.get('reward', 0):.3f} kl {log.get('kl', 0):.4f}")

        run_id, out = run_training(config, store, run_id=run_id, on_log=show)
    console.print(f"run {run_id} finished; {'adapter' if config.lora else 'model'} in {out}", highlight=False)
    report_to_mlflow(report_to, mlflow_tracking_uri, run=(store, run_id))
    if config.lora and merge:
        console.print(f"merged model in {merge_adapter(out, Path(config.output_dir) / 'merged')}", highlight=False)


# --- runs and libraries ---------------------------------------------------------------------------------------------


@app.command()
@fails_cleanly
def runs(workspace: Workspace = None) -> None:
    """List runs in the workspace, newest first."""
    console.print(runs_table(RunStore(workspace).runs()))


@library_app.command("show")
@fails_cleanly
def library_show(
    version: Annotated[str, typer.Argument(help="version id or prefix, `latest`, or a library file")] = "latest",
    rendered: Annotated[bool, typer.Option(help="print the exact prompt text instead of a table (with examples "
                                                "shown as turns, the messages before a request's own)")] = False,
    workspace: Workspace = None,
) -> None:
    """Show one library version (default: the newest promoted)."""
    lib = resolve_library(RunStore(workspace), version)
    console.print(rendered_prompt(lib) if rendered else library_table(lib), highlight=False, markup=not rendered)


@library_app.command("diff")
@fails_cleanly
def library_diff(a: str, b: str, workspace: Workspace = None) -> None:
    """The ops applied between version A and its descendant B, and the items that differ."""
    store = RunStore(workspace)
    console.print(diff_text(diff_versions(store, resolve_library(store, a), resolve_library(store, b))))


@library_app.command("export")
@fails_cleanly
def library_export(version: str, output: Annotated[Path, typer.Option("-o", "--output")], workspace: Workspace = None) -> None:
    """Write a library version to a JSON file that `import` and `eval --library` read."""
    lib = resolve_library(RunStore(workspace), version)
    export_library(lib, output)
    console.print(f"wrote {output} ({short(lib.id)}, {len(lib.items)} items)")


@library_app.command("import")
@fails_cleanly
def library_import(path: Path, workspace: Workspace = None) -> None:
    """Add an exported library file to this workspace; its id is checked against its content."""
    lib = read_library_file(path)
    RunStore(workspace).put_version(lib, run_id="", status="imported")
    console.print(f"imported {lib.id}")


@library_app.command("promote")
@fails_cleanly
def library_promote(version: str, tenant: Annotated[str, typer.Option(help="whose served library")] = "default",
                    workspace: Workspace = None) -> None:
    """Make VERSION the library `gym-tf serve` answers with; running servers switch without a restart."""
    from gym_tf.errors import ConfigError
    from gym_tf.tenants import check_tenant, may_serve

    store = RunStore(workspace)
    lib = resolve_library(store, version)
    if not may_serve(store, lib.id, check_tenant(tenant)):
        raise ConfigError(f"version {lib.id} was learned from another tenant's traffic: it is never served to {tenant!r}")
    store.promote(lib.id, name=tenant)
    console.print(f"serving {lib.id}{'' if tenant == 'default' else ' to tenant ' + tenant}")


@app.command()
@fails_cleanly
def serve(
    upstream: Annotated[Optional[list[str]], typer.Option(
        help="OpenAI-compatible upstream (.../v1); repeat for replicas of one model; none: the embedded model")] = None,
    model: Annotated[Optional[str], typer.Option(help="the upstream's model name (default: the first it serves)")] = None,
    upstream_api_key: Annotated[Optional[str], typer.Option(envvar="GYM_TF_UPSTREAM_API_KEY", help="key for the upstream")] = None,
    model_file: ModelFile = None,
    library: Annotated[Optional[str], typer.Option(help="version id, `latest`, or a library file to serve")] = None,
    api_key: Annotated[Optional[list[str]], typer.Option(help="accepted client key (repeatable); env GYM_TF_SERVER_API_KEYS, comma-separated")] = None,
    admin_key: AdminKey = None,
    max_library_tokens: Annotated[Optional[int], typer.Option(
        help="override the cap each version records (default: render it as its run did)")] = None,
    max_body_bytes: int = 4 * 1024 * 1024,
    timeout: Timeout = 600.0,
    host: str = "127.0.0.1",
    port: int = 8000,
    follow: Annotated[Optional[str], typer.Option(
        help="be a replica: serve what the `gym-tf serve` at this URL (.../v1) serves, fetched from IPFS and "
             "verified (needs --signer)")] = None,
    follow_key: Annotated[Optional[str], typer.Option(envvar="GYM_TF_FOLLOW_KEY", help="API key for --follow")] = None,
    follow_interval: Annotated[float, typer.Option(help="seconds between looks at the primary")] = 5.0,
    signer: Annotated[Optional[str], typer.Option(help="with --follow: the address that must have signed")] = None,
    gateway: Annotated[Optional[str], typer.Option(help="with --follow: read-only IPFS gateway URL")] = None,
    ipfs_api: IpfsApi = None,
    record: Annotated[bool, typer.Option(help="keep each request, answer and its feedback in the workspace, to "
                                              "learn from (`optimize --from-traffic`)")] = False,
    record_max_days: Annotated[float, typer.Option(help="delete recorded exchanges older than this")] = 30.0,
    record_max_rows: Annotated[int, typer.Option(help="keep at most this many recorded exchanges (newest)")] = 1_000_000,
    redact: Annotated[Optional[str], typer.Option(help="`module:function` applied to each exchange before it is "
                                                       "stored; returns it changed, or None to keep nothing")] = None,
    tenants: Annotated[Optional[Path], typer.Option(help="TOML file of tenants and their keys: each its own "
                                                         "library, traffic and feedback")] = None,
    workspace: Workspace = None,
) -> None:
    """A drop-in OpenAI-compatible endpoint that puts the learned library into every prompt."""
    import os

    import uvicorn

    from gym_tf.tenants import load_tenants
    from server import ServerConfig, create_app
    from server.recording import Recorder, RecordSettings
    from server.upstream import Upstream, UpstreamPool, start_embedded

    store = RunStore(workspace)
    owners = load_tenants(tenants) if tenants else {}
    recorder = Recorder(store.root, RecordSettings(record_max_days, record_max_rows, redact)) if record else None
    if library:
        lib = resolve_library(store, library)
        if Path(library).is_file():
            store.put_version(lib, run_id="", status="imported")
        store.promote(lib.id)
    keys = list(api_key or []) + [k for k in os.environ.get("GYM_TF_SERVER_API_KEYS", "").split(",") if k]
    admins = admin_keys(admin_key)
    keys += [k for k in owners if k not in keys]
    engine = None  # the embedded llama.cpp server, kept alive while serving
    if upstream:
        members = [Upstream(url, model, upstream_api_key, timeout) for url in upstream]
        target = members[0] if len(members) == 1 else UpstreamPool(members)
    else:
        target, engine = start_embedded(model_file)
    follower = None
    if follow:
        from server.follow import Follower

        if not signer:
            raise ConfigError("--follow needs --signer: a replica serves only what the expected key signed")
        follower = Follower(store, follow, ipfs_transport(store, ipfs_api, None, gateway), signer, follow_key,
                            follow_interval)
    app_ = create_app(target, store, ServerConfig(api_keys=keys, max_body_bytes=max_body_bytes,
                                                  max_library_tokens=max_library_tokens, admin_keys=admins,
                                                  tenants=owners), recorder, follower=follower)
    err.print(f"serving {target.model} from {target.base_url} on http://{host}:{port}/v1; studio on "
              f"http://{host}:{port}/ui"
              f"{'; recording to ' + str(store.root) if record else ''}"
              f"{'; tenants ' + ', '.join(sorted(set(owners.values()))) if owners else ''}", highlight=False)
    uvicorn.run(app_, host=host, port=port, log_level="warning")
    del engine


AdminKey = Annotated[Optional[list[str]], typer.Option(
    help="key that may also promote and roll back in the studio (repeatable); env GYM_TF_ADMIN_KEYS, comma-separated")]


def admin_keys(given: list[str] | None) -> list[str]:
    import os

    return list(given or []) + [k for k in os.environ.get("GYM_TF_ADMIN_KEYS", "").split(",") if k]


@app.command()
@fails_cleanly
def ui(
    api_key: Annotated[Optional[list[str]], typer.Option(help="key that may read the pages (repeatable); env GYM_TF_SERVER_API_KEYS, comma-separated; none: open")] = None,
    admin_key: AdminKey = None,
    host: str = "127.0.0.1",
    port: int = 8001,
    workspace: Workspace = None,
) -> None:
    """The studio alone, on a workspace (no model needed): runs, curves, versions, provenance, evaluations, ledger.
    Read-only unless an admin key is given."""
    import os

    import uvicorn

    from gym_tf.errors import StoreError
    from gym_tf.store import workspace_path
    from gym_tf.studio import StudioConfig, studio_app

    if not (workspace_path(workspace) / "gym-tf.db").is_file():
        raise StoreError(f"no workspace at {workspace_path(workspace)} (run `gym-tf optimize` first, or pass --workspace)")
    keys = list(api_key or []) + [k for k in os.environ.get("GYM_TF_SERVER_API_KEYS", "").split(",") if k]
    app_ = studio_app(RunStore(workspace), StudioConfig(keys, admin_keys(admin_key)))
    err.print(f"studio on http://{host}:{port}/ui", highlight=False)
    uvicorn.run(app_, host=host, port=port, log_level="warning")


# --- ledger, keys, publishing, anchors ------------------------------------------------------------------------------

ledger_app = typer.Typer(help="The Merkle log of library versions: root, proofs, verification.", no_args_is_help=True)
keys_app = typer.Typer(help="Signing keys (Ethereum, EIP-191).", no_args_is_help=True)
app.add_typer(ledger_app, name="ledger")
app.add_typer(keys_app, name="keys")
KeyFile = Annotated[Optional[Path], typer.Option("--key", help="private key file (default: $GYM_TF_SIGNING_KEY)")]
IpfsApi = Annotated[Optional[str], typer.Option(help="Kubo RPC API, e.g. http://127.0.0.1:5001 (default: embedded node)")]
IpfsRepo = Annotated[Optional[Path], typer.Option(envvar="GYM_TF_IPFS_REPO", help="embedded node's repo (default: WORKSPACE/ipfs)")]
RpcUrl = Annotated[str, typer.Option(envvar="GYM_TF_RPC_URL", help="Ethereum-compatible JSON-RPC endpoint")]


IpfsTimeout = Annotated[float, typer.Option("--timeout", help="longest wait for the IPFS node or chain, seconds")]


def ipfs_transport(store: RunStore, ipfs_api: str | None, repo: Path | None, gateway: str | None = None,
                   timeout: float = 60.0):
    from ledger.ipfs import EmbeddedNode, Gateway, KuboRPC

    if ipfs_api:
        return KuboRPC(ipfs_api, timeout)
    if gateway:
        return Gateway(gateway, timeout)
    return EmbeddedNode(repo or store.root / "ipfs", timeout)


def print_json(document: Any) -> None:
    typer.echo(json.dumps(document, indent=2))


@ledger_app.command("root")
@fails_cleanly
def ledger_root(workspace: Workspace = None) -> None:
    """Print the log's size and current root."""
    log = RunStore(workspace).ledger
    print_json({"tree_size": log.size, "root": log.root()})


@ledger_app.command("prove")
@fails_cleanly
def ledger_prove(version: str, workspace: Workspace = None) -> None:
    """Inclusion proof (JSON) of a version's entry in the current log."""
    from gym_tf.publishing import prove_version

    store = RunStore(workspace)
    print_json(prove_version(store, resolve_library(store, version).id))


@ledger_app.command("prove-consistency")
@fails_cleanly
def ledger_prove_consistency(old_root: str, workspace: Workspace = None) -> None:
    """Proof (JSON) that the log with OLD_ROOT was only appended to since."""
    from gym_tf.publishing import prove_consistency

    print_json(prove_consistency(RunStore(workspace), old_root))


@ledger_app.command("verify")
@fails_cleanly
def ledger_verify(workspace: Workspace = None) -> None:
    """Re-derive every CID, leaf hash and the root from stored bytes; fail naming the first bad entry."""
    from gym_tf.publishing import verify_ledger

    size, root = verify_ledger(RunStore(workspace))
    console.print(f"ledger ok: {size} entries, root {root}")


@keys_app.command("new")
@fails_cleanly
def keys_new(path: Annotated[Path, typer.Argument(help="where to write the key (mode 0600)")] = Path("gym-tf.key")) -> None:
    """Make a signing key; prints its address, never the key."""
    from ledger.signing import new_key

    console.print(f"address {new_key(path)}; key written to {path}")


@app.command()
@fails_cleanly
def publish(version: Annotated[str, typer.Argument(help="version id or prefix, or `latest`")] = "latest",
            key: KeyFile = None, ipfs_api: IpfsApi = None, ipfs_repo: IpfsRepo = None, timeout: IpfsTimeout = 60.0,
            workspace: Workspace = None) -> None:
    """Sign a manifest for VERSION and put it, with the library, on IPFS; prints the address to fetch."""
    from gym_tf.publishing import publish as publish_version
    from ledger.signing import load_key

    store = RunStore(workspace)
    lib = resolve_library(store, version)
    result = publish_version(store, lib.id, load_key(key), ipfs_transport(store, ipfs_api, ipfs_repo, None, timeout))
    console.print(f"published {lib.id}\nmanifest {result.manifest_address}\nsigner {result.manifest['signer']}",
                  highlight=False)


@app.command()
@fails_cleanly
def fetch(address: Annotated[str, typer.Argument(help="the manifest's CID, as `publish` printed it")],
          signer: Annotated[Optional[str], typer.Option(help="expected signer address 0x... (required)")] = None,
          trust_any_signer: Annotated[bool, typer.Option(help="accept a manifest signed by anyone (not checked!)")] = False,
          anchor_tx: Annotated[Optional[str], typer.Option("--anchor", help="a transaction that must anchor the "
                                                           "manifest's root, sent by its signer")] = None,
          rpc_url: RpcUrl = "http://127.0.0.1:8545",
          ipfs_api: IpfsApi = None, gateway: Annotated[Optional[str], typer.Option(help="read-only IPFS gateway URL")] = None,
          ipfs_repo: IpfsRepo = None, timeout: IpfsTimeout = 60.0, workspace: Workspace = None) -> None:
    """Fetch a published library, verify CIDs, signature, inclusion proof (and anchor), and only then import it."""
    from gym_tf.publishing import fetch as fetch_version
    from ledger.chain import connect

    if trust_any_signer and not signer:
        err.print("WARNING: --trust-any-signer: the signature is not checked against anyone you trust; whoever "
                  "signed this manifest is accepted", style="bold red", highlight=False)
    store = RunStore(workspace)
    transport = ipfs_transport(store, ipfs_api, ipfs_repo, gateway, timeout)
    w3 = connect(rpc_url, timeout) if anchor_tx else None
    version, manifest = fetch_version(store, address, transport, signer, trust_any_signer=trust_any_signer, w3=w3,
                                      anchor_tx=anchor_tx)
    anchored = f"; its root is anchored in {anchor_tx}" if anchor_tx else ""
    console.print(f"verified and imported {version.id} ({len(version.items)} items) signed by {manifest['signer']}"
                  f"{' (UNCHECKED signer)' if not signer else ''}{anchored}", highlight=False)


@app.command()
@fails_cleanly
def anchor(rpc_url: RpcUrl = "http://127.0.0.1:8545", key: KeyFile = None, workspace: Workspace = None) -> None:
    """Write the ledger's current root to an Ethereum-compatible chain."""
    from gym_tf.publishing import anchor_root
    from ledger.chain import connect
    from ledger.signing import load_key

    tx, root, size = anchor_root(RunStore(workspace), connect(rpc_url), load_key(key), rpc_url)
    console.print(f"anchored root {root} (tree size {size}) in transaction {tx}", highlight=False)


@app.command("verify-anchor")
@fails_cleanly
def verify_anchor_command(tx: str, rpc_url: RpcUrl = "http://127.0.0.1:8545",
                          sender: Annotated[Optional[str], typer.Option(help="expected anchoring address 0x... "
                                                                        "(default: the one this workspace used)")] = None,
                          workspace: Workspace = None) -> None:
    """Read an anchored root back from the chain and check the log against it."""
    from gym_tf.publishing import verify_anchor
    from ledger.chain import connect

    result = verify_anchor(RunStore(workspace), connect(rpc_url), tx, sender)
    console.print(f"anchor ok: root {result['root']} at tree size {result['tree_size']} (block {result['block']}, "
                  f"sender {result['sender']}); the log has only been appended to since ({result['current_size']} entries)",
                  highlight=False)


# --- production traffic: recording switches, learning from it ---------------------------------------------------------

traffic_app = typer.Typer(help="What `serve --record` keeps: pause or resume recording, counts, forgetting.",
                          no_args_is_help=True)
app.add_typer(traffic_app, name="traffic")
Tenant = Annotated[str, typer.Option(help="tenant name (`default`: keys named in no tenants file)")]


@traffic_app.command("pause")
@fails_cleanly
def traffic_pause(workspace: Workspace = None) -> None:
    """Kill switch: running servers stop recording within a second (the file WORKSPACE/recording.off)."""
    from server.recording import KILL_FILE

    path = RunStore(workspace).root / KILL_FILE
    path.touch()
    console.print(f"recording paused ({path} exists)", highlight=False)


@traffic_app.command("resume")
@fails_cleanly
def traffic_resume(workspace: Workspace = None) -> None:
    """Let running `serve --record` servers record again."""
    from server.recording import KILL_FILE

    (RunStore(workspace).root / KILL_FILE).unlink(missing_ok=True)
    console.print("recording resumed")


@traffic_app.command("stats")
@fails_cleanly
def traffic_stats(tenant: Tenant = "default", since: Annotated[Optional[str], typer.Option(help="7d / 12h / ISO date")] = None,
                  workspace: Workspace = None) -> None:
    """Recorded requests and feedback of one tenant."""
    from gym_tf.traffic import TrafficLog, parse_since

    log = TrafficLog(RunStore(workspace).root)
    print_json({"tenant": tenant, **log.counts(tenant, parse_since(since) if since else 0.0)})


@traffic_app.command("merge")
@fails_cleanly
def traffic_merge(other: Annotated[list[Path], typer.Argument(help="another replica's workspace (or its traffic.db)")],
                  workspace: Workspace = None) -> None:
    """Take in what other serving replicas recorded, so one `optimize --from-traffic` learns from all of them."""
    from gym_tf.traffic import TrafficLog

    log = TrafficLog(RunStore(workspace).root)
    for path in other:
        added = log.merge(path)
        console.print(f"{path}: {added['exchanges']} exchanges and {added['feedback']} feedback rows taken in",
                      highlight=False)


@traffic_app.command("forget")
@fails_cleanly
def traffic_forget(tenant: Tenant, workspace: Workspace = None) -> None:
    """Delete every recorded request and feedback of a tenant."""
    from gym_tf.traffic import TrafficLog

    console.print(f"deleted {TrafficLog(RunStore(workspace).root).forget(tenant)} recorded requests of {tenant!r}")


@app.command()
@fails_cleanly
def learn(
    watch: Annotated[bool, typer.Option(help="keep going: learn again whenever enough new feedback arrived")] = False,
    tenant: Tenant = "default",
    min_feedback: Annotated[int, typer.Option(help="new feedback rows that start a learning run")] = 20,
    interval: Annotated[float, typer.Option(help="seconds between looks at the feedback count")] = 60.0,
    rounds: Annotated[Optional[int], typer.Option(help="stop after this many learning runs")] = None,
    since: Annotated[Optional[str], typer.Option(help="only requests since 7d / 12h / an ISO date")] = None,
    val_fraction: Annotated[float, typer.Option(help="share of feedback-labelled requests held out as the gate")] = 0.3,
    val_dataset: Annotated[Optional[str], typer.Option(help="a fixed gate instead of the held-out slice")] = None,
    traffic_fallback: Annotated[str, typer.Option(help="reward for requests without feedback")] = "majority",
    reward: Annotated[str, typer.Option(help="reward against a corrected or approved answer")] = "math",
    epochs: int = 1,
    batch_size: Annotated[int, typer.Option(help="problems per step")] = 8,
    group_size: Annotated[int, typer.Option("--group-size", "-G", help="answers per problem")] = 4,
    max_completion_tokens: Annotated[int, typer.Option(help="longest answer, tokens")] = 512,
    backend: BackendKind = "auto",
    base_url: BaseUrl = None,
    model: Model = None,
    api_key: ApiKey = None,
    model_file: ModelFile = None,
    concurrency: Concurrency = 8,
    timeout: Timeout = 600.0,
    workspace: Workspace = None,
) -> None:
    """Learn from a tenant's recorded traffic and feedback, gated, and serve what passes (with --watch, forever)."""
    from gym_tf.errors import ConfigError
    from gym_tf.learn import from_traffic as traffic_config, promote_if_passed, watch as watch_feedback
    from gym_tf.traffic import parse_since

    if not val_dataset and not val_fraction:
        raise ConfigError("learn always gates: give --val-fraction > 0 or --val-dataset")
    store = RunStore(workspace)
    base = OptimizeConfig(dataset="traffic", epochs=epochs, batch_size=batch_size, group_size=group_size,
                          reward=reward, val_dataset=val_dataset,
                          rollout=RolloutConfig(max_completion_tokens=max_completion_tokens),
                          backend=backend_config(backend, base_url, model, api_key, model_file, concurrency, timeout))

    def make_config() -> OptimizeConfig:
        return traffic_config(store, base, tenant, parse_since(since) if since else 0.0,
                              0.0 if val_dataset else val_fraction, traffic_fallback)

    async def one_run(config: OptimizeConfig) -> str:
        result = await run_optimizer(config, store)
        print_result(store, result)
        return result.run_id

    if not watch:
        run_id = asyncio.run(one_run(make_config()))
        console.print(promote_if_passed(store, run_id).reason, highlight=False)
        return
    asyncio.run(watch_feedback(store, make_config, one_run, tenant, min_feedback, interval, rounds,
                               on_round=lambda line: err.print(line, highlight=False)))


def main() -> None:  # pragma: no cover - `python -m gym_tf`
    app(prog_name="gym-tf")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
