"""The command line: ``vsbayes fit`` and ``vsbayes compare`` on embedded and CSV data."""

import csv
import importlib
import itertools
import json
import sys

import numpy as np
import pytest
from _helpers import EarlySubprocess

from vsbayes.cli import main
from vsbayes.cli.compare import REFERENCE_FACTOR
from vsbayes.exceptions import DegenerateEstimateError


def write_csv(path, header, rows):
    with path.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(header)
        writer.writerows(rows)
    return str(path)


@pytest.fixture
def small_csv(tmp_path):
    """200 rows, 3 features, the label column in the middle, text labels."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 3))
    y = np.where(X @ [1.0, -1.0, 0.5] + rng.logistic(size=200) > 0, "yes", "no")
    rows = [
        [f"{a:.5f}", label, f"{b:.5f}", f"{c:.5f}"] for (a, b, c), label in zip(X, y, strict=True)
    ]
    return write_csv(tmp_path / "small.csv", ["a", "outcome", "b", "c"], rows)


def run(capsys, *argv):
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def test_fit_default_prints_the_posterior_of_every_coefficient(capsys):
    status, out, err = run(capsys, "fit")
    assert status == 0
    for text in ("breast cancer", "569 rows", "30 features", "standardized", "benign"):
        assert text in out
    for text in ("mean", "sd", "2.5%", "97.5%", "P(sign)", "log evidence"):
        assert text in out
    for name in ("mean radius", "worst texture", "(intercept)"):
        assert name in out
    assert "training accuracy" in out and "fit time" in out
    # Which computation ran and how accurate it is, in words; the details behind --verbose.
    assert "ran as:           expectation propagation, each row's likelihood factor" in out
    assert "accuracy:         EP converged" in out
    assert "diagnostics:" not in out and "site_change" not in out and "N:  " not in out
    assert err == ""  # no progress unless asked, as stderr is not a terminal here


def test_fit_verbose_shows_the_details(capsys):
    status, out, _ = run(capsys, "fit", "--verbose")
    assert status == 0
    assert "diagnostics:      n_iter=" in out and "site_change=" in out
    assert "strategy:         sites (" in out and "N:         none (VS site fits" in out


def test_fit_plot_writes_the_forest_and_calibration_png(capsys, tmp_path, small_csv):
    plot = tmp_path / "fit.png"
    # A name without a suffix: matplotlib adds .png, and the output names that file.
    argv = ("fit", small_csv, "--target", "outcome", "--method", "laplace", "--plot")
    status, out, _ = run(capsys, *argv, str(tmp_path / "fit"))
    assert status == 0 and plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"plot:              {plot}" in out


def test_fit_plot_shows_the_coefficients_farthest_from_zero():
    """Beyond FOREST_ROWS coefficients the forest plot keeps those of largest |mean| / sd
    over every class, in their tables' order (3500 features drew a 69,484-pixel-high PNG
    in 40 s); a coefficient fixed at 0 (sd 0, a pruned feature) comes last."""
    from vsbayes.cli.plots import FOREST_ROWS, _farthest_from_zero
    from vsbayes.cli.summary import Coefficient

    rng = np.random.default_rng(0)
    z = rng.permutation(3 * 40) / 10.0  # distinct |mean| / sd, sd varying
    sd = rng.uniform(0.5, 2.0, z.size)
    rows = [Coefficient(f"c{i}", z[i] * sd[i] * (-1) ** i, sd[i], 0, 0, 0.5) for i in range(z.size)]
    rows[0] = Coefficient("pruned", 0.0, 0.0, 0.0, 0.0, float("nan"))
    tables = [rows[:40], rows[40:80], rows[80:]]
    kept = _farthest_from_zero(tables, FOREST_ROWS)
    names = {c.name for t in kept for c in t}
    assert len(names) == FOREST_ROWS and "pruned" not in names
    threshold = np.sort(z[1:])[::-1][FOREST_ROWS - 1]
    assert names == {f"c{i}" for i in range(1, z.size) if z[i] >= threshold}
    for table, shown in zip(tables, kept, strict=True):  # each table's order kept
        assert [c.name for c in table if c.name in names] == [c.name for c in shown]
    assert _farthest_from_zero(tables, 200) is tables  # all of them: unchanged


def test_fit_table_is_the_estimators_summary(capsys, tmp_path, small_csv):
    from vsbayes.cli.data import load_dataset
    from vsbayes.estimators import LaplaceLogisticRegression

    out_json = tmp_path / "fit.json"
    argv = ("fit", small_csv, "--target", "outcome", "--method", "laplace", "--json")
    status, _, _ = run(capsys, *argv, str(out_json))
    assert status == 0
    data = load_dataset(small_csv, "outcome")
    table = LaplaceLogisticRegression().fit(data.X, data.y).summary()
    (problem,) = json.loads(out_json.read_text())["problems"]
    assert [c["mean"] for c in problem["coefficients"]] == pytest.approx(table["mean"], rel=1e-12)
    assert [c["p_sign"] for c in problem["coefficients"]] == pytest.approx(
        table["P(sign)"], rel=1e-12
    )


def test_fit_laplace_probit(capsys):
    argv = ("fit", "--method", "laplace", "--link", "probit", "--C", "0.5", "--verbose")
    status, out, _ = run(capsys, *argv)
    assert status == 0
    assert "LaplaceProbitRegression" in out and "C = 0.5" in out
    assert "grad_norm" in out and "deterministic" in out


def test_fit_csv_with_named_target_and_json(capsys, tmp_path, small_csv):
    out_json = tmp_path / "fit.json"
    status, out, _ = run(
        capsys,
        "fit",
        small_csv,
        "--target",
        "outcome",
        "--json",
        str(out_json),
        "--seed",
        "3",
        "--strategy",
        "global",
    )
    assert status == 0
    assert "outcome = yes" in out and "no (" in out
    summary = json.loads(out_json.read_text())
    (problem,) = summary["problems"]
    names = [c["name"] for c in problem["coefficients"]]
    assert names == ["a", "b", "c", "(intercept)"]
    for c in problem["coefficients"]:
        assert c["sd"] > 0
        assert c["q025"] < c["mean"] < c["q975"]
        assert c["q975"] - c["mean"] == pytest.approx(1.959964 * c["sd"], rel=1e-6)
    # The signs of the simulated effects, and the table shows the JSON's numbers.
    assert problem["coefficients"][0]["mean"] > 0 > problem["coefficients"][1]["mean"]
    assert f"{problem['coefficients'][0]['mean']:.4f}" in out
    assert np.isfinite(problem["log_evidence"])
    assert problem["diagnostics"]["n_samples"] == summary["settings"]["n_samples_used"] == 256
    assert problem["laplace_fallback"] is False
    assert problem["strategy"] == "global"
    assert summary["settings"]["method"] == "vs" and summary["settings"]["seed"] == 3
    assert summary["seconds"] > 0 and 0.5 < summary["training_accuracy"] <= 1


def test_fit_multiclass_prints_one_table_per_problem(capsys, tmp_path):
    rng = np.random.default_rng(1)
    rows = [[f"{v:.4f}" for v in rng.normal(size=2)] + [label] for label in "abc" * 20]
    path = write_csv(tmp_path / "three.csv", ["x1", "x2", "species"], rows)
    # The probit link is one-vs-rest beyond two classes (the logistic EP is multinomial).
    status, out, _ = run(capsys, "fit", path, "--method", "ep", "--link", "probit")
    assert status == 0
    for k in (1, 2, 3):
        assert f"problem {k} of 3" in out
    assert out.count("log evidence") == 3


def test_fit_warnings_are_one_line_each_on_stderr(capsys, small_csv):
    # 20 points for n = 15 parameters: fewer than 2n, an UnreliableFitWarning.
    args = ("--target", "outcome", "--n-samples", "20", "--strategy", "global")
    status, out, err = run(capsys, "fit", small_csv, *args)
    assert status == 0 and "log evidence" in out
    lines = err.splitlines()
    assert lines and all(line.startswith("vsbayes: warning: ") for line in lines)
    assert "UnreliableFitWarning" in err
    # The estimator's remedy named in the command's option (it said "Use n_samples >= 30").
    assert "Use --n-samples >= 30" in err and "n_samples" not in err


def test_fit_default_vs_records_its_strategy(capsys, small_csv):
    # strategy="auto" with an explicit N: the global fit, kept only if it departs from EP.
    argv = ("fit", small_csv, "--target", "outcome", "--n-samples", "20", "--verbose")
    status, out, _ = run(capsys, *argv)
    assert status == 0 and "strategy:         sites (the global fit was unreliable" in out
    assert "N:         none (VS site fits" in out


def test_fit_target_kl_reports_the_predicted_error(capsys, small_csv):
    argv = ("fit", small_csv, "--target", "outcome", "--strategy", "global")
    status, out, _ = run(capsys, *argv, "--target-kl", "0.05", "--verbose")
    assert status == 0
    assert "accuracy:         predicted error" in out and "sampling stopped: target_kl" in out


def test_fit_says_which_computation_ran_without_a_false_failure(capsys, small_csv):
    # 200 rows for 4 parameters: VS keeps the skewness-corrected Laplace approximation by
    # choice (no fallback, no warning), with its predicted error.
    status, out, err = run(capsys, "fit", small_csv, "--target", "outcome")
    assert status == 0 and err == ""
    assert "ran as:           the Laplace approximation with its mean moved" in out
    assert "failed" not in out and "accuracy:         predicted error" in out
    # The target it is within, and how to set it ("within the target" read as the label
    # column, which the header calls the target).
    assert "within the 0.01-nat target (--target-kl)" in out
    # It drew no points: its stop at the target is not said to be sampling's.
    status, out, _ = run(capsys, "fit", small_csv, "--target", "outcome", "--verbose")
    assert "stopped, no sampling: target_kl" in out and "sampling stopped" not in out
    # Importance sampling draws through EP's posterior by default, not Laplace's.
    status, out, _ = run(capsys, "fit", small_csv, "--target", "outcome", "--method", "is")
    assert status == 0
    assert "ran as:           importance sampling on points drawn through expectation" in out


def test_fit_verbose_says_a_sampling_fit_fell_back_not_that_it_is_deterministic(
    capsys, small_csv, monkeypatch
):
    # Weights too degenerate for a covariance (an effective sample size below d + 1): the
    # estimate is refused and the Laplace fallback runs.
    def degenerate(pool):
        raise DegenerateEstimateError("The importance-sampling covariance is singular.")

    # (the package's name importance_sampling is the function: the module by its path)
    module = importlib.import_module("vsbayes.engine.importance_sampling")
    monkeypatch.setattr(module, "fit_is_pool", degenerate)
    argv = ("fit", small_csv, "--target", "outcome", "--method", "is", "--n-samples", "15")
    status, out, err = run(capsys, *argv, "--verbose")
    assert status == 0 and "falling back to the laplace approximation" in err.lower()
    assert "is deterministic" not in out
    assert "N:         none (the fit fell back to the Laplace approximation" in out


def test_verbose_shows_progress(capsys, small_csv):
    status, _, err = run(capsys, "fit", small_csv, "--target", "outcome", "--verbose")
    assert status == 0 and "fit: done" in err


def error_cases(tmp_path):
    good = [["1.0", "2.0", "a"], ["2.0", "1.0", "b"], ["0.5", "0.1", "a"]]
    text = write_csv(tmp_path / "text.csv", ["x", "colour", "y"], [["1", "red", "a"]] * 3)
    one_class = write_csv(tmp_path / "one.csv", ["x", "z", "y"], [["1", "2", "a"]] * 3)
    missing = write_csv(tmp_path / "missing.csv", ["x", "z", "y"], [*good, ["", "1", "b"]])
    no_label = write_csv(tmp_path / "no_label.csv", ["x", "z", "y"], [*good, ["0", "1", ""]])
    intercept = write_csv(tmp_path / "intercept.csv", ["(intercept)", "x", "z", "y"],
                          [["1", *row] for row in good])  # fmt: skip
    multi = write_csv(tmp_path / "multi.csv", ["x", "z", "y"], [*good, ["0", "0", "c"]])
    good_path = write_csv(tmp_path / "good.csv", ["x", "z", "y"], good)
    out_png = str(tmp_path / "o.png")
    headerless = tmp_path / "headerless.csv"  # as the UCI files: the first row is data
    headerless.write_text("1,0,1,g\n1,0,0.25,b\n0,1,0.75,g\n")
    identifier = write_csv(tmp_path / "id.csv", ["x", "id"], [[i % 2, i] for i in range(12)])
    huge = write_csv(
        tmp_path / "huge.csv", ["x", "z", "y"], [["1e300", "0", "a"], ["-1e300", "1", "b"]]
    )
    trailing_comma = tmp_path / "comma.csv"
    trailing_comma.write_text("x,z,y,\n1,2,a,\n2,1,b,\n")
    unknown_marker = tmp_path / "question.csv"
    unknown_marker.write_text("x,z,y\n1,2,a\n?,1,b\n")
    ragged = tmp_path / "ragged.csv"
    ragged.write_text("x,z,y\n1,2,a\n3,b\n")
    binary = tmp_path / "binary.csv"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00\x01")
    semicolons = tmp_path / "semicolons.csv"
    semicolons.write_text("x;z;y\n1;2;a\n3;4;b\n")
    label_first = write_csv(
        tmp_path / "first.csv", ["y", "x", "z"], [["1", "1", "0.5"], ["0", "2", "1"]]
    )
    return {
        "missing file": (["fit", str(tmp_path / "nope.csv")], 1),
        "directory": (["fit", str(tmp_path)], 1),
        "not text": (["fit", str(binary)], 1),
        "ragged rows": (["fit", str(ragged)], 1),
        "unknown target": (["fit", good_path, "--target", "label"], 1),
        "non-numeric feature": (["fit", text], 1),
        "missing value": (["fit", missing], 1),
        "one class": (["fit", one_class], 1),
        "n_samples below n": (["fit", "--n-samples", "5"], 1),
        "compare multiclass": (["compare", multi], 1),
        "negative C": (["fit", "--C", "-1"], 2),
        "zero n_samples": (["fit", "--n-samples", "0"], 2),
        "unknown method": (["fit", "--method", "mcmc"], 2),
        "vb probit": (["fit", "--method", "vb", "--link", "probit"], 2),
        "target-kl not vs": (["fit", "--method", "laplace", "--target-kl", "0.1"], 2),
        "strategy not vs": (["fit", "--method", "bmc", "--strategy", "sites"], 2),
        "n_samples not sampled": (["fit", "--method", "ep", "--n-samples", "100"], 2),
        "semicolons": (["fit", str(semicolons)], 1),
        "semicolons with target": (["fit", str(semicolons), "--target", "y"], 1),
        "continuous target": (["fit", label_first], 1),
        "negative budget": (["fit", "--budget", "-1"], 2),
        "target without data": (["compare", "--target", "y"], 2),
        "no command": ([], 2),
        # The outputs are checked before the fit: nothing printed, no time spent.
        "json is the data file": (["fit", good_path, "--json", good_path], 1),
        "json folder missing": (["fit", good_path, "--json", str(tmp_path / "no" / "o.json")], 1),
        "json is a folder": (["fit", good_path, "--json", str(tmp_path)], 1),
        "plot format": (["fit", good_path, "--plot", str(tmp_path / "plot.txt")], 1),
        "compare plot took the data": (["compare", "--plot", good_path, "--budget", "0.01"], 1),
        "json and plot the same": (["fit", good_path, "--json", out_png, "--plot", out_png], 1),
        "headerless file": (["fit", str(headerless)], 1),
        "no-header target number": (["fit", str(headerless), "--no-header", "--target", "5"], 1),
        "no-header without data": (["fit", "--no-header"], 2),
        "missing-value marker": (["fit", str(unknown_marker)], 1),
        "identifier target": (["fit", identifier], 1),
        "huge feature": (["fit", huge], 1),
        "trailing comma": (["fit", str(trailing_comma)], 1),
        "unknown option": (["fit", good_path, "--random-state", "0"], 2),
        "missing label": (["fit", no_label], 1),
        "a feature named as the intercept": (["fit", intercept], 1),
    }


CASES = [
    "missing file",
    "directory",
    "not text",
    "ragged rows",
    "unknown target",
    "non-numeric feature",
    "missing value",
    "one class",
    "n_samples below n",
    "compare multiclass",
    "negative C",
    "zero n_samples",
    "unknown method",
    "vb probit",
    "target-kl not vs",
    "strategy not vs",
    "n_samples not sampled",
    "semicolons",
    "semicolons with target",
    "continuous target",
    "negative budget",
    "target without data",
    "no command",
    "json is the data file",
    "json folder missing",
    "json is a folder",
    "plot format",
    "compare plot took the data",
    "json and plot the same",
    "headerless file",
    "no-header target number",
    "no-header without data",
    "missing-value marker",
    "identifier target",
    "huge feature",
    "trailing comma",
    "unknown option",
    "missing label",
    "a feature named as the intercept",
]


@pytest.mark.parametrize("case", CASES)
def test_errors_are_one_line(capsys, tmp_path, case):
    argv, expected = error_cases(tmp_path)[case]
    status, out, err = run(capsys, *argv)
    assert status == expected
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("vsbayes: error: ")
    assert "Traceback" not in err


def test_error_messages_name_the_problem(capsys, tmp_path):
    cases = error_cases(tmp_path)
    for case, words in [
        ("unknown target", ["'label'", "'x'"]),
        ("non-numeric feature", ["'colour'", "numeric", "line 2"]),
        ("one class", ["one class"]),
        ("compare multiclass", ["binary", "3 classes", "multinomial posterior"]),
        ("vb probit", ["logistic only"]),
        ("strategy not vs", ["--strategy", "--method vs"]),
        ("n_samples not sampled", ["--n-samples", "draws no points"]),
        ("semicolons", ["';'", "comma-separated"]),
        ("semicolons with target", ["';'", "comma-separated"]),
        ("continuous target", ["'z'", "continuous", "--target"]),
        ("json is the data file", ["--json", "the data file"]),
        ("json folder missing", ["--json", "no folder"]),
        ("plot format", ["--plot", ".txt", ".png"]),
        ("compare plot took the data", ["good.csv --plot", "put the data file first"]),
        ("headerless file", ["reads as data", "--no-header"]),
        ("no-header target number", ["no column number '5'", "'1', '2', '3', '4'"]),
        ("missing-value marker", ["line 3", "missing value ('?')", "'x'"]),
        ("identifier target", ["'id'", "12 distinct values in 12 rows", "--target"]),
        ("huge feature", ["'x'", "too large to standardize", "rescale"]),
        ("trailing comma", ["column 4", "a comma at the end of each line"]),
        ("unknown option", ["--random-state 0", "see vsbayes fit --help"]),
        ("missing label", ["missing label in column 'y'", "drop the rows"]),
        ("a feature named as the intercept", ["'(intercept)'", "drop the column"]),
    ]:
        _, _, err = run(capsys, *cases[case][0])
        for word in words:
            assert word in err, (case, err)


def test_fit_no_header_numbers_the_columns(capsys, tmp_path):
    # A headerless file: every row is data, the columns are numbered from 1.
    rows = ["0.5,1,g", "0.25,0,b", "0.75,1,b", "0.1,0,g"]
    path = tmp_path / "uci.data"
    path.write_text("\n".join(rows) + "\n")
    status, out, err = run(capsys, "fit", str(path), "--no-header", "--method", "laplace")
    assert status == 0 and err == ""
    assert "4 rows, 2 features" in out and "target:    3; classes b (2), g (2)" in out
    path.write_text("\n".join(row[:-2] for row in rows) + "\n")  # the label in column 2
    status, out, _ = run(capsys, "fit", str(path), "--no-header", "--target", "2", "--method", "ep")
    assert status == 0 and "target:    2; classes 0 (2), 1 (2)" in out


def test_fit_warns_when_the_header_row_reads_as_data(capsys, tmp_path):
    data = [["5", "3", "a"], ["1", "2", "b"], ["2", "2", "a"], ["3", "1", "b"]]
    distinct = write_csv(tmp_path / "distinct.csv", data[0], data[1:])
    status, _, err = run(capsys, "fit", distinct, "--method", "laplace")
    assert status == 0 and "warning: " in err and "pass --no-header" in err
    # pandas' column numbers are a header: no warning.
    numbered = write_csv(tmp_path / "numbered.csv", ["0", "1", "y"], data)
    status, _, err = run(capsys, "fit", numbered, "--method", "laplace")
    assert status == 0 and err == ""
    # A missing-value marker among the labels is a class of its own: said so.
    marker = write_csv(tmp_path / "marker.csv", ["0", "1", "y"], [*data, ["1", "1", "NA"]])
    status, _, err = run(capsys, "fit", marker, "--method", "laplace")
    assert status == 0 and "1 row of the target column 'y' read 'NA'" in err


def test_compare_prints_every_method_and_writes_the_plot(capsys, tmp_path, small_csv):
    plot, out_json = tmp_path / "cmp.png", tmp_path / "cmp.json"
    argv = ["compare", small_csv, "--target", "outcome", "--budget", "0.2"]
    status, out, _ = run(capsys, *argv, "--plot", str(plot), "--json", str(out_json))
    assert status == 0
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    n = 15  # (p + 1)(p + 2) / 2 with p = 4 parameters
    assert f"from EP corrected by {REFERENCE_FACTOR * n} = {REFERENCE_FACTOR}n importance" in out
    assert summary_reference_is_sane(json.loads(out_json.read_text())["reference"])
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("method "))
    table = [line.split()[0] for line in lines[start + 1 :] if line and ":" not in line]
    assert set(table) == {"laplace", "ep", "vb", "vs", "is", "bmc"}
    summary = json.loads(out_json.read_text())
    results = summary["results"]
    assert {r["method"] for r in results} == {"laplace", "ep", "vb", "vs", "is", "bmc"}
    laplace = next(r for r in results if r["method"] == "laplace")
    assert laplace["ratio_to_laplace"] == pytest.approx(1.0)
    vs = [r for r in results if r["method"] == "vs"]
    ladder = [r["n_samples"] for r in vs]
    assert ladder[0] == 30  # 2n with n = 15, then doubling
    assert all(b == 2 * a for a, b in itertools.pairwise(ladder))
    assert all(r["excess_kl"] >= 0 for r in results)
    assert summary["plot"] == str(plot)


def test_compare_widens_the_reference_proposal_until_its_weights_are_bounded(tmp_path):
    # 60 rows × 3 features: the posterior is further from EP's Gaussian than at 200 rows,
    # and EP's covariance widened by 1.05 left Pareto k̂ at 0.76 ("the reference is
    # uncertain", on ordinary data); widened by 1.2, 0.20.
    from argparse import Namespace

    from vsbayes.cli.compare import REFERENCE_WIDENINGS, _reference
    from vsbayes.cli.data import load_dataset
    from vsbayes.cli.summary import Console

    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 3))
    y = (X[:, 0] + rng.normal(size=60) > 0).astype(int)
    path = write_csv(tmp_path / "small.csv", ["a", "b", "c", "y"], np.column_stack([X, y]))
    data = load_dataset(path)
    args = Namespace(link="logistic", C=1.0, seed=0)
    _, record = _reference(data, args, 15, Console())
    assert record.widening > REFERENCE_WIDENINGS[0]
    assert record.pareto_k <= 0.7 and 0 <= record.noise < 0.05


def summary_reference_is_sane(reference) -> bool:
    return reference["pareto_k"] < 0.7 and 0 <= reference["noise"] < 0.05


def test_compare_writes_no_plot_unless_asked(capsys, tmp_path, small_csv, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = ["compare", small_csv, "--target", "outcome", "--budget", "0.05"]
    status, out, _ = run(capsys, *argv)
    assert status == 0 and list(tmp_path.glob("*.png")) == [] and "plot:" not in out


def test_compare_reference_is_stronger_than_the_sampled_fits(capsys, tmp_path, small_csv):
    # The reference's own noise is far below the errors of the sampled fits it judges
    # (a VS reference with 64n points has errors of their size).
    out_json = tmp_path / "cmp.json"
    argv = ["compare", small_csv, "--target", "outcome", "--budget", "0.05"]
    status, _, _ = run(capsys, *argv, "--json", str(out_json))
    summary = json.loads(out_json.read_text())
    sampled = [r["excess_kl"] for r in summary["results"] if r["n_samples"] is not None]
    assert status == 0 and summary["reference"]["noise"] < min(sampled) / 5


def test_compare_without_matplotlib_prints_the_table_and_says_so(
    capsys, tmp_path, small_csv, monkeypatch
):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    plot = tmp_path / "none.png"
    argv = ["compare", small_csv, "--target", "outcome", "--link", "probit", "--budget", "0.05"]
    status, out, err = run(capsys, *argv, "--plot", str(plot))
    assert status == 0
    assert not plot.exists()
    assert "excess KL" in out and "bmc" in out and "\nvb" not in out  # VB: logistic only
    assert 'pip install "vsbayes[plot]"' in err


def test_help_examples_work_as_written(capsys, tmp_path, monkeypatch):
    # Every example of the --help texts parses; those on small files run (the data.csv of
    # the examples: label column y; uci.data: no header row, the label in column 2).
    import shlex

    from vsbayes.cli._parser import EXAMPLES, build_parser

    rng = np.random.default_rng(2)
    X = rng.normal(size=(40, 2))
    labels = np.where(X @ [1.0, -1.0] + rng.logistic(size=40) > 0, "yes", "no")
    rows = [[f"{a:.4f}", f"{b:.4f}", c] for (a, b), c in zip(X, labels, strict=True)]
    write_csv(tmp_path / "data.csv", ["x1", "x2", "y"], rows)
    (tmp_path / "uci.data").write_text("".join(f"{a},{c == 'yes':d},{b}\n" for a, b, c in rows))
    monkeypatch.chdir(tmp_path)
    examples = [
        shlex.split(line, comments=True)[1:]
        for text in EXAMPLES.values()
        for line in text.splitlines()[1:]
    ]
    assert len(examples) == 11
    parser = build_parser()
    for argv in examples:
        # Parsed only: the breast-cancer data (fitted by the tests above) and compare's
        # plot (a second of drawing; test_compare_prints_every_method_... draws it).
        if not {"data.csv", "uci.data", "--help"} & set(argv) or argv[-1] == "--plot":
            parser.parse_args(argv)
            continue
        if argv[0] == "compare":
            argv += ["--budget", "0.01"]
        status, out, err = run(capsys, *argv)
        assert status == 0 and out and "error" not in err, (argv, err)
    assert (tmp_path / "fit.png").exists()
    assert json.loads((tmp_path / "compare.json").read_text())["settings"]["link"] == "probit"


def test_compare_refuses_a_reference_beyond_the_memory(capsys, small_csv):
    import vsbayes

    # 512n draws of 4 parameters (n = 15) take about 1.2 MB; numpy's MemoryError was a
    # traceback on wide data (500 features: 1 TB).
    with vsbayes.config_context(memory_limit=2**20):
        status, out, err = run(capsys, "compare", small_csv, "--target", "outcome")
    assert status == 1 and out == "" and err.count("\n") == 1
    assert "the reference's 7680 importance draws over 4 parameters" in err


def test_compare_sizes_its_reference_before_any_work(capsys, small_csv, monkeypatch):
    # --budget bounds the sampling ladders, not the reference: the reference's work is
    # planned before EP runs and refused beyond its own limit, saying what it would cost.
    from vsbayes.cli import compare

    planned = compare.REFERENCE_FACTOR * 15 * len(compare.REFERENCE_WIDENINGS)  # draws
    monkeypatch.setattr(compare, "REFERENCE_WORK_LIMIT", 1e6)
    monkeypatch.setattr(compare, "make_estimator", None)  # no fit may start
    status, out, err = run(capsys, "compare", small_csv, "--target", "outcome")
    assert status == 1 and out == "" and err.count("\n") == 1
    assert "the reference's 7680 importance draws over 4 parameters" in err
    assert f"up to {planned} draws" in err and "limit of 1e+06 multiply-adds" in err
    assert "fewer features" in err


def test_compare_help_says_what_the_budget_covers(capsys):
    status, out, _ = run(capsys, "compare", "--help")
    text = " ".join(out.split())
    assert status == 0 and "not the reference" in text


def test_the_reference_runs_on_one_blas_thread(small_csv):
    # Its second moments are BLAS products: on the library's pool of threads they stalled
    # on a busy machine (a fit of its own runs on one thread, as every fit does).
    from threadpoolctl import threadpool_info

    from vsbayes import Gaussian
    from vsbayes.cli.compare import reference_posterior

    class Model:
        def log_density(self, theta):
            threads = {
                pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"
            }
            assert threads <= {1}
            return -0.5 * (theta * theta).sum(axis=1)

    proposal = Gaussian(np.zeros(2), np.eye(2))
    posterior, _, _ = reference_posterior(Model(), proposal, 64, np.random.default_rng(0))
    np.testing.assert_allclose(posterior.mean, 0.0, atol=1e-12)  # antithetic, exact target


def test_memory_error_is_one_line(capsys, monkeypatch):
    def out_of_memory(*args, **kwargs):
        raise MemoryError("Unable to allocate 121. GiB for an array")

    monkeypatch.setattr("vsbayes.cli.fit.load_dataset", out_of_memory)
    status, out, err = run(capsys, "fit")
    assert (
        status == 1
        and out == ""
        and err == "vsbayes: error: Unable to allocate 121. GiB for an array\n"
    )


def test_version(capsys):
    status, out, _ = run(capsys, "--version")
    assert status == 0 and out.startswith("vsbayes ")


# Started when the tests are collected (tests/conftest.py): a new interpreter's imports,
# on the other core meanwhile.
MODULE_ENTRY_POINT = EarlySubprocess(
    "module_entry_point",
    lambda scratch, items: [sys.executable, "-X", "importtime", "-m", "vsbayes", "--version"],
)
# What makes an answer slow: over a second of imports before the parser runs.
NUMERICAL_LIBRARIES = ("numpy", "scipy", "sklearn", "pandas", "matplotlib")
# The answers that need no fit, in one fresh interpreter (this one has imported everything);
# its last line names the numerical libraries they imported.
ANSWERS_WITHOUT_A_FIT = (
    ["--help"],
    ["fit", "--help"],
    ["compare", "--help"],
    ["fit", "--method", "nuts"],
    ["fit", "--method", "ep", "--strategy", "sites"],
    ["fit", "--n-samples", "10", "--method", "laplace"],
    ["fit", "--method", "vb", "--link", "probit"],
    ["fit", "--no-header"],
)
LIGHT_ANSWERS = EarlySubprocess(
    "light_answers",
    lambda scratch, items: [
        sys.executable,
        "-c",
        "import sys\n"
        "from vsbayes.cli import main\n"
        f"statuses = [main(argv) for argv in {ANSWERS_WITHOUT_A_FIT!r}]\n"
        "print(*statuses)\n"
        f"print(*sorted(m for m in {NUMERICAL_LIBRARIES!r} if m in sys.modules))\n",
    ],
)


@pytest.fixture
def module_entry_point():
    return MODULE_ENTRY_POINT.result()


@pytest.fixture
def light_answers():
    return LIGHT_ANSWERS.result()


def test_module_entry_point(module_entry_point):
    done = module_entry_point
    assert done.returncode == 0 and "vsbayes" in done.stdout
    # --version answers before the library loads (``python -X importtime`` lists every
    # module imported, on stderr).
    imported = {line.split("|")[-1].strip() for line in done.stderr.splitlines()}
    assert not imported & set(NUMERICAL_LIBRARIES), done.stderr[-2000:]
    assert "vsbayes._version" in imported


def test_help_and_usage_errors_answer_before_the_library_loads(light_answers):
    done = light_answers
    *_, statuses, heavy = done.stdout.splitlines()
    assert done.returncode == 0, done.stderr
    assert statuses.split() == ["0"] * 3 + ["2"] * (len(ANSWERS_WITHOUT_A_FIT) - 3), done.stderr
    assert done.stderr.count("vsbayes: error:") == len(ANSWERS_WITHOUT_A_FIT) - 3
    assert heavy == "", f"imported {heavy} before parsing the arguments"


def test_parser_offers_the_estimators_choices():
    # The parser reads vsbayes._choices (no library import); the library its classes.
    import argparse

    from vsbayes.cli._parser import build_parser
    from vsbayes.estimators import LINKS, METHODS, VSLogisticRegression

    def choices(parser, dest):
        return next(tuple(a.choices) for a in parser._actions if a.dest == dest)

    commands = choices(build_parser(), "command")
    assert commands == ("fit", "compare")
    subparsers = next(
        a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)
    )
    fit, compare = (subparsers.choices[name] for name in commands)
    assert choices(fit, "method") == tuple(METHODS)
    assert choices(fit, "link") == choices(compare, "link") == tuple(LINKS)
    assert choices(fit, "strategy") == VSLogisticRegression._constraints["strategy"]


def test_fit_multinomial_prints_one_joint_table(capsys, tmp_path):
    rng = np.random.default_rng(1)
    rows = [[f"{v:.4f}" for v in rng.normal(size=2)] + [label] for label in "abc" * 20]
    path = write_csv(tmp_path / "three.csv", ["x1", "x2", "species"], rows)
    status, out, _ = run(capsys, "fit", path, "--method", "ep")
    assert status == 0
    assert "all classes (multinomial; coefficients centred" in out
    assert out.count("log evidence") == 1
    for name in ("a: x1", "c: x2", "b: (intercept)"):
        assert name in out


@pytest.mark.parametrize("method", ["vs", "bmc", "is"])
def test_fit_too_few_points_names_the_command_lines_options(capsys, small_csv, method):
    # 3 features and the intercept: n = 15 parameters of the Gaussian. The estimators'
    # advice (family='diagonal' for VS) names options the command line does not have.
    argv = ["fit", small_csv, "--target", "outcome", "--method", method, "--n-samples", "1"]
    status, out, err = run(capsys, *argv)
    assert status == 1 and out == "" and err.count("\n") == 1
    assert "--n-samples 1 is fewer than the n = 15 parameters" in err
    assert "--n-samples 15 or more" in err and "--n-samples auto" in err
    assert "family" not in err and "n_samples" not in err


def test_fit_warns_of_a_constant_column(capsys, tmp_path):
    # Its row is the prior's (mean 0, sd 1, P(sign) 0.5), which read as "no effect".
    rows = [[f"{v:.3f}", "7", "ab"[i % 2]] for i, v in enumerate(np.linspace(-1, 1, 12))]
    path = write_csv(tmp_path / "constant.csv", ["x", "same", "y"], rows)
    status, out, err = run(capsys, "fit", path, "--method", "laplace")
    row = next(line.split() for line in out.splitlines() if line.startswith("same "))
    assert status == 0 and row[1:3] == ["0.0000", "1.0000"]
    assert err == (
        f"vsbayes: warning: {path}: column 'same' is constant: the data say nothing of its "
        f"coefficient, whose posterior is the prior's (mean 0, sd √C); drop such columns.\n"
    )


def test_fit_counts_one_feature_in_the_singular(capsys, tmp_path):
    path = tmp_path / "one.csv"
    path.write_text("x,y\n0.5,1\n0.25,0\n0.75,1\n0.1,0\n0.3,1\n")
    status, out, _ = run(capsys, "fit", str(path), "--method", "laplace")
    assert status == 0 and "5 rows, 1 feature, standardized" in out


def test_a_round_off_mean_prints_as_zero_beside_its_sd():
    """A cell reads at the table's resolution against its row's sd: a mean of round-off
    beside an sd of order one is 0.0000 (it printed 2.764e-16, a number of its own); a
    small value whose row is as small keeps its digits in scientific form."""
    from vsbayes.cli.summary import format_number

    assert format_number(2.764e-16, scale=1.2) == "0.0000"
    assert format_number(-2.764e-16, scale=1.2) == "0.0000"
    assert format_number(-3e-5, scale=1e-3) == "0.0000"  # (a zero has no sign)
    assert format_number(2.764e-16) == "2.764e-16"
    assert format_number(3.2e-7, scale=1e-6) == "3.200e-07"
    assert format_number(0.25, scale=1.0) == "0.2500"


def test_fit_errors_name_the_command_lines_options(capsys, small_csv, monkeypatch):
    # The estimators' remedies name their parameters; a command-line user has the options.
    import vsbayes

    def refuse(*args):
        raise ValueError("too big: pass an explicit n_samples, or strategy='sites'.")

    monkeypatch.setattr(vsbayes.VSLogisticRegression, "fit", refuse)
    status, out, err = run(capsys, "fit", small_csv, "--target", "outcome")
    assert status == 1 and out == ""
    assert err == "vsbayes: error: too big: pass an explicit --n-samples, or --strategy sites.\n"


@pytest.mark.parametrize("command", ["fit", "compare"])
def test_json_to_standard_output_replaces_the_table(
    capsys, tmp_path, small_csv, command, monkeypatch
):
    # "--json -" is standard output, as Unix tools read it: the output is one JSON document
    # (a file named "-" was written before), the same as --json FILE writes.
    monkeypatch.chdir(tmp_path)
    argv = [command, small_csv, "--target", "outcome"]
    argv += ["--method", "laplace"] if command == "fit" else ["--budget", "0.05"]
    status, out, _ = run(capsys, *argv, "--json", "-")
    assert status == 0
    assert not (tmp_path / "-").exists()
    streamed = json.loads(out)
    status, table, _ = run(capsys, *argv, "--json", str(tmp_path / "out.json"))
    written = json.loads((tmp_path / "out.json").read_text())
    assert streamed.keys() == written.keys()
    assert not table.lstrip().startswith("{")


def test_remedies_name_the_method_options_not_the_estimator_classes(capsys, tmp_path):
    # BMC on 150 features cannot resolve its Gaussian: the library's remedy names the
    # classes to use ("Use VSLogisticRegression or EPLogisticRegression"), which the command
    # chooses by --method.
    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 150))
    path = tmp_path / "wide.csv"
    header = ",".join([f"x{i}" for i in range(150)] + ["y"])
    np.savetxt(path, np.column_stack([X, X[:, 0] > 0]), delimiter=",", header=header, comments="")
    status, _, err = run(capsys, "fit", str(path), "--method", "bmc")
    assert status == 1
    assert "Use --method vs or --method ep" in err
    assert "LogisticRegression" not in err and "ProbitRegression" not in err


def test_a_fallback_says_where_the_summary_shows_it_and_which_option_to_change(
    capsys, tmp_path, monkeypatch
):
    # A fit that fails on separable classes falls back to the Laplace approximation: the
    # library's warning said "(recorded in laplace_fallback_)" and "Use a smaller C or a
    # narrower prior (EmpiricalBayesClassifier chooses C by the evidence)", an attribute
    # and a class the command shows and offers as its "ran as" line and --C.
    import vsbayes.estimators._methods as methods
    from vsbayes.exceptions import EstimationError

    def fail(*args, **kwargs):
        raise EstimationError("EP failed.")

    monkeypatch.setattr(methods, "expectation_propagation", fail)
    # (More features than rows: separable, and held by the prior, not the likelihood.)
    X = np.random.default_rng(0).normal(size=(8, 12))
    path = tmp_path / "separable.csv"
    header = ",".join([f"x{i}" for i in range(12)] + ["y"])
    np.savetxt(path, np.column_stack([X, X[:, 0] > 0]), delimiter=",", header=header, comments="")
    status, out, err = run(capsys, "fit", str(path), "--method", "ep")
    assert status == 0 and "ran as:           the Laplace approximation" in out
    assert '(recorded in the summary\'s "ran as" line)' in err
    assert "Use a smaller --C (the log evidence this command prints compares" in err
    assert "laplace_fallback_" not in err and "EmpiricalBayesClassifier" not in err


def test_compare_says_more_points_as_its_budget():
    # compare's ladder sets each sampling fit's N, doubling it within --budget: a remedy of
    # "more points (n_samples; …)" is a larger --budget there (vsbayes fit's --n-samples).
    from types import SimpleNamespace

    from vsbayes.cli.methods import in_options
    from vsbayes.engine.variational_sampling import unreliable_message

    text = unreliable_message(SimpleNamespace(kl_error=0.5, n_samples=1000, ess=200.0), "")
    assert "more points (a larger --budget; the error" in in_options(text, "compare")
    assert "more points (--n-samples; the error" in in_options(text, "fit")
    assert "n_samples" not in in_options(text, "compare")
    # importance sampling's remedy names the typical N
    from vsbayes.engine.importance_sampling import _warn_about

    with pytest.warns(UserWarning) as caught:
        _warn_about(SimpleNamespace(ess=10.0, n_samples=100), 20)
    text = str(caught[0].message)
    assert "more points (a larger --budget; 8n = 160 is typical" in in_options(text, "compare")
    assert "more points (--n-samples; 8n = 160 is typical" in in_options(text, "fit")
