"""The learning-effect benchmark's report: the archive of runs is the README's table, the plot draws every run."""

from __future__ import annotations

import importlib.util
import json
import platform
import re
import sys
from pathlib import Path

import pytest

from gym_tf.backends import embedded

ROOT = Path(__file__).resolve().parents[1]
ARCHIVE = ROOT / "benchmarks" / "results" / "learning_effect.json"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("learning_effect", ROOT / "benchmarks" / "learning_effect.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def report(bench):
    """The benchmark's results (its rows, table, archive, counts across families, plot), the module the script
    imports: loading the script put the repository on sys.path."""
    return sys.modules["benchmarks.effect_report"]


@pytest.fixture(scope="module")
def cli(bench):
    """The benchmark's command line and the settings its runs record, as the script imports them."""
    return sys.modules["benchmarks.effect_cli"]


def readme_table(readme: Path = ROOT / "README.md") -> list[str]:
    text = readme.read_text(encoding="utf-8")
    lines = text[text.index("<!-- learning-effect-table -->"):].splitlines()[1:]
    return lines[:next(i for i, line in enumerate(lines) if not line.startswith("|"))]


def test_the_archive_of_runs_is_the_readmes_table_on_clean_splits(report):
    rows = report.report_rows(json.loads(ARCHIVE.read_text(encoding="utf-8")))
    rendered = report.markdown(rows).splitlines()
    table = readme_table()
    assert rendered[:2] == table[:2]  # the same columns
    assert [line for line in rendered[2:] if line not in table] == []
    # and every measured run on clean splits is archived: a row not marked as overlapping, with a test split
    measured = [line for line in table[2:] if "overlapping splits" not in line and re.search(r"\| \d+ x \d+ \|", line)]
    assert sorted(measured) == sorted(rendered[2:])
    assert all(r["cpu"] for r in rows)


def test_across_families_takes_each_familys_latest_row_at_the_defaults_and_resamples_families(report):
    def run(family, diff, vote, model="0.5B", learner="0.5B", items=3, **settings):
        return {"family": family, "model": model, "learner": learner, "diff": diff, "majority_diff": vote,
                "items": items, "epochs": 2, "train": 16, "test": 24, "k": 4, "diff_full_credit": None,
                "diff_beyond_swapped": None} | settings

    rows = [run("a", (0.2, 0.1, 0.3), (0.2, 0.05, 0.35)),  # newest first: this row speaks for family a
            run("b", (0.1, 0.02, 0.2), (0.1, -0.05, 0.25)),
            run("c", (-0.1, -0.2, 0.0), (-0.1, -0.3, 0.1)),
            run("g", (0.0, 0.0, 0.0), (0.0, 0.0, 0.0), items=0),
            run("a", (-0.5, -0.6, -0.4), (-0.5, -0.6, -0.4)),  # an older row of a: not counted
            run("b", (0.9, 0.8, 1.0), (0.9, 0.8, 1.0), test=48),  # other settings: not counted
            run("c", (0.9, 0.8, 1.0), (0.9, 0.8, 1.0), epochs=1),
            run("c", (0.9, 0.8, 1.0), (0.9, 0.8, 1.0), k=8),
            run("c", (0.9, 0.8, 1.0), (0.9, 0.8, 1.0), epochs=None),  # an earlier method: counted nowhere
            run("d (another setting)", (0.9, 0.8, 1.0), (0.9, 0.8, 1.0)),
            run("e", (0.9, 0.8, 1.0), (0.9, 0.8, 1.0), model="1.5B", learner="1.5B"),
            run("f", (0.9, 0.8, 1.0), (0.9, 0.8, 1.0), learner="1.5B")]
    summary = report.across_families(rows)
    assert summary["families"] == 4
    assert (summary["both"], summary["gain"], summary["below"], summary["empty"]) == (["a"], ["a", "b"], ["c"], ["g"])
    assert summary["spread"] == (-0.1, 0.2)
    mean = summary["mean_diff"]
    assert mean.value == pytest.approx(0.05) and -0.1 - 1e-9 <= mean.low < mean.value < mean.high <= 0.2 + 1e-9
    assert summary["majority_diff"].value == pytest.approx(0.05)
    assert report.across_families(rows, policy="1.5B")["gain"] == ["e"]
    assert report.across_families(rows[5:]) is None
    text = report.across_text(summary)
    assert "4 families" in text and "1 kept no item; gains -0.100 to +0.200" in text
    assert summary["constant_families"] == [] and "no better than" not in report.across_text(summary)

    # a family that meets both conditions by answering its most common answer every time is named, and the mean
    # is also given without it; a row from before the constant was recorded is not suspected
    true_always = run("t", (0.6, 0.5, 0.7), (0.6, 0.5, 0.7), constant={"answer": "True", "mean": 0.7},
                      mean_minus_constant=(-0.01, -0.03, 0.0))
    beyond = run("u", (0.3, 0.2, 0.4), (0.3, 0.1, 0.5), constant={"answer": "4", "mean": 0.05},
                 mean_minus_constant=(0.2, 0.1, 0.3))
    summary = report.across_families([true_always, beyond, *rows])
    assert summary["both"] == ["a", "t", "u"] and summary["constant_families"] == ["t"]
    assert summary["mean_diff_without_constant"].value == pytest.approx((0.2 + 0.1 - 0.1 + 0.0 + 0.3) / 5)
    text = report.across_text(summary)
    assert "3 meet both conditions (t: no better than its most common answer given every time)" in text
    assert f"({summary['mean_diff_without_constant']} without t)" in text
    votes = [r["majority_diff"][0] for r in (beyond, *rows[:4])]  # a, b, c, g: the 0.5B rows at the defaults
    assert summary["majority_diff_without_constant"].value == pytest.approx(sum(votes) / len(votes))
    without = summary["majority_diff_without_constant"]
    assert f"the votes' mean {summary['majority_diff']} ({without} without them)" in text
    cell = report.constant_cell(true_always, lambda e: f"{e[0]:+.3f}")
    assert cell == "-0.010 ('True' always: 0.700)" and report.constant_cell(rows[0], None) == "not recorded"
    # where recorded, the gain on the problems the common answer gets wrong decides: a library below "0 always"
    # that gains where 0 is wrong taught more than 0; one above it that gains nothing there taught 0
    taught_more = run("v", (0.2, 0.1, 0.3), (0.2, 0.1, 0.3), constant={"answer": "0", "mean": 0.6},
                      mean_minus_constant=(0.0, -0.1, 0.1), diff_where_constant_wrong=(0.2, 0.05, 0.35))
    taught_zero = run("w", (0.3, 0.2, 0.4), (0.3, 0.1, 0.5), constant={"answer": "0", "mean": 0.3},
                      mean_minus_constant=(0.2, 0.1, 0.3), diff_where_constant_wrong=(0.0, -0.1, 0.1))
    assert report.across_families([taught_more, taught_zero])["constant_families"] == ["w"]
    cell = report.constant_cell(taught_more, lambda e: f"{e[0]:+.3f}")
    assert cell == "+0.000 ('0' always: 0.600; the gain where it is wrong: +0.200)"
    # and where some test problems state their own answer, the gain on the others (a converged sequence's last term)
    copied = taught_more | {"diff_where_unstated": (0.0, -0.05, 0.05)}
    assert report.constant_cell(copied, lambda e: f"{e[0]:+.3f}") == (
        "+0.000 ('0' always: 0.600; the gain where it is wrong: +0.200); "
        "the gain where the problem does not state its answer: +0.000")


def test_across_families_also_counts_every_run_at_the_defaults_and_each_familys_best(report):
    met, missed = ((0.2, 0.1, 0.3), (0.2, 0.1, 0.3)), ((0.1, 0.02, 0.2), (0.1, -0.05, 0.25))

    def run(family, diffs, **more):
        return {"family": family, "model": "0.5B", "learner": "0.5B", "diff": diffs[0], "majority_diff": diffs[1],
                "items": 3, "epochs": 2, "train": 16, "test": 24, "k": 4, "diff_full_credit": None,
                "diff_beyond_swapped": None} | more

    one_answer = {"constant": {"answer": "Yes", "mean": 0.9}, "mean_minus_constant": (-0.1, -0.2, 0.0),
                  "diff_where_constant_wrong": (0.0, -0.1, 0.1)}
    rows = [run("a", missed), run("a", met),  # newest first: a's latest missed the vote, an older run met both
            run("b", met, **one_answer), run("b", met, **one_answer),  # met both twice, by one answer each time
            run("c", missed), run("c", met, test=48)]  # off the defaults: counted nowhere
    summary = report.across_families(rows)
    assert summary["both"] == ["b"] and summary["constant_families"] == ["b"]
    assert summary["every_run"] == {"runs": 5, "both": 3, "beyond": 1}
    assert summary["best"] == {"both": ["a", "b"], "beyond": ["a"]}
    assert report.across_text(summary).rstrip().endswith(
        "Every row at the defaults, reruns included: 3 of 5 met both conditions, 1 beyond the most common answer, "
        "any answer stated in the problem, and, where checked, answers given to other problems and partial credit "
        "alone; by each family's best row, 2 of 3 families met both, 1 beyond them")
    # a gain all on test problems that state their own answer is a shortcut too: named apart, and not "beyond"
    copied = run("d", met, diff_where_unstated=(0.0, 0.0, 0.0))
    skilled = run("e", met, diff_where_unstated=(0.1, 0.02, 0.2))
    summary = report.across_families([copied, skilled, *rows])
    assert summary["stated_families"] == ["d"] and summary["constant_families"] == ["b"]
    assert summary["every_run"] == {"runs": 7, "both": 5, "beyond": 2}
    assert summary["best"]["beyond"] == ["a", "e"]
    others = [r["diff"][0] for r in (skilled, rows[0], rows[4])]  # e, a (latest), c: neither shortcut
    assert summary["mean_diff_without_constant"].value == pytest.approx(sum(others) / len(others))
    assert ("(b: no better than its most common answer given every time; d: no gain where the problem does not "
            "state its answer)") in report.across_text(summary)
    assert f"({summary['mean_diff_without_constant']} without b, d)" in report.across_text(summary)
    only_copied = report.across_families([copied, skilled])  # no constant-answer row: the mean without d alone
    assert only_copied["constant_families"] == [] and only_copied["mean_diff_without_constant"].value == pytest.approx(0.2)
    assert "(d: no gain where the problem does not state its answer)" in report.across_text(only_copied)
    # a gain in partial credit alone (tsumego's 0.05 for a legal move) is a shortcut too, where it was recorded
    legal_moves = run("f", met, diff_full_credit=(0.01, 0.0, 0.03))
    more_right = run("g", met, diff_full_credit=(0.1, 0.02, 0.2))
    # and so is a gain its answers earn as much of on other problems (a prior over answers)
    prior = run("h", met, diff_beyond_swapped=(0.02, -0.05, 0.09), diff_full_credit=(0.0, 0.0, 0.0))
    unchecked = {k: v for k, v in skilled.items() if k not in ("diff_full_credit", "diff_beyond_swapped")}
    summary = report.across_families([legal_moves, more_right, prior, copied, unchecked])
    assert summary["partial_families"] == ["f"] and summary["stated_families"] == ["d"]
    assert summary["swapped_families"] == ["h"]  # named once, by the first shortcut it meets
    assert summary["every_run"] == {"runs": 5, "both": 5, "beyond": 2} and summary["best"]["beyond"] == ["e", "g"]
    assert summary["mean_diff_without_constant"].value == pytest.approx(0.2)  # e and g
    text = report.across_text(summary)
    assert ("(d: no gain where the problem does not state its answer; h: no gain beyond its answers given to other "
            "problems; f: no more answers paid in full; 1 of the 2 others not checked against their answers given "
            "to other problems or for partial credit alone: run before 2026-12-07)") in text
    assert f"({summary['mean_diff_without_constant']} without d, h, f)" in text
    # a row that recorded no partial credit (None) was checked; one without the field ran before it was recorded
    assert summary["unchecked"] == ["e"] and report.across_families([more_right, skilled])["unchecked"] == []
    cell = report.markdown([report.row(comparison_with_partial_credit())]).splitlines()[2]
    assert ("| +0.047 [+0.036, +0.068]; beyond its answers given to other problems (0.058): +0.002 [-0.008, +0.013]; "
            "answers paid in full: +0.010 [+0.000, +0.031] |") in cell
    binary, before = comparison_with_partial_credit(), comparison_with_partial_credit()
    binary["arms"][1]["full_credit_vs_baseline"] = None  # a grader that paid 1 or 0: checked, nothing to flag
    for key in ("full_credit_vs_baseline", "swapped_mean", "mean_vs_baseline_beyond_swapped"):
        del before["arms"][1][key]  # a comparison written before the fields: not checked
    assert report.row(binary)["diff_full_credit"] is None and report.row(binary)["diff_beyond_swapped"]
    assert not {"diff_full_credit", "diff_beyond_swapped", "swapped_mean"} & set(report.row(before))
    unmeasured = comparison_with_partial_credit()  # a reward that failed on other problems: not checked either
    unmeasured["arms"][1] |= {"swapped_mean": None, "mean_vs_baseline_beyond_swapped": None}
    assert "diff_beyond_swapped" not in report.row(unmeasured)
    # an interval of equal sums can end 5e-18 above 0 (puzzle24's): that is 0, within noise
    assert report.no_gain_beyond_swapped({"diff_beyond_swapped": (2.1e-17, 4.6e-18, 3.7e-17)})


def comparison_with_partial_credit() -> dict:
    """A comparison as compare writes one (tsumego's numbers), whose grader paid partial credit; its CPU is the
    newest archived row's."""
    newest = json.loads(ARCHIVE.read_text(encoding="utf-8"))[0]
    est = lambda v: {"value": v[0], "low": v[1], "high": v[2]}  # noqa: E731
    arm = {"library_items": 3, "metrics": {"mean_at_k": {"value": 0.06}, "majority": {"value": 0.06}},
           "tokens": {"learning": 1000}, "name": "learned"}
    return {"family": "tsumego", "settings": {"seed": 1206}, "model": "0.5B", "problems": 24, "samples": 4,
            "library": [], "wall_s": 60.0, "extra_prompt_tokens_per_call": {"learned": 100},
            "arms": [{**arm, "name": "none"}, {**arm, "mean_vs_baseline": est((0.047, 0.036, 0.068)),
                                                "majority_vs_baseline": est((0.048, 0.037, 0.068)),
                                                "mean_vs_baseline_majority": est((0.047, 0.036, 0.068)),
                                                "full_credit_vs_baseline": est((0.010, 0.0, 0.031)),
                                                "swapped_mean": 0.058,
                                                "mean_vs_baseline_beyond_swapped": est((0.002, -0.008, 0.013))}],
            "cpu": newest["cpu"]}


def test_the_readme_states_what_the_archive_says_across_families(report):
    lines = report.across_lines(json.loads(ARCHIVE.read_text(encoding="utf-8")))
    assert None in lines and all(line in (ROOT / "README.md").read_text(encoding="utf-8") for line in lines.values())


def test_runs_at_other_training_sizes_or_epochs_are_counted_apart_on_a_line_of_their_own(report, tmp_path):
    """Each (training problems, epochs) run gets its own line, the defaults' first, counted by what its rows
    recorded; a row's label may name only those two settings to be counted on such a line."""
    met, missed = ((0.2, 0.1, 0.3), (0.2, 0.1, 0.3)), ((0.1, 0.02, 0.2), (0.1, -0.05, 0.25))

    def run(family, diffs, train=16, epochs=2, **more):  # a whole row, as the table prints it
        return json.loads(ARCHIVE.read_text(encoding="utf-8"))[0] | {
            "family": family, "model": "0.5B", "learner": "0.5B", "diff": diffs[0], "majority_diff": diffs[1],
            "items": 3, "epochs": epochs, "train": train, "test": 24, "k": 4, "constant": None,
            "diff_where_constant_wrong": None, "mean_minus_constant": None, "diff_where_unstated": None,
            "diff_full_credit": None, "diff_beyond_swapped": None} | more
        # whatever else the newest row has

    rows = [run("d (--epochs 1 --train 48)", met, 48, 1),
            run("a (--train 48)", met, 48), run("b (--train 48)", missed, 48), run("b (--train 48)", met, 48),
            run("c (--refuse-copied-examples --train 48)", met, 48),  # another setting too: counted nowhere
            run("c (--train 48 --val 8)", met, 48),
            run("a", missed), run("b", missed), run("c", met)]
    at_48 = report.across_families(rows, setting=(48, 2))
    assert (at_48["families"], at_48["both"], at_48["gain"]) == (2, ["a"], ["a", "b"])
    assert at_48["every_run"] == {"runs": 3, "both": 2, "beyond": 2} and at_48["best"]["both"] == ["a", "b"]
    at_16 = report.across_families(rows)
    assert (at_16["families"], at_16["both"]) == (3, ["c"]) and at_16["every_run"]["runs"] == 3
    one_epoch = report.across_families(rows, setting=(48, 1))
    assert (one_epoch["families"], one_epoch["both"]) == (1, ["d"])
    # a row archived before the size was recorded ran the default, or what its label says
    unrecorded = [{k: v for k, v in r.items() if k != "train"} for r in rows[1:]]
    assert [report.train_of(r) for r in unrecorded] == [48, 48, 48, 48, 48, 16, 16, 16]  # whatever else the label says
    assert report.across_families(unrecorded, setting=(48, 2)) == at_48 and report.across_families(unrecorded) == at_16
    lines = report.across_lines(rows)
    assert list(lines) == [None, (48, 2), (48, 1)]
    assert lines[None].startswith("Across 3 families, the latest 0.5B row of each at the defaults: 1 meet both")
    assert lines[(48, 2)].startswith("Across 2 families, the latest 0.5B row of each at the defaults but --train 48: "
                                     "1 meet both")
    assert "Every row at --train 48, reruns included: 2 of 3 met both" in lines[(48, 2)]
    assert "at the defaults but --train 48 --epochs 1: 1 meet both" in lines[(48, 1)]
    # with no row at the defaults, their line says so
    nothing_yet = "No family has run at the defaults (16 training problems, 2 epochs) yet."
    assert report.across_lines(rows[:1])[None] == nothing_yet

    # archiving the first run at another setting puts its line under the defaults' line, indented alike; the next
    # rewrites it in place
    archive, readme = tmp_path / "learning_effect.json", tmp_path / "README.md"
    at_defaults = rows[6:]
    archive.write_text(json.dumps(at_defaults), encoding="utf-8")
    table = report.TABLE_MARK + "\n" + report.markdown([]) + "\n"
    readme.write_text(f"# runs\n{table}\n  - across:\n  - {report.across_lines(at_defaults)[None]}\n  - next\n",
                      encoding="utf-8")  # the line as a bullet: the next goes under it, indented alike
    report.archive([run("b (--train 48)", met, 48, seed=1)], None, archive, readme)
    now = report.across_lines(json.loads(archive.read_text(encoding="utf-8")))
    assert readme.read_text(encoding="utf-8").endswith(f"  - across:\n  - {now[None]}\n  {now[(48, 2)]}\n  - next\n")
    assert now[None] == report.across_lines(at_defaults)[None] and "1 meet both" in now[(48, 2)]
    unrecorded = {k: v for k, v in run("a (--train 48)", missed, seed=2).items() if k != "train"}
    report.archive([unrecorded], None, archive, readme)  # a results.json from before the size was recorded
    assert json.loads(archive.read_text(encoding="utf-8"))[0]["train"] == 48
    later = report.across_lines(json.loads(archive.read_text(encoding="utf-8")))
    assert "Across 2 families" in later[(48, 2)] and later[(48, 2)] != now[(48, 2)]
    assert readme.read_text(encoding="utf-8").endswith(
        f"  - across:\n  - {later[None]}\n  {later[(48, 2)]}\n  - next\n")


def test_archiving_a_run_puts_it_first_in_the_archive_and_the_readmes_table_and_recounts_the_families(
        bench, report, tmp_path):
    archive, readme = tmp_path / "learning_effect.json", tmp_path / "README.md"
    archive.write_text(ARCHIVE.read_text(encoding="utf-8"), encoding="utf-8")
    readme.write_text((ROOT / "README.md").read_text(encoding="utf-8"), encoding="utf-8")
    before = report.across_families(json.loads(archive.read_text(encoding="utf-8")))
    stated = report.across_lines(json.loads(archive.read_text(encoding="utf-8")))[None]
    run = json.loads(ARCHIVE.read_text(encoding="utf-8"))[0] | {
        "family": "a_new_family", "seed": "99", "model": "qwen2.5-coder-0.5b-instruct-q4", "learner": "0.5B",
        "train": 16, "epochs": 2}  # the defaults
    after = report.archive([run], "shared with | a pip\ninstall", archive, readme)

    rows = json.loads(archive.read_text(encoding="utf-8"))
    assert rows[0] == run | {"model": "0.5B", "note": "shared with / a pip install"} and rows[1:] == json.loads(ARCHIVE.read_text(encoding="utf-8"))
    table = readme_table(readme)
    assert table[2] == report.markdown(rows[:1]).splitlines()[2] and table[2].endswith("shared with / a pip install |")
    assert table[:2] + table[3:] == readme_table()
    assert report.across_families(rows)["families"] == (before["families"] if before else 0) + 1
    text = readme.read_text(encoding="utf-8")
    assert all(line in text for line in after.splitlines()) and stated not in text
    # the same run again is refused, whatever its note; so is a README that no longer states the archive's count;
    # neither writes anything
    with pytest.raises(bench.ConfigError, match="already archived: a_new_family"):
        report.archive([run], "another note", archive, readme)
    readme.write_text((ROOT / "README.md").read_text(encoding="utf-8"), encoding="utf-8")
    with pytest.raises(bench.ConfigError, match="across-families line"):
        report.archive([run | {"seed": "100"}], None, archive, readme)
    assert json.loads(archive.read_text(encoding="utf-8")) == rows
    assert readme.read_text(encoding="utf-8") == (ROOT / "README.md").read_text(encoding="utf-8")


def test_a_run_recorded_before_the_archive_options_or_a_later_setting_existed_still_resumes(bench, cli):
    """--archive and --note say how the benchmark is invoked, not what a run is: a run's recorded settings never had
    them, and a resume must not read their absence as other settings."""
    now = cli.settings(cli.arguments().parse_args(["--families", "gcd"]))
    recorded = {k: v for k, v in now.items()
                if k not in ("archive", "note", "examples_per_answer", "refuse_copied_examples",
                             "refuse_answer_in_problem")}
    cli.same_settings(recorded, now, "level.json")
    # a setting added later reads, in a run recorded before it, as the value that run had
    capped = cli.settings(cli.arguments().parse_args(["--families", "gcd", "--examples-per-answer", "1"]))
    with pytest.raises(bench.ConfigError, match=r"other settings \(examples_per_answer\)"):
        cli.same_settings(recorded, capped, "level.json")
    refusing = cli.settings(cli.arguments().parse_args(["--families", "gcd", "--refuse-copied-examples"]))
    with pytest.raises(bench.ConfigError, match=r"other settings \(refuse_copied_examples\)"):
        cli.same_settings(recorded, refusing, "level.json")
    refusing = cli.settings(cli.arguments().parse_args(["--families", "gcd", "--refuse-answer-in-problem"]))
    with pytest.raises(bench.ConfigError, match=r"other settings \(refuse_answer_in_problem\)"):
        cli.same_settings(recorded, refusing, "level.json")
    assert cli.changed_settings(refusing) == "--refuse-answer-in-problem"
    with pytest.raises(bench.ConfigError, match=r"other settings \(seed\)"):
        cli.same_settings(recorded | {"seed": "7"}, now, "level.json")
    # a setting since removed resumes a run recorded at the value runs without it have, and refuses one that used it
    cli.same_settings(now | {"test_vary": "False", "vary_examples": "False"}, now, "level.json")
    with pytest.raises(bench.ConfigError, match=r"other settings \(vary_examples\)"):
        cli.same_settings(now | {"test_vary": "False", "vary_examples": "True"}, now, "level.json")


@pytest.mark.parametrize("name, size", [("qwen2.5-coder-0.5b-instruct-q4", "0.5B"),
                                        ("/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "1.5B"),
                                        ("/models/7b/qwen2.5-coder-0.5b.gguf", "0.5B"),
                                        ("mixtral-8x7b", "mixtral-8x7b"), ("gpt-4o", "gpt-4o")])
def test_the_archive_names_a_model_by_its_size_where_its_name_gives_one(report, name, size):
    assert report.model_size(name) == size


def test_the_plot_draws_every_run_once_and_stars_the_runs_of_an_earlier_rule_or_another_setting(report, tmp_path):
    rows = json.loads(ARCHIVE.read_text(encoding="utf-8"))
    labels = report.forest(rows, tmp_path / "effect.png")
    assert (tmp_path / "effect.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(labels) == len(rows)
    assert [label for label in labels if label.endswith(" *")] == [
        "pool_matrix 76, 0.5B, 2 epochs, no library 0.00 *",  # --python-tool; both options off (its probe under 0.05)
        "rubiks_cube 76, 0.5B, 2 epochs, no library 0.01 *",  # the same
        "cryptarithm 76, 0.5B, 2 epochs, no library 0.00 *",  # the same
        "binary_alternation 76, 0.5B, 2 epochs, no library 0.10 *",  # --python-tool
        "number_sorting 76, 0.5B, 2 epochs, no library 0.03 *",  # the same
        "emoji_mystery 76, 0.5B, 2 epochs, no library 0.01 *",  # the same
        "sudoku 76, 0.5B, 2 epochs, no library 0.00 *",  # the same
        "advanced_geometry 76, 0.5B, 2 epochs, no library 0.01 *",  # the same
        "palindrome_generation 76, 0.5B, 2 epochs, no library 0.04 *",  # the same
        "binary_matrix 76, 0.5B, 2 epochs, no library 0.00 *",  # the same
        "largest_island 76, 0.5B, 2 epochs, no library 0.00 *",  # the same
        "figlet_font 76, 0.5B, 2 epochs, no library 0.02 *",  # the same
        "codeio 76, 0.5B, 2 epochs, no library 0.00 *",  # the same
        "count_bits 76, 0.5B, 2 epochs, no library 0.36 *",  # --python-tool
        "binary_matrix 76, 0.5B, 2 epochs, no library 0.00 *",  # --hinted-examples auto; both options off
        "largest_island 76, 0.5B, 2 epochs, no library 0.00 *",  # the same
        "number_sorting 80, 0.5B, 2 epochs, no library 0.00 *",  # the same
        "number_sorting 79, 0.5B, 2 epochs, no library 0.00 *",  # --hinted-examples 2
        "count_bits 78, 0.5B, 2 epochs, no library 0.14 *",  # the same
        "number_sorting 77, 0.5B, 2 epochs, no library 0.00 *",  # --examples-as-turns off --labeled-examples off (auto since)
        "figlet_font 76, 0.5B, 2 epochs, no library 0.01 *",  # the same
        "codeio 76, 0.5B, 2 epochs, no library 0.00 *",  # the same
        "bitwise_arithmetic 75, 0.5B, 2 epochs, no library 0.00 *",  # the same
        "decimal_arithmetic 75, 0.5B, 2 epochs, no library 0.07 *",  # the same
        "time_intervals 75, 0.5B, 2 epochs, no library 0.15 *",  # graded at the defaults' settings (d60d27f)
        "basic_arithmetic 74, 0.5B, 2 epochs, 48 problems, no library 0.53 *",  # --train 48
        "fraction_simplification 74, 0.5B, 2 epochs, 48 problems, no library 0.14 *",  # the same
        "fraction_simplification 73, 0.5B, 48 problems, no library 0.06 *",  # --epochs 1 --train 48
        "simple_equations 73, 0.5B, 48 problems, no library 0.17 *",  # the same
        "time_intervals 72, 0.5B, 2 epochs, 48 problems, no library 0.23 *",  # --train 48
        "products 72, 0.5B, 2 epochs, 48 problems, no library 0.44 *",  # the same
        "decimal_chain_sum 70, 0.5B, 2 epochs, 48 problems, no library 0.25 *",  # the same
        "products 70, 0.5B, 2 epochs, 48 problems, no library 0.81 *",  # the same
        "decimal_arithmetic 68, 0.5B, 2 epochs, 48 problems, no library 0.06 *",  # the same
        "letter_counting 68, 0.5B, 2 epochs, 48 problems, no library 0.18 *",  # the same
        "spell_backward 67, 0.5B, 2 epochs, 48 problems, no library 0.19 *",  # the same
        "aiw 66, 0.5B, 2 epochs, 48 problems, no library 0.09 *",  # the same
        "spell_backward 66, 0.5B, 2 epochs, 48 problems, no library 0.21 *",  # the same
        "products 46, 0.5B, 2 epochs, no library 0.34 *",  # --refuse-answer-in-problem
        "number_sequence 45, 0.5B, 2 epochs, no library 0.10 *",  # --refuse-answer-in-problem; both options off
        "spell_backward 62, 0.5B, 2 epochs, no library 0.21 *",  # --refuse-answer-in-problem
        "color_cube_rotation 53, 0.5B, 2 epochs, no library 0.03 *",  # --refuse-copied-examples
        "polynomial_equations 51, 0.5B, 2 epochs, no library 0.37 *",  # --examples-per-answer 1
        "bitwise_arithmetic 50, 0.5B, 2 epochs, no library 0.00 *",  # --examples-as-turns off --labeled-examples off
        "calendar_arithmetic 49, 0.5B, 2 epochs, no library 0.18 *",  # the same
        "decimal_arithmetic 48, 0.5B, 2 epochs, no library 0.06 *",  # the same
        "isomorphic_strings 45, 0.5B, 2 epochs, no library 0.03 *",  # the same
        "decimal_chain_sum 9, 0.5B, 2 epochs, no library 0.24 *",  # an earlier rule
        "lcm 12, 0.5B, 2 epochs, no library 0.01 *",  # --examples-as-turns off --labeled-examples off
        "time_intervals 31, 0.5B, 2 epochs, no library 0.49 *",  # graded at the defaults' settings (d60d27f)
        "spell_backward 9, 0.5B, 2 epochs, no library 0.22 *",  # the same
        "gcd 7, 0.5B, 2 epochs, no library 0.10 *",  # the same
        "prime_factorization 41, 0.5B, 2 epochs, no library 0.00 *",  # the same
        "decimal_arithmetic 31, 0.5B, 2 epochs, no library 0.05 *",  # the same
        "coin_flip 5, 0.5B, 2 epochs, no library 0.03 *",  # the same
        "fraction_simplification 11, 0.5B, no library 0.10 *",  # an earlier rule
        "letter_counting 5, 0.5B, no library 0.17 *",  # an earlier rule
        "coin_flip 5, 0.5B, no library 0.00 *",  # --examples-as-turns off --labeled-examples off
        "coin_flip 5, 0.5B, no library 0.03 *",  # the same
        "decimal_arithmetic 31, 0.5B (learner 1.5B), no library 0.04 *",  # graded at the defaults' settings (d60d27f)
        "gcd 7, 0.5B, no library 0.08 *",  # --examples-as-turns off --labeled-examples off
        "decimal_arithmetic 31, 1.5B, no library 0.18 *",  # graded at the defaults' settings (d60d27f)
        "prime_factorization 41, 0.5B, no library 0.00 *",  # --examples-as-turns off --labeled-examples off
        "time_intervals 31, 0.5B, no library 0.46 *",  # graded at the defaults' settings (d60d27f)
        "decimal_arithmetic 31, 0.5B, no library 0.05 *",  # the same
        "basic_arithmetic 13, 0.5B, no library 0.68 *",  # an earlier rule
        "decimal_chain_sum 11, 0.5B, no library 0.25 *"]  # an earlier rule
    assert {"simple_equations 21, 0.5B, 2 epochs, no library 0.15", "simple_equations 21, 0.5B, no library 0.15",
            "fraction_simplification 11, 0.5B, 2 epochs, no library 0.10",
            "letter_counting 5, 0.5B, 2 epochs, no library 0.19"} < set(labels)
    assert "docs/learning-effect.png" in (ROOT / "README.md").read_text(encoding="utf-8")
    assert (ROOT / "docs" / "learning-effect.png").is_file()


def test_a_rows_wall_time_names_its_cpu_and_an_empty_library_has_nothing_to_prune(report):
    [row] = [r for r in json.loads(ARCHIVE.read_text(encoding="utf-8"))
             if r["family"].startswith("time_intervals (graded") and r.get("epochs") is None]
    assert report.wall(row) == "36 min, AMD EPYC (AVX2), shared with an install and short runs"
    assert report.wall({**row, "cpu": None, "note": None}) == "36 min"
    assert (report.wall({**row, "epochs": 2})
            == "36 min, AMD EPYC (AVX2), 2 epochs, shared with an install and short runs")
    cut = {**row, "epochs": 2, "learn_minutes": 30.0, "note": None}
    assert (report.wall({**cut, "learning_steps": {"run": 9, "planned": 12}})
            == "36 min, AMD EPYC (AVX2), 2 epochs, learning cut by its 30-min limit after 9 of 12 steps")
    assert report.wall({**cut, "learning_steps": {"run": 12, "planned": 12}}) == "36 min, AMD EPYC (AVX2), 2 epochs"
    assert report.pruned({**row, "prune": None, "items": 0}) == "nothing to prune"
    assert report.pruned({**row, "prune": None}) == "not run"
    assert report.pruned(row) == "0 of 4"
    dropped = {"items": 6, "dropped": 2, "status": "promoted"}
    assert report.pruned({**row, "prune": dropped}) == "2 of 6, not tested"  # without --test-unpruned
    assert (report.pruned({**row, "prune": {**dropped, "test_effect": {"value": -0.034, "low": -0.092, "high": 0.022}}})
            == "2 of 6, -0.034 [-0.092, +0.022]")
    assert report.pruned({**row, "prune": {**dropped, "status": "rejected"}}) == "2 of 6 (gate refused)"


def test_the_items_cell_says_how_many_test_answers_copied_a_worked_example(report):
    [row] = [r for r in json.loads(ARCHIVE.read_text(encoding="utf-8"))
             if r["family"].startswith("time_intervals (graded") and r.get("epochs") is None]
    assert "copies" not in row and report.same(row) == ""  # recorded since 2026-11-28
    copied = {"copied": 61, "of": 96, "share": 61 / 96, "mean_reward": 0.148}
    assert report.same({**row, "copies": copied}) == "; 64% of its test answers copy an example (61 of 96, right 0.15)"
    assert report.same({**row, "copies": {**copied, "copied": 0, "share": 0.0, "mean_reward": None}}) == (
        "; 0% of its test answers copy an example (0 of 96)")
    assert report.same({**row, "copies": copied, "same_as": "none"}) == ", the none version: sampled once"
    assert (f"| {row['items']} ({row['lessons']}); 64% of its test answers copy"
            in report.markdown([{**row, "copies": copied}]))


@pytest.mark.parametrize("name, flags, label", [
    ("Intel(R) Xeon(R) Platinum 8480+ CPU @ 2.00GHz", ["avx2", "avx512f", "amx_tile"],
     "Intel Xeon Platinum 8480+ (AVX-512, AMX)"),
    ("Intel(R) Xeon(R) Processor", ["avx2", "avx512f"], "Intel Xeon (AVX-512)"),
    ("AMD EPYC 7B13", ["avx2", "fma"], "AMD EPYC 7B13 (AVX2)"),
    ("Intel(R) Core(TM) i5-8250U CPU @ 1.60GHz", ["avx2"], "Intel Core i5-8250U (AVX2)"),
    ("?", [], "?"),
])
def test_the_cpu_label_names_the_vector_units_the_engine_speed_depends_on(monkeypatch, name, flags, label):
    monkeypatch.setattr(embedded, "cpu_info", lambda: (name, flags))
    assert embedded.cpu_label() == label


@pytest.mark.skipif(platform.machine() != "x86_64" or not Path("/proc/cpuinfo").exists(), reason="not Linux on x86-64")
def test_this_machines_cpu_info_is_read_from_linux():
    name, flags = embedded.cpu_info()
    assert name != "?" and "sse2" in flags


def test_the_level_column_shows_the_probes_and_the_levels_passed_over(cli, report):
    aim = {"target": 0.3, "ceiling": 0.45, "problems": 16, "max_probes": 6}
    probed = {"level": 2, "probes": {"rates": {"0": 0.84, "1": 0.5, "2": 0.31}, "aim": aim, "tokens": 18201}}
    assert report.level_text(probed) == "2 (probe 0.84/0.50/0.31, aim 0.30; 18,201 tok)"
    skipped = {"level": 2, "probes": {"rates": {"2": 0.25}, "aim": aim, "tokens": 5000, "too_few": [0, 1]}}
    assert report.level_text(skipped) == "2 (levels 0-1: too few problems; probe level 2 0.25, aim 0.30; 5,000 tok)"
    skipped["probes"]["too_few"] = [3]
    assert report.level_text(skipped).startswith("2 (level 3: too few problems; probe level 2 0.25")
    below = {"level": -1, "probes": {"rates": {"0": 0.0, "-1": 0.06}, "aim": {**aim, "floor": 0.05}, "tokens": 9000}}
    assert report.level_text(below) == "-1 (probe level 0 0.00, level -1 0.06, aim 0.30; 9,000 tok)"
    assert report.level_span([0, 1, 2, 3, 4]) == "levels 0-4" and report.level_span([0, 2]) == "levels 0, 2"
    assert cli.arguments().parse_args(["--level", "-2"]).level == "-2"
    with pytest.raises(SystemExit):
        cli.arguments().parse_args(["--level", "-3"])
    assert report.level_text({"level": 1}) == "1" and report.level_text({}) == "default"


def test_the_screen_probes_each_familys_easiest_level_that_fills_the_splits(bench, cli, tmp_path, monkeypatch):
    """`--screen`: solved, mean reward and cut-off share per family, from the model's own answers, no library;
    coin_flip's levels 0-4 make too few distinct problems for the splits, so its screen starts at level 5."""
    import argparse
    import asyncio

    from fakes import ScriptedBackend
    from gym_tf import task_levels

    args = argparse.Namespace(base_url=None, model=None, model_file=None, api_key=None, max_completion_tokens=256, python_tool=False,
                              seed=3, train=16, val=6, test=24, level_aim="band")
    seed = bench.SPLIT_SEED * args.seed + bench.SCREEN_OFFSET
    gold = {r["problem"]: r["answer"] for family, level in (("leg_counting", 0), ("coin_flip", 5))
            for r in task_levels.rows(family, cli.SCREEN_PROBLEMS, seed, level)}
    backends = iter([ScriptedBackend(gold, skill=1.0)])

    async def fake_backend(config):
        assert config.base_url is None and config.model_file is None  # the embedded default, as a run would use
        return next(backends)

    monkeypatch.setattr(bench, "make_backend", fake_backend)
    found = asyncio.run(bench.screen(["leg_counting", "no_such_family", "coin_flip"], args, tmp_path))
    assert found[1]["family"] == "no_such_family" and "could not make no_such_family" in found[1]["error"]
    found = [found[0], found[2]]  # one family reasoning-gym cannot make is reported, and the screen goes on
    assert [(f["family"], f["level"], f["answers"]) for f in found] == [("leg_counting", 0, 16), ("coin_flip", 5, 16)]
    assert found[0]["solved"] == found[0]["mean_reward"] == 1.0 and found[0]["cut"] == 0.0
    assert [f for f in json.loads((tmp_path / "screen.json").read_text()) if "error" not in f] == found


def test_a_row_records_the_epochs_its_run_learned_for(report):
    """The benchmark's default moved from 1 epoch to 2: a row says which it ran, from the settings in its
    comparison.json (a run recorded before the setting existed ran 1)."""
    metric = {"value": 0.25, "low": 0.1, "high": 0.4}
    arm = lambda name, items: {"name": name, "library_items": items, "tokens": {"learning": 100},  # noqa: E731
                               "metrics": {"mean_at_k": metric, "majority": metric}, "mean_vs_baseline": metric,
                               "majority_vs_baseline": metric, "mean_vs_baseline_majority": metric}
    comparison = {"family": "chain_sum", "settings": {"seed": "3", "epochs": "2"}, "model": "m", "problems": 24,
                  "samples": 4, "arms": [arm("none", 0), arm("learned", 1)], "library": [{"kind": "example"}],
                  "extra_prompt_tokens_per_call": {"learned": 40}, "wall_s": 600, "cpu": "AMD EPYC (AVX2)"}
    row = report.row(comparison)
    assert (row["epochs"], row["items"], row["lessons"]) == (2, 1, 0)
    assert report.row({**comparison, "settings": {"seed": "3"}})["epochs"] == 1
    # an extra test arm's item count is kept beside its comparison (the report leaves out an arm that held none)
    assert row["arm_items"] is None
    cut = {**comparison, "arms": [*comparison["arms"], arm("learned, first 16 problems", 0)]}
    assert report.row(cut)["arm_items"] == {"learned, first 16 problems": 0}


def test_a_run_off_the_methods_defaults_names_them_and_stays_out_of_the_count(cli, report):
    """An A/B arm such as `--refuse-copied-examples` is archived beside the family's runs at the defaults; its row
    says what it changed, read from its recorded settings, and the count across families passes over it. What a run
    is on (seed, level, engine) changes nothing; a setting added after a run was recorded reads as that run had it."""
    metric = {"value": 0.25, "low": 0.1, "high": 0.4}
    arm = lambda name: {"name": name, "library_items": 1, "tokens": {"learning": 100},  # noqa: E731
                        "metrics": {"mean_at_k": metric, "majority": metric}, "mean_vs_baseline": metric,
                        "majority_vs_baseline": metric, "mean_vs_baseline_majority": metric}
    at_defaults = cli.settings(cli.arguments().parse_args(["--seed", "53", "--level", "0", "--model", "m"]))
    comparison = {"family": "color_cube_rotation", "settings": at_defaults, "model": "0.5B", "problems": 24,
                  "samples": 4, "arms": [arm("none"), arm("learned")], "library": [{"kind": "example"}],
                  "extra_prompt_tokens_per_call": {"learned": 40}, "wall_s": 600, "cpu": "AMD EPYC (AVX2)"}
    plain = report.row(comparison)
    assert plain["family"] == "color_cube_rotation"
    recorded_before = {k: v for k, v in at_defaults.items() if k not in cli.LATER_SETTINGS}
    assert report.row({**comparison, "settings": recorded_before})["family"] == "color_cube_rotation"
    changed = {**at_defaults, "refuse_copied_examples": "True", "examples_per_answer": "1", "prune": "False",
               "k": "8"}
    arm_b = report.row({**comparison, "settings": changed})
    assert arm_b["family"] == "color_cube_rotation (--examples-per-answer 1 -k 8 --no-prune --refuse-copied-examples)"
    summary = report.across_families([arm_b, {**plain, "diff": (0.0, 0.0, 0.0), "items": 0}])
    assert summary["families"] == 1 and summary["empty"] == ["color_cube_rotation"]
    assert report.across_families([arm_b]) is None
    larger = report.row({**comparison, "settings": {**at_defaults, "train": "48"}})
    assert (plain["train"], larger["train"], larger["family"]) == (16, 48, "color_cube_rotation (--train 48)")
    assert report.across_families([larger, arm_b], setting=(48, 2))["families"] == 1
    assert report.across_families([larger]) is None
    # the learning time limit caps the machine's time, not the method: a row without one, or with another, is
    # counted with the others (where the limit cut learning short, its wall cell says so)
    for minutes in ("None", "45.0"):
        assert report.row({**comparison, "settings": {**at_defaults, "learn_minutes": minutes}})["family"] == (
            "color_cube_rotation")


def test_archive_takes_a_familys_comparison_json_and_makes_its_row_under_todays_defaults(
        bench, cli, report, tmp_path, monkeypatch):
    """A run's results.json holds its row as the code of its day labelled it; its comparison.json keeps the
    settings, so `--archive` on it makes the row again under today's defaults, label and count."""
    metric = {"value": 0.25, "low": 0.1, "high": 0.4}
    arm = lambda name: {"name": name, "library_items": 1, "tokens": {"learning": 100},  # noqa: E731
                        "metrics": {"mean_at_k": metric, "majority": metric}, "mean_vs_baseline": metric,
                        "majority_vs_baseline": metric, "mean_vs_baseline_majority": metric}
    recorded = cli.settings(cli.arguments().parse_args(["--seed", "73", "--train", "48", "--epochs", "1"]))
    comparison = {"family": "simple_equations", "settings": recorded, "model": "0.5B", "problems": 24, "samples": 4,
                  "arms": [arm("none"), arm("learned")], "library": [{"kind": "example"}],
                  "extra_prompt_tokens_per_call": {"learned": 40}, "wall_s": 600, "cpu": "AMD EPYC (AVX2)"}
    path = tmp_path / "comparison.json"
    path.write_text(json.dumps(comparison), encoding="utf-8")
    archived = []
    monkeypatch.setattr(bench, "archive", lambda runs, note: archived.append((runs, note)) or "")
    monkeypatch.setattr(sys, "argv", ["learning_effect.py", "--archive", str(path), "--note", "alone"])
    bench.main()
    [(runs, note)] = archived
    assert runs == [report.row(comparison)] and note == "alone"
    assert [r["family"] for r in runs] == ["simple_equations (--epochs 1 --train 48)"]
    assert report.across_families(runs, setting=(48, 1))["families"] == 1 and report.across_families(runs) is None


def test_the_unpruned_library_is_tested_only_when_asked_and_only_where_pruning_dropped_items(bench, tmp_path):
    from gym_tf.library import LibraryVersion
    from gym_tf.store import RunStore

    store = RunStore(tmp_path / "ws")
    before, after = LibraryVersion(next_number=7), LibraryVersion(next_number=5, step=5)
    store.put_version(before, "run", "promoted")
    dropped = {"version_before": before.id, "version_after": after.id}
    names = lambda arms: [(name, version.id, tokens) for name, version, tokens in arms]  # noqa: E731
    both = [("none", store.version("empty").id, 0), ("learned", after.id, 900)]
    assert names(bench.compared_arms(store, after, 900, dropped, with_unpruned=False)) == both
    assert (names(bench.compared_arms(store, after, 900, dropped, with_unpruned=True))
            == both + [("unpruned", before.id, 900)])
    kept_all = {"version_before": after.id, "version_after": after.id}
    assert names(bench.compared_arms(store, after, 900, kept_all, with_unpruned=True)) == both
    assert names(bench.compared_arms(store, after, 900, None, with_unpruned=True)) == both


def test_the_learned_library_shown_more_examples_is_one_more_arm_with_its_budget_scaled(bench, cli, tmp_path):
    from gym_tf.library import Experience, LibraryVersion, Provenance, RenderPolicy, select_items
    from gym_tf.store import RunStore

    store = RunStore(tmp_path / "ws")
    solution = "Each cat has 4 legs.\n" + "Count them one by one, then add. " * 12 + "\\boxed{12}"
    examples = tuple(Experience(id=f"E{n}", kind="example", provenance=Provenance(step=1, op="add"),
                                text=f"Problem: How many legs do {n} cats have?\nSolution: {solution}")
                     for n in range(1, 6))
    learned = LibraryVersion(items=examples, next_number=6, policy=RenderPolicy(max_tokens=300, examples=2))
    arms = bench.compared_arms(store, learned, 900, None, with_unpruned=False, examples=4)
    assert [name for name, _, _ in arms] == ["none", "learned", "learned, 4 examples"]
    shown = arms[2][1]
    assert shown.items == learned.items and shown.id != learned.id
    assert (shown.policy.examples, shown.policy.max_tokens) == (4, 600)
    query = "How many legs do 3 cats have?"
    assert len(select_items(learned, query)) == 2 and len(select_items(shown, query)) == 4
    assert arms[2][2] == 900
    # a count that shows what the learned library already shows adds nothing: that arm would be its prompts again
    assert len(bench.compared_arms(store, learned, 900, None, with_unpruned=False, examples=2)) == 2
    two = LibraryVersion(items=examples[:2], next_number=3, policy=learned.policy)
    assert len(bench.compared_arms(store, two, 900, None, with_unpruned=False, examples=4)) == 2
    with pytest.raises(SystemExit):
        cli.arguments().parse_args(["--test-examples", "-1"])


def test_the_library_from_the_first_training_problems_keeps_only_what_they_taught(bench, cli, tmp_path):
    from gym_tf.library import Experience, LibraryVersion, Provenance, RenderPolicy
    from gym_tf.store import RunStore

    def item(n, problems, kind="example"):
        return Experience(id=f"E{n}", kind=kind, text=f"item {n}",
                          provenance=Provenance(step=1, op="add", problem_ids=problems))

    learned = LibraryVersion(items=(item(1, ("p1",)), item(2, ("p5",)), item(3, ("p1", "p5"), "lesson"),
                                    item(4, ("p2",), "lesson"), item(5, ())),
                             next_number=6, policy=RenderPolicy(max_tokens=300, examples=2))
    cut = bench.learned_from(learned, ["p1", "p2", "p3"])
    # E2 and E3 learned from p5 too, E5 from no recorded problem: neither is known to come from the first three
    assert [i.id for i in cut.items] == ["E1", "E4"] and cut.policy == learned.policy and cut.id != learned.id
    assert bench.learned_from(learned, []).items == ()
    # one more test arm where the cut keeps some items; keeping all or none, its prompts are another arm's
    store = RunStore(tmp_path / "ws")
    names = lambda library, first: [n for n, _, _ in bench.compared_arms(store, library, 900, None, False, None,  # noqa: E731
                                                                        first)]
    assert names(learned, ["p1", "p2", "p3"]) == ["none", "learned", "learned, first 3 problems"]
    recorded = LibraryVersion(items=learned.items[:4], next_number=5, policy=learned.policy)  # each names its problems
    assert names(recorded, ["p1", "p2", "p5"]) == names(learned, ["p9"]) == names(learned, None) == ["none", "learned"]
    with_arm = cli.settings(cli.arguments().parse_args(["--test-first", "16", "--train", "48"]))
    assert cli.changed_settings(with_arm) == "--train 48"


def test_the_library_held_after_each_earlier_epoch_is_one_more_arm_where_it_differs(bench, cli, tmp_path):
    from types import SimpleNamespace

    from gym_tf.library import Experience, LibraryVersion, Provenance
    from gym_tf.store import RunStore

    # two epochs of two steps, then the prune step (no batch): epoch 1 ends at step 2's version, before the prune
    steps = [{"step": 1, "epoch": 0, "batch": 0, "version_after": "v1"},
             {"step": 2, "epoch": 0, "batch": 1, "version_after": "v2"},
             {"step": 3, "epoch": 1, "batch": 0, "version_after": "v3"},
             {"step": 4, "epoch": 1, "batch": 1, "version_after": "v4"},
             {"step": 5, "epoch": 1, "batch": -1, "version_after": "v5"}]
    ran = lambda rows: SimpleNamespace(steps=lambda run_id: rows)  # noqa: E731
    assert bench.epoch_ends(ran(steps), "r") == {1: "v2"}
    assert bench.epoch_ends(ran(steps[:2] + steps[4:]), "r") == {}  # one epoch: no earlier one
    assert bench.epoch_ends(ran([]), "r") == {}

    store = RunStore(tmp_path / "ws")
    item = lambda n: Experience(id=f"E{n}", kind="example", text=f"item {n}",  # noqa: E731
                                provenance=Provenance(step=n, op="add", problem_ids=(f"p{n}",)))
    after_first = LibraryVersion(items=(item(1),), next_number=2)
    learned = LibraryVersion(items=(item(1), item(2)), next_number=3)
    for version in (after_first, learned):
        store.put_version(version, "r", "promoted")

    def arms(ends):
        return [(n, v.id) for n, v, _ in bench.compared_arms(store, learned, 900, None, False, None, None, ends)]
    empty = store.version("empty").id
    assert arms({1: after_first.id}) == [("none", empty), ("learned", learned.id),
                                         ("learned, after epoch 1", after_first.id)]
    # an epoch that ended on the learned library, or on an empty one, is another arm's prompts: no arm
    assert arms({1: learned.id}) == arms({1: empty}) == arms(None) == [("none", empty), ("learned", learned.id)]
    with_arm = cli.settings(cli.arguments().parse_args(["--test-epochs", "--epochs", "3"]))
    assert cli.changed_settings(with_arm) == "--epochs 3"


def test_each_extra_arm_is_set_against_the_learned_one_and_keeps_its_row_at_the_defaults(bench, cli):
    from types import SimpleNamespace

    report = lambda means, votes: SimpleNamespace(per_problem_mean=lambda: means,  # noqa: E731
                                                  per_problem_majority=lambda: votes)
    arms = [SimpleNamespace(name="none", report=report([0.0, 0.0], [0.0, 0.0])),
            SimpleNamespace(name="learned", report=report([0.5, 0.25], [1.0, 0.0])),
            SimpleNamespace(name="learned, 4 examples", report=report([0.25, 0.25], [0.0, 0.0]))]
    found = bench.against_learned(SimpleNamespace(arms=arms, seed=3))
    assert list(found) == ["learned, 4 examples"]
    assert found["learned, 4 examples"]["mean"]["value"] == pytest.approx(-0.125)
    assert found["learned, 4 examples"]["majority"]["value"] == pytest.approx(-0.5)
    assert bench.against_learned(SimpleNamespace(arms=arms[:2], seed=3)) == {}
    # the prune step's test effect (pruned minus unpruned) is the unpruned arm's difference turned round
    from gym_tf.metrics import paired_difference

    unpruned = SimpleNamespace(name="unpruned", report=report([0.75, 0.0], [1.0, 0.0]))
    against = bench.against_learned(SimpleNamespace(arms=[*arms[:2], unpruned], seed=3))
    step = {"stats": {"ablation": [{"keep": True}, {"keep": False}]}, "status": "promoted"}
    effect = bench.prune_effect(step, against)
    direct = paired_difference([0.5, 0.25], [0.75, 0.0], seed=3)
    assert effect["test_effect"] == pytest.approx({"value": direct.value, "low": direct.low, "high": direct.high})
    assert (effect["items"], effect["dropped"]) == (2, 1) and "test_effect" not in bench.prune_effect(step, found)
    with_arms = cli.settings(cli.arguments().parse_args(["--test-examples", "4", "--test-unpruned"]))
    assert cli.changed_settings(with_arms) == ""
    assert cli.changed_settings({**with_arms, "examples": "4"}) == "--examples 4"


def test_the_report_sets_the_library_against_each_extra_arm_in_the_librarys_favour(bench, report):
    """The archive keeps each extra arm minus the library; the report turns it round (a positive figure is the
    library's), and leaves out an arm that held no item (the empty library sampled twice)."""
    from types import SimpleNamespace

    scored = lambda means, votes: SimpleNamespace(per_problem_mean=lambda: means,  # noqa: E731
                                                  per_problem_majority=lambda: votes)
    arms = [SimpleNamespace(name="none", report=scored([0.0, 0.0], [0.0, 0.0])),
            SimpleNamespace(name="learned", report=scored([0.5, 0.25], [1.0, 0.0])),
            SimpleNamespace(name="learned, first 16 problems", report=scored([0.25, 0.25], [0.0, 0.0]))]
    kept = bench.against_learned(SimpleNamespace(arms=arms, seed=3))["learned, first 16 problems"]
    row = {"family": "aiw (--train 48)", "seed": "66", "against_learned": {"learned, first 16 problems": kept},
           "arm_items": {"learned, first 16 problems": 4}}
    empty = {**row, "seed": "67", "arm_items": {"learned, first 16 problems": 0}}
    older = {key: value for key, value in row.items() if key != "arm_items"}  # archived before the count
    lines = report.against_arms_lines([row, empty, older, {"family": "gcd", "seed": "1", "against_learned": None}])
    assert len(lines) == 2 and lines[0] == lines[1]
    # the arm's bounds -0.25 and 0 (of 2 problems, the library up 0.25 on one), turned round: 0 prints +0.000
    assert (kept["mean"]["low"], kept["mean"]["high"]) == (-0.25, 0.0)
    assert lines[0] == ("aiw (--train 48) 66: the library against `learned, first 16 problems`: "
                        "+0.125 [+0.000, +0.250], vote +0.500 [+0.000, +1.000]")


class CrashingBackend:
    """The scripted model, until its `crash_after`-th call: then the engine dies, as a killed run's would."""

    def __init__(self, backend, crash_after: int):
        self.backend, self.crash_after, self.model = backend, crash_after, backend.model

    async def generate(self, messages, n=1, **sampling):
        if len(self.backend.calls) >= self.crash_after:
            raise ConnectionError("the engine died")
        return await self.backend.generate(messages, n, **sampling)

    async def aclose(self):
        pass


@pytest.mark.parametrize("stop", ["learning", "testing"])
def test_a_stopped_benchmark_resumes_where_it_stopped_and_ends_as_an_uninterrupted_one(
        bench, cli, tmp_path, monkeypatch, capsys, stop):
    """`--resume`: the family's optimize run goes on from its last committed step (nothing stored is sampled
    again), the row comes out as an uninterrupted run's, the wall time goes on from the stopped process's, a
    finished family is read back without a call, and a resume with other settings is refused by name. Stopped in
    its test split, the resume samples the test groups the stopped run had not scored, and nothing else, and its
    progress counts on from the groups read back."""
    import asyncio

    from fakes import ScriptedBackend
    from gym_tf.datasets import load_dataset
    from gym_tf.errors import ConfigError
    from gym_tf.store import RunStore

    gold = {p.problem: p.answer for p in load_dataset("quickstart")}
    backends = []

    async def fake_backend(config):
        return backends.pop(0)

    monkeypatch.setattr(bench, "make_backend", fake_backend)
    base = ["--families", "quickstart", "--epochs", "1", "-k", "2", "--val-samples", "1"]

    def run(out, backend, *more):
        backends.append(backend)
        args = cli.arguments().parse_args([*base, "--out", str(tmp_path / out), *more])
        return asyncio.run(bench.one_family("quickstart", args, args.out))

    clean = ScriptedBackend(gold)
    clean_row = run("clean", clean)
    test_calls = 16 * 2  # the test split (16 problems) in two arms, one request of k answers per problem
    learning_calls = len(clean.calls) - test_calls
    assert learning_calls > 10

    crashed = ScriptedBackend(gold)
    with pytest.raises(ConnectionError):
        run("stopped", CrashingBackend(crashed, crash_after=learning_calls // 2 if stop == "learning"
                                       else learning_calls + test_calls // 2))
    with pytest.raises(ConfigError, match="epochs"):
        run("stopped", ScriptedBackend(gold), "--resume", "--epochs", "2")

    folder = tmp_path / "stopped" / "quickstart"
    stored = RunStore(folder / "ws")
    # one request a group: its key without the sample number (a validation key's version stays: the prune step's
    # groups differ in it)
    stored_groups = {re.sub(r"/\d+(@|$)", r"\1", r["key"]) for r in stored.db["rollouts"].rows}
    stored_learner_calls = stored.db["learner_calls"].count
    assert stored_groups
    if stop == "testing":  # stopped after the none arm and 3 groups of the learned one: the uninterrupted run's
        # groups (the same problems and seeds) under this run's learned version (a real stop mid-arm keeps a number
        # of groups that varies with the threads that score them)
        finished = (tmp_path / "clean" / "quickstart" / bench.TESTED).read_text().splitlines(keepends=True)
        clean_learned = json.loads(finished[16])[0]["library_version"]
        learned = stored.steps(stored.runs()[0]["id"])[-1]["version_after"]
        with (folder / bench.TESTED).open("a") as tested:
            tested.writelines(line.replace(clean_learned, learned) for line in finished[16:19])
    scored = 19 if stop == "testing" else 0  # test groups kept
    (folder / "clock.json").write_text(json.dumps({"elapsed_s": 1000.0}))  # the stopped process's working time

    resumed = ScriptedBackend(gold)
    capsys.readouterr()
    resumed_row = run("stopped", resumed, "--resume")
    counted = re.findall(r"test (\w+) (\d+)/16", capsys.readouterr().err)
    assert counted == [("none", str(n)) for n in range(1, 17) if stop == "learning"] + [
        ("learned", str(n)) for n in range(max(scored - 16, 0) + 1, 17)]
    without_wall = lambda r: {k: v for k, v in r.items() if k != "wall_min"}  # noqa: E731
    assert without_wall(resumed_row) == without_wall(clean_row)
    # the resumed process paid for exactly what the stopped one had not stored, and for the test split
    solves = lambda backend: sum(c["stage"] == "solve" for c in backend.calls)  # noqa: E731
    read_back = scored
    assert solves(resumed) == solves(clean) - len(stored_groups) - read_back
    assert len(resumed.calls) - solves(resumed) == len(clean.calls) - solves(clean) - stored_learner_calls
    if stop == "testing":  # the groups the stopped run scored are read back from tested.jsonl, each line once
        assert len(resumed.calls) == test_calls - scored
        assert sum(1 for _ in (folder / bench.TESTED).open()) == test_calls
    comparison = json.loads((folder / "comparison.json").read_text())
    assert comparison["resumed"] is True and 1000 < comparison["wall_s"] < 1100
    assert "api_key" not in comparison["settings"]

    done = ScriptedBackend(gold)
    assert run("stopped", CrashingBackend(done, crash_after=0), "--resume") == resumed_row
    assert done.calls == []
    with pytest.raises(ConfigError, match=r"comparison.json was made with other settings \(k\)"):
        run("stopped", ScriptedBackend(gold), "--resume", "-k", "4")


def test_a_new_run_in_a_finished_familys_folder_is_not_read_back_as_that_run_by_a_resume(
        bench, cli, tmp_path, monkeypatch):
    """A new run (no `--resume`) in a folder whose run finished, stopped before its own row: its resume must go on
    from what it stored, not return the finished run's row from the old comparison.json."""
    import asyncio

    from fakes import ScriptedBackend
    from gym_tf.datasets import load_dataset

    gold = {p.problem: p.answer for p in load_dataset("quickstart")}
    backends = []

    async def fake_backend(config):
        return backends.pop(0)

    monkeypatch.setattr(bench, "make_backend", fake_backend)

    def run(backend, *more):
        backends.append(backend)
        args = cli.arguments().parse_args(["--families", "quickstart", "--epochs", "1", "-k", "2",
                                             "--val-samples", "1", "--out", str(tmp_path), *more])
        return asyncio.run(bench.one_family("quickstart", args, args.out))

    run(ScriptedBackend(gold))
    comparison = tmp_path / "quickstart" / "comparison.json"
    assert comparison.exists()
    with pytest.raises(ConnectionError):
        run(CrashingBackend(ScriptedBackend(gold), crash_after=3))
    assert not comparison.exists()
    resumed = ScriptedBackend(gold)
    run(resumed, "--resume")
    assert any(c["stage"] == "solve" for c in resumed.calls) and comparison.exists()


def test_the_learning_time_limit_reaches_the_optimizer_and_the_row_says_where_it_cut_learning(
        bench, cli, report, tmp_path, monkeypatch):
    """`--learn-minutes`: the optimizer starts no learning step past it, the prune step still ends the run, and the
    family's comparison.json and row record the steps run against those planned. The clock moves a second per
    model call."""
    import asyncio
    from types import SimpleNamespace

    from fakes import ScriptedBackend
    from gym_tf.datasets import load_dataset
    from gym_tf.store import RunStore

    clock = SimpleNamespace(now=0.0)
    monkeypatch.setattr("gym_tf.optimize.time", SimpleNamespace(monotonic=lambda: clock.now))

    class Timed(ScriptedBackend):
        async def generate(self, messages, n=1, **sampling):
            clock.now += 1.0
            return await super().generate(messages, n, **sampling)

    gold = {p.problem: p.answer for p in load_dataset("quickstart")}

    async def fake_backend(config):
        return Timed(gold)

    monkeypatch.setattr(bench, "make_backend", fake_backend)
    args = cli.arguments().parse_args(["--families", "quickstart", "-k", "2", "--val-samples", "1",
                                         "--learn-minutes", "0.5", "--out", str(tmp_path)])  # its 16 problems
    row = asyncio.run(bench.one_family("quickstart", args, args.out))
    steps = RunStore(tmp_path / "quickstart" / "ws").steps(RunStore(tmp_path / "quickstart" / "ws").runs()[0]["id"])
    learning = [s for s in steps if s["batch"] >= 0]
    assert 0 < len(learning) < 4 and steps[-1]["step"] == 5 and "ablation" in steps[-1]["stats"]
    # each step started inside the limit; the last ran past it, and none started after
    assert all(s["stats"]["learned_s"] < 30 for s in learning[:-1]) and learning[-1]["stats"]["learned_s"] >= 30
    comparison = json.loads((tmp_path / "quickstart" / "comparison.json").read_text())
    assert comparison["learning_steps"] == {"run": len(learning), "planned": 4}
    assert comparison["settings"]["learn_minutes"] == "0.5" and row["learn_minutes"] == 0.5
    assert row["family"] == "quickstart (-k 2 --val-samples 1)"  # the limit is not in the label
    assert f"learning cut by its 0.5-min limit after {len(learning)} of 4 steps" in report.wall(row)


def test_a_family_that_cannot_be_made_is_reported_and_the_other_families_still_run(bench, tmp_path, monkeypatch,
                                                                                    capsys):
    """knight_swap's generator fails at every level (reasoning-gym 0.1.25): a benchmark of several families names it,
    runs the rest, writes their table, and exits with an error."""
    from fakes import ScriptedBackend
    from gym_tf.datasets import load_dataset

    gold = {p.problem: p.answer for p in load_dataset("quickstart")}

    async def fake_backend(config):
        return ScriptedBackend(gold)

    monkeypatch.setattr(bench, "make_backend", fake_backend)
    monkeypatch.setattr(sys, "argv", ["learning_effect.py", "--families", "knight_swap,quickstart", "--epochs", "1",
                                      "-k", "2", "--val-samples", "1", "--out", str(tmp_path)])
    with pytest.raises(SystemExit) as stopped:
        bench.main()
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert "knight_swap not run: reasoning-gym could not make knight_swap problems: AssertionError" in err
    assert "error: not run: knight_swap" in err
    # its settings are not the defaults (fewer epochs and samples, to be quick), and its row says so
    assert ([r["family"] for r in json.loads((tmp_path / "results.json").read_text())]
            == ["quickstart (--epochs 1 -k 2 --val-samples 1)"])


def test_a_resumed_run_tests_the_splits_it_started_on_and_a_new_run_draws_them(bench, cli, tmp_path, monkeypatch):
    """A resume read the splits again from the generator and overwrote the stopped run's files; where the generator
    made other problems in the new process (isomorphic_strings did), the run's own training set was lost and the
    resume refused. The files a run started on are kept, and a new run in the folder removes them first."""
    import asyncio

    from gym_tf import task_levels

    started = {name: [{"id": f"{name}-0", "problem": f"started {name}", "answer": "1", "rg_config": "{}"}]
               for name in ("train", "val", "test")}
    for name, rows in started.items():
        task_levels.write_rows(rows, tmp_path / f"{name}.jsonl")
    drawn = {name: [{"id": f"{name}-0", "problem": f"drawn {name}", "answer": "2"}] for name in ("train", "val", "test")}
    monkeypatch.setattr(task_levels, "split", lambda *_, **__: drawn)
    read = lambda paths: [json.loads(path.read_text())["problem"] for path in paths]  # noqa: E731

    resumed = cli.arguments().parse_args(["--families", "chain_sum", "--resume"])
    *paths, reward = bench.splits("chain_sum", resumed, tmp_path, 0)
    assert read(paths) == ["started train", "started val", "started test"] and reward == task_levels.REWARD
    (tmp_path / "test.jsonl").unlink()  # stopped before its splits were all written: drawn again, as a new run
    assert read(bench.splits("chain_sum", resumed, tmp_path, 0)[:3]) == ["drawn train", "drawn val", "drawn test"]
    task_levels.write_rows(started["train"], tmp_path / "train.jsonl")
    new_run = cli.arguments().parse_args(["--families", "chain_sum"])
    assert read(bench.splits("chain_sum", new_run, tmp_path, 0)[:3]) == ["drawn train", "drawn val", "drawn test"]

    async def stopped_while_probing(*_):
        raise KeyboardInterrupt

    class Unused:  # the engine, closed when the run stops; the stop comes before any call
        async def aclose(self):
            pass

    async def no_engine(config):
        return Unused()

    monkeypatch.setattr(bench, "pick_level", stopped_while_probing)
    monkeypatch.setattr(bench, "make_backend", no_engine)
    folder = tmp_path / "chain_sum"
    folder.mkdir()
    for stale in bench.run_files(folder):  # an earlier run's row, level, splits and test groups
        stale.write_text("{}")
    with pytest.raises(KeyboardInterrupt):  # a new run in this folder, stopped before its own splits were drawn
        asyncio.run(bench.one_family("chain_sum", new_run, tmp_path))
    assert not any(path.exists() for path in bench.run_files(folder))  # so no resume can take the old ones


def test_a_resumed_run_keeps_the_level_its_probes_chose(bench, cli, tmp_path, monkeypatch):
    """The probes of one level can read 0.41 in one run and 0.66 in the next: a resume must not probe again, or it
    could draw other splits than the run it continues."""
    import asyncio

    from gym_tf import task_levels
    from gym_tf.errors import ConfigError

    chosen = task_levels.Calibration(level=2, rates={0: 0.81, 1: 0.56, 2: 0.31}, tokens=17199, aim=task_levels.AIM,
                                     too_few=(4,))

    async def probe(family, args, backend, folder, sampling):
        return 2, chosen

    async def no_probe(*_):
        raise AssertionError("probed again")

    args = cli.arguments().parse_args(["--families", "chain_sum"])
    monkeypatch.setattr(bench, "pick_level", probe)
    assert asyncio.run(bench.chosen_level("chain_sum", args, None, tmp_path, None)) == (2, chosen)
    monkeypatch.setattr(bench, "pick_level", no_probe)
    resumed = cli.arguments().parse_args(["--families", "chain_sum", "--resume"])
    assert asyncio.run(bench.chosen_level("chain_sum", resumed, None, tmp_path, None)) == (2, chosen)
    other_seed = cli.arguments().parse_args(["--families", "chain_sum", "--resume", "--seed", "4"])
    with pytest.raises(ConfigError, match=r"level.json was made with other settings \(seed\)"):
        asyncio.run(bench.chosen_level("chain_sum", other_seed, None, tmp_path, None))


@pytest.mark.parametrize(("given", "rates", "level", "told"), [
    ("auto", {0: 0.0, -1: 0.03}, -1, 2),   # the chosen level solved under the floor: the model is told answers
    ("auto", {0: 0.0, -1: 0.06}, -1, 0),   # solved at the floor or above: its own answers can be the examples
    ("auto", {0: 0.5, 1: 0.31}, 1, 0),
    ("auto", None, None, 0),               # a level given, so no probe: nothing says the model solves nothing
    ("3", {0: 0.5}, 0, 3),
    ("0", {0: 0.0}, 0, 0),
])
def test_the_model_is_told_answers_where_its_probe_solved_almost_nothing(cli, given, rates, level, told):
    from gym_tf import task_levels

    args = cli.arguments().parse_args(["--hinted-examples", given])
    calibration = task_levels.Calibration(level, rates, 0, task_levels.AIM, ()) if rates else None
    assert cli.hinted_examples(args, calibration) == told
    assert cli.changed_settings(cli.settings(args)) == ("" if given == "0" else f"--hinted-examples {given}")
    # runs recorded before the setting existed count at the defaults
    recorded = {k: v for k, v in cli.settings(cli.arguments().parse_args([])).items() if k != "hinted_examples"}
    assert cli.changed_settings(recorded) == ""


@pytest.mark.parametrize(("flag", "given", "rates", "level", "on"), [
    ("--labeled-examples", "auto", {0: 0.0, -1: 0.03}, -1, True),   # the chosen level solved under the floor
    ("--labeled-examples", "auto", {0: 0.0, -1: 0.06}, -1, False),  # at the floor or above: the model's own answers
    ("--examples-as-turns", "auto", {0: 0.0, -2: 0.0}, -2, True),
    ("--examples-as-turns", "auto", {0: 0.5, 1: 0.31}, 1, False),
    ("--examples-as-turns", "auto", None, None, False),             # a level given: no probe says it solves nothing
    ("--labeled-examples", "on", {0: 0.5}, 0, True),
    ("--examples-as-turns", "off", {0: 0.0}, 0, False),
])
def test_labels_and_turns_switch_on_where_the_probe_solved_almost_nothing(cli, flag, given, rates, level, on):
    from gym_tf import task_levels

    args = cli.arguments().parse_args([flag, given])
    calibration = task_levels.Calibration(level, rates, 0, task_levels.AIM, ()) if rates else None
    assert cli.switched_on(getattr(args, flag[2:].replace("-", "_")), calibration) is on
    assert cli.changed_settings(cli.settings(args)) == ("" if given == "auto" else f"{flag} {given}")
    # `auto` is the default since 2026-12-06; runs recorded before the settings existed ran both off
    recorded = {k: v for k, v in cli.settings(cli.arguments().parse_args([])).items()
                if k not in ("labeled_examples", "examples_as_turns")}
    assert cli.changed_settings(recorded) == "--examples-as-turns off --labeled-examples off"


@pytest.mark.parametrize(("rate", "recorded", "ran", "label"), [
    (0.0, None, None, "gcd (--examples-as-turns off --labeled-examples off)"),  # before the settings: both off
    (0.0, "off", False, "gcd (--examples-as-turns off --labeled-examples off)"),
    (0.0, "auto", True, "gcd"),
    (0.0, "on", True, "gcd"),                                  # on, as auto would have had it: the default
    (0.06, None, None, "gcd"),                                 # at the floor: auto would have left both off
    (0.06, "on", True, "gcd (--examples-as-turns on --labeled-examples on)"),
    (None, None, None, "gcd"),                                 # a level given, no probe: auto stays off
])
@pytest.mark.parametrize("keys", [str, int])  # comparison.json's keys, and the run's own before it is written
@pytest.mark.parametrize("aim", [{"target": 0.3, "floor": 0.05}, {"target": 0.3}])  # no floor: before 2026-12-02
def test_a_row_names_the_turn_options_only_where_auto_would_have_run_otherwise(
        cli, report, rate, recorded, ran, label, keys, aim):
    metric = {"value": 0.25, "low": 0.1, "high": 0.4}
    arm = lambda name: {"name": name, "library_items": 1, "tokens": {"learning": 100},  # noqa: E731
                        "metrics": {"mean_at_k": metric, "majority": metric}, "mean_vs_baseline": metric,
                        "majority_vs_baseline": metric, "mean_vs_baseline_majority": metric}
    settings = {k: v for k, v in cli.settings(cli.arguments().parse_args(["--seed", "7"])).items()
                if k not in cli.AUTO_SWITCHES} | ({k: recorded for k in cli.AUTO_SWITCHES} if recorded else {})
    comparison = {"family": "gcd", "settings": settings, "model": "0.5B", "problems": 24, "samples": 4,
                  "arms": [arm("none"), arm("learned")], "library": [{"kind": "example"}],
                  "extra_prompt_tokens_per_call": {"learned": 40}, "wall_s": 600, "cpu": "AMD EPYC (AVX2)",
                  "level": 0, "probes": rate is not None and {"level": 0, "rates": {keys(0): rate}, "tokens": 1000,
                                                              "aim": aim, "too_few": []} or None,
                  "labeled_examples": ran, "examples_as_turns": ran}
    assert report.row(comparison)["family"] == label


@pytest.mark.parametrize("text", ["-1", "17", "two", ""])
def test_a_number_of_told_answers_outside_0_to_16_is_refused(cli, text):
    with pytest.raises(SystemExit):
        cli.arguments().parse_args(["--hinted-examples", text])


def test_test_groups_kept_for_a_resume_drop_a_line_cut_by_the_stop_and_a_new_run_removes_them(bench, tmp_path):
    """`tested.jsonl`: a resume reads back each whole group by library version and problem; the line a stop cut
    short is dropped (sampled again); with no file, none (a new run removes it: `run_files`)."""
    import dataclasses

    from gym_tf.rollouts import Rollout

    group = [Rollout(problem_id="p1", sample=n, messages=[{"role": "user", "content": "2+2?"}], completion="4",
                     finish_reason="stop", prompt_tokens=5, completion_tokens=1, latency_s=0.1, reward=1.0,
                     library_version="v1", shown=("E1",)) for n in range(2)]
    line = json.dumps([dataclasses.asdict(r) for r in group])
    (tmp_path / bench.TESTED).write_text(line + "\n" + line[: len(line) // 2], encoding="utf-8")
    assert bench.tested_groups(tmp_path) == {"v1": {"p1": group}}
    assert (tmp_path / bench.TESTED).read_text(encoding="utf-8") == line + "\n"  # the next group gets its own line
    (tmp_path / bench.TESTED).unlink()
    assert bench.tested_groups(tmp_path) == {}
