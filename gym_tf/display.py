"""Rich renderings the CLI prints: eval tables, run lists, libraries, diffs, and the live optimize panel."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text

from gym_tf.library import LibraryVersion, example_parts, library_messages, render_library, short
from gym_tf.library_io import LibraryDiff
from gym_tf.metrics import Metrics
from gym_tf.optimize import Progress
from gym_tf.store import hinted_answer, learner_answer, reference_answer
from gym_tf.working import false_equation


def metrics_table(metrics: Metrics, title: str) -> Table:
    table = Table(title=title)
    for column in ("metric", "value", "95% CI"):
        table.add_column(column)
    k = metrics.samples
    for name, estimate in [(f"Mean@{k}", metrics.mean_at_k), (f"Pass@{k}", metrics.pass_at_k),
                           (f"Majority@{k}", metrics.majority)]:
        table.add_row(name, f"{estimate.value:.3f}", f"[{estimate.low:.3f}, {estimate.high:.3f}]")
    table.caption = f"{metrics.problems} problems x {k} samples"
    return table


def comparison_table(comparison) -> Table:
    """One column per library, one row per measure: each library against the first (no library), differences
    paired per problem, and the same model's majority vote at equal samples. Fits 80 columns for two libraries."""
    k = comparison.samples
    base = comparison.baseline
    table = Table(title=f"{comparison.problems} problems x {k} samples, same seeds, 95% intervals")
    table.add_column("measure")
    for arm in comparison.arms:
        table.add_column(arm.name if arm is base else f"{arm.name} ({short(arm.library_version)})", overflow="fold")

    def row(name: str, cell) -> None:
        table.add_row(name, *(cell(a) for a in comparison.arms))

    row("items", lambda a: str(a.report.library_items))
    row(f"Mean@{k}", lambda a: str(a.report.metrics.mean_at_k))
    row(f"Pass@{k}", lambda a: str(a.report.metrics.pass_at_k))
    row(f"Majority@{k}", lambda a: str(a.report.metrics.majority))
    row(f"Mean@{k} - {base.name}", lambda a: str(a.vs_baseline) if a.vs_baseline else "-")
    row(f"Majority@{k} - {base.name}'s", lambda a: str(a.majority_vs_baseline) if a.majority_vs_baseline else "-")
    row(f"Mean@{k} - {base.name}'s Maj@{k}",
        lambda a: str(a.mean_vs_baseline_majority) if a.mean_vs_baseline_majority else "-")
    common = comparison.constant
    answer = common and (common.answer if len(common.answer) <= 16 else common.answer[:15] + "…")
    if common:
        row(f"Mean@{k} - {answer!r} always", lambda a: str(a.mean_vs_constant))
        row(f"Mean@{k} - {base.name}, where {answer!r} is wrong",
            lambda a: str(a.vs_baseline_uncommon) if a.vs_baseline_uncommon else "-")
    if any(a.vs_baseline_unstated for a in comparison.arms):
        row(f"Mean@{k} - {base.name}, where the problem does not state its answer",
            lambda a: str(a.vs_baseline_unstated) if a.vs_baseline_unstated else "-")
    if any(a.swapped_mean is not None for a in comparison.arms):
        row(f"Mean@{k} of its answers given to other problems", lambda a: f"{a.swapped_mean:.3f}")
        row(f"Mean@{k} - {base.name}, beyond the answers given to other problems",
            lambda a: str(a.vs_baseline_beyond_swapped) if a.vs_baseline_beyond_swapped else "-")
    if any(a.full_credit_vs_baseline for a in comparison.arms):
        row(f"answers paid in full - {base.name}'s",
            lambda a: str(a.full_credit_vs_baseline) if a.full_credit_vs_baseline else "-")
    copies = any(a.copies for a in comparison.arms)
    if copies:
        row("answers copying an example", lambda a: str(a.copies) if a.copies else "-")
    row("extra prompt tok/call", lambda a: f"{comparison.extra_prompt_tokens(a):+.0f}")
    row("tokens spent learning", lambda a: str(a.learning_tokens or "-"))
    table.caption = "an interval wholly above 0 is a gain beyond noise"
    if copies:
        table.caption += ("\nanswers copying an example: repeating the solution of a worked example in their prompt "
                          "(and how often such copies were right)")
    if common:
        table.caption += f"\n{answer!r} always: the most common answer given to every problem scores {common.mean:.3f}"
    for arm in comparison.arms:
        if arm.same_as:
            table.caption += f"\n{arm.name} sends the same prompts as {arm.same_as}: sampled once, for both"
        if arm.held_in_library:
            table.caption += (f"\nnot held out: {arm.name} holds {len(arm.held_in_library)} of these "
                              f"{comparison.problems} problems verbatim (worked examples of them)")
    return table


