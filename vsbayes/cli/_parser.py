"""The parser of the ``vsbayes`` command, on the standard library alone.

The command parses its arguments before it imports the library, so that ``--help``,
``--version`` and usage errors answer at once rather than after numpy, SciPy and
scikit-learn have loaded (over a second): this module, and what it imports, must not
import them (tests/test_cli.py checks it in a fresh interpreter).
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import NoReturn

from .._choices import LINKS, METHODS, VS_STRATEGIES
from .._version import __version__

__all__ = ["EXAMPLES", "Parser", "build_parser"]


class _HelpFormatter(argparse.HelpFormatter):
    """argparse's wrapping, except for text laid out in lines (the examples)."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" in text:
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


#: The examples of each command's --help (tests/test_cli.py runs them as written).
EXAMPLES = {
    "vsbayes": """examples:
  vsbayes fit                        # the posterior on the bundled breast-cancer data
  vsbayes fit data.csv --target y    # on your data; label column y
  vsbayes fit --help                 # every option of a command""",
    "fit": """examples:
  vsbayes fit                                  # breast-cancer data, variational sampling
  vsbayes fit data.csv --target y              # your data: label column y
  vsbayes fit data.csv --method ep --link probit --json fit.json
  vsbayes fit data.csv --strategy global --target-kl 0.01 --plot fit.png
  vsbayes fit uci.data --no-header --target 2  # no header row: columns numbered from 1""",
    "compare": """examples:
  vsbayes compare --budget 0.5                  # breast-cancer data
  vsbayes compare data.csv --target y --plot    # plot to vsbayes_compare.png
  vsbayes compare data.csv --link probit --json compare.json""",
}


class Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line, ``vsbayes: error: …``.

    argparse's default prints the whole usage first; a single line is easier to read in
    scripts and logs, and ``--help`` still shows the usage.
    """

    def error(self, message: str) -> NoReturn:
        print(f"vsbayes: error: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive finite number, got {text!r}")
    return value


def _n_samples(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'auto' or an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text!r}")
    return value


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a non-negative integer, got {text!r}")
    return value


_PROGRESS = "show progress on stderr (shown anyway when stderr is a terminal)"


def _add_common(parser: argparse.ArgumentParser, verbose_help: str = _PROGRESS) -> None:
    """Data and model options shared by the subcommands."""
    parser.add_argument(
        "data",
        nargs="?",
        metavar="DATA.csv",
        help="CSV file with a header row (or see --no-header); numeric features "
        "(standardized before fitting) and a label column. Default: scikit-learn's bundled "
        "breast-cancer data.",
    )
    parser.add_argument(
        "--target",
        metavar="COL",
        help="name of the label column, or its number from 1 with --no-header (default: the "
        "last column)",
    )
    parser.add_argument(
        "--no-header",
        action="store_true",
        help="the file has no header row: every row is data, the columns are numbered 1, 2, …",
    )
    parser.add_argument("--link", choices=LINKS, default="logistic", help="default: logistic")
    parser.add_argument(
        "--C",
        type=_positive_float,
        default=1.0,
        metavar="C",
        help="prior variance of the coefficients, N(0, C I) (default: 1.0)",
    )
    parser.add_argument("--seed", type=_seed, default=0, help="random seed (default: 0)")
    parser.add_argument(
        "--json",
        metavar="OUT",
        help="also write the summary as JSON to OUT (replaced if it exists); "
        "'-' prints the JSON in place of the table",
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help=verbose_help,
    )


def build_parser() -> Parser:
    """The parser of ``vsbayes``, ``vsbayes fit`` and ``vsbayes compare``."""
    parser = Parser(
        prog="vsbayes",
        description="Bayesian logistic and probit regression by variational sampling.",
        epilog=EXAMPLES["vsbayes"],
        formatter_class=_HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"vsbayes {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{fit,compare}")

    fit = sub.add_parser(
        "fit",
        help="fit one method and print the posterior of every coefficient",
        description="Fit a Bayesian GLM classifier and print the posterior mean, sd, 95% "
        "interval and probability of the sign of every coefficient, which computation ran "
        "and how accurate it is, and the log evidence. More than two classes: the "
        "multinomial posterior with the logistic link (vs, laplace, is, ep), else one "
        "binary posterior per class (one-vs-rest).",
        epilog=EXAMPLES["fit"],
        formatter_class=_HelpFormatter,
    )
    _add_common(
        fit,
        verbose_help="also print the method's settings, diagnostics and route details, and "
        + _PROGRESS,
    )
    fit.add_argument(
        "--method",
        choices=METHODS,
        default="vs",
        help="vs: variational sampling (default), laplace, is: importance sampling, "
        "bmc: Bayesian Monte Carlo, ep: expectation propagation, vb: variational Bayes "
        "(logistic only)",
    )
    fit.add_argument(
        "--n-samples",
        type=_n_samples,
        default="auto",
        metavar="N",
        help="posterior evaluations of vs, is and bmc: 'auto' (default) or an integer",
    )
    fit.add_argument(
        "--strategy",
        choices=VS_STRATEGIES,
        default="auto",
        help="vs only: one global fit, VS site fits inside expectation propagation, or "
        "chosen per problem (auto, default)",
    )
    fit.add_argument(
        "--target-kl",
        type=_positive_float,
        metavar="NATS",
        help="vs only: add points to the global fit until its predicted error (excess KL, "
        "nats) meets this",
    )
    fit.add_argument(
        "--budget",
        type=_positive_float,
        metavar="SECONDS",
        help="vs only: add points to the global fit only while the fit is predicted to end "
        "within this many seconds",
    )
    fit.add_argument(
        "--plot",
        metavar="OUT.png",
        help="also write a forest plot of the coefficients' intervals (at most 60: those "
        "farthest from 0 in sds) and a calibration plot of the predicted probabilities to "
        "OUT.png (replaced if it exists; needs matplotlib)",
    )

    compare = sub.add_parser(
        "compare",
        help="every method against the strongest reference: excess KL and time",
        description="Fit every method on a binary problem and measure its excess KL to a "
        "reference posterior (expectation propagation reweighted to the exact posterior by "
        "importance sampling); print a table, and with --plot draw error against time.",
        epilog=EXAMPLES["compare"],
        formatter_class=_HelpFormatter,
    )
    _add_common(compare)
    compare.add_argument(
        "--budget",
        type=_positive_float,
        default=2.0,
        metavar="SECONDS",
        help="vs, is and bmc double N while the next fit is predicted to take at most this "
        "many seconds (default: 2). It bounds the sampling methods' fits, not the reference "
        "(EP and its importance draws: their work is planned before they start, and refused "
        "beyond a fixed limit, with the remedy) nor the single fits of the other methods",
    )
    compare.add_argument(
        "--plot",
        nargs="?",
        const="vsbayes_compare.png",
        metavar="OUT.png",
        help="also plot error against time to OUT.png (default name: vsbayes_compare.png; "
        "replaced if it exists; needs matplotlib)",
    )
    return parser
