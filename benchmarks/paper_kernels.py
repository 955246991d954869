"""Which kernel for the sampling estimators: the paper's study run twice, EP's and Laplace's.

Reads the two runs of ``paper_reproduction.py`` made in the same conditions (one core each,
one BLAS thread, at the same time) and writes ``results/paper_kernels.{csv,md}``: per
dataset, model and budget, the median excess KL ÷ Laplace's of VS, IS and BMC drawing
through each kernel, the ratio, and EP-logistic alone for scale.

The runs::

    OPENBLAS_NUM_THREADS=1 taskset -c 0 python benchmarks/paper_reproduction.py --budgets 1 \\
        --repeats 20 --kernel ep --out benchmarks/results/paper_kernel_ep
    OPENBLAS_NUM_THREADS=1 taskset -c 1 python benchmarks/paper_reproduction.py --budgets 1 \\
        --repeats 20 --kernel laplace --out benchmarks/results/paper_kernel_laplace
    # then VS alone at 10 s (5 repeats), both kernels the same way:
    ... --budgets 1 10 --repeats 20 --repeats-long 5 --methods VS ...
"""

from __future__ import annotations

import csv

from _common import RESULTS, fmt, write_csv

KERNELS = ("ep", "laplace")
METHODS = ("VS", "IS", "BMC")


def load(kernel: str) -> dict:
    path = RESULTS / f"paper_kernel_{kernel}" / "paper_table.csv"
    with path.open() as fh:
        return {(r["dataset"], r["model"], float(r["budget_s"])): r for r in csv.DictReader(fh)}


def main() -> None:
    runs = {k: load(k) for k in KERNELS}
    rows = []
    for key in runs["ep"]:
        row = {"dataset": key[0], "model": key[1], "budget_s": key[2]}
        for method in METHODS:
            ep, laplace = (runs[k][key].get(method) or "" for k in KERNELS)
            row[f"{method}_ep"], row[f"{method}_laplace"] = ep, laplace
            row[f"{method}_gain"] = float(laplace) / float(ep) if ep and laplace else ""
        row["EP-logistic"] = runs["ep"][key].get("EP-logistic", "")
        rows.append(row)
    write_csv(RESULTS / "paper_kernels.csv", rows)
    lines = [
        "# Sampling kernel: EP's posterior against the Laplace approximation",
        "",
        "The paper's study (`paper_reproduction.py`, four UCI data sets, C = 1e5, importance-"
        "sampling ground truths) run twice in the same conditions — one core and one BLAS "
        "thread each, at the same time — with the sampling methods drawing through the EP "
        "posterior or the Laplace approximation. Median excess KL ÷ Laplace's over 20 repeats "
        "(1 s) or 5 (10 s, VS only); `gain` = Laplace kernel's error ÷ EP kernel's. The EP fit "
        "counts in each method's time.",
        "",
        "| dataset | model | budget | VS: EP kernel | VS: Laplace kernel | gain | IS: EP | IS: "
        "Laplace | gain | BMC: EP | BMC: Laplace | gain | EP-logistic alone |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cells = [r["dataset"], r["model"], f"{r['budget_s']:g} s"]
        for method in METHODS:
            cells += [fmt_or_dash(r[f"{method}_ep"]), fmt_or_dash(r[f"{method}_laplace"])]
            cells += [fmt_or_dash(r[f"{method}_gain"])]
        cells.append(fmt_or_dash(r["EP-logistic"]))
        lines.append("| " + " | ".join(cells) + " |")
    (RESULTS / "paper_kernels.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def fmt_or_dash(value) -> str:
    return fmt(float(value)) if value not in ("", None) else "—"


if __name__ == "__main__":
    main()