def runs_table(runs: list[dict]) -> Table:
    table = Table(title="runs")  # ids are never truncated: they are what users copy
    table.add_column("id", no_wrap=True, min_width=22)
    for column in ("kind", "status", "model", "dataset", "library", "steps", "tokens"):
        table.add_column(column)
    for run in runs:
        summary = run["summary"]
        tokens = sum(u.get("prompt", 0) + u.get("completion", 0) for u in summary.get("tokens", {}).values())
        table.add_row(run["id"], run["kind"], run["status"], run["model"], run["dataset"],
                      short(run["current_version"] or ""), str(summary.get("steps", "")), str(tokens or ""))
    return table


def library_table(library: LibraryVersion, status: str = "") -> Table:
    table = Table(title=f"library {short(library.id)} (step {library.step}, {len(library.items)} items) {status}".strip())
    table.add_column("id")
    table.add_column("kind")
    table.add_column("experience")
    table.add_column("from", overflow="fold")
    for item in library.items:
        origin = item.provenance
        by = (" by the learner" if any(learner_answer(key) for key in origin.rollout_ids)
              else " told the answer" if any(hinted_answer(key) for key in origin.rollout_ids)
              else " (its reference answer, no working)" if any(reference_answer(k) for k in origin.rollout_ids)
              else "")
        false = false_equation(example_parts(item.text)[1]) if item.kind == "example" else None
        table.add_row(item.id, item.kind, Text(item.text),
                      f"step {origin.step} {origin.op}{by} {', '.join(origin.problem_ids)}"
                      + (f"; its working is false: {false}" if false else ""))
    return table


def rendered_prompt(library: LibraryVersion) -> str:
    """What a request with no text of its own is sent (`library show --rendered`): the library's text, or, where
    the version shows worked examples as turns, each message before the request's, after its role."""
    if not library.policy.examples_as_turns:
        return render_library(library)
    sent = library_messages(library, [{"role": "user", "content": ""}])[0][:-1]  # the request's own message left out
    return "\n\n".join(f"[{m['role']}]\n{m['content']}" for m in sent)


def diff_text(diff: LibraryDiff) -> Group:
    lines = [Text(f"ops applied ({len(diff.ops)}):", style="bold")]
    lines += [Text(f"  {op}") for op in diff.ops]
    lines += [Text(f"+ [{i['id']}] {i['text']}", style="green") for i in diff.added]
    lines += [Text(f"- [{i['id']}] {i['text']}", style="red") for i in diff.removed]
    for old, new in diff.changed:
        lines += [Text(f"~ [{old['id']}] {old['text']}", style="red"), Text(f"~ [{new['id']}] {new['text']}", style="green")]
    return Group(*lines)


def progress_line(p: Progress) -> str:
    """One line of a run's counters. Skipped groups say why while the run goes (all wrong: none of the model's
    answers to keep or contrast), so a run with nothing to learn from shows it long before its end."""
    val = f" val {p.last_val:.3f}" if p.last_val is not None else ""
    why = [f"{n} {what}" for n, what in ((p.groups_all_wrong, "all wrong"), (p.groups_all_right, "all right")) if n]
    skipped = f"{p.groups_skipped} skipped" + (f" ({', '.join(why)})" if why else "")
    return (f"epoch {p.epoch} step {p.step}/{p.total_steps} | rollouts {p.rollouts} reward {p.mean_reward:.3f} | "
            f"groups {p.groups_used} used {skipped} | ops {p.ops_applied} applied "
            f"{p.ops_rejected} rejected | library {p.library_size} | tokens {p.tokens}{val}")
