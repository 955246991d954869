"""Command line ``vsbayes`` (layer 7): ``fit`` and ``compare`` on a CSV file or embedded data.

``vsbayes fit`` fits one Bayesian GLM classifier and prints the posterior of every
coefficient; ``vsbayes compare`` measures every method against a reference posterior. Errors
are one line on stderr, ``vsbayes: error: …``, with exit status 2 for usage errors and 1
for data or fitting errors; warnings are one line each, ``vsbayes: warning: …``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from .._choices import SAMPLING_METHODS
from ._parser import build_parser

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``vsbayes`` command.

    Parameters
    ----------
    argv : sequence of str, optional
        Arguments without the program name; default ``sys.argv[1:]``.

    Returns
    -------
    int
        Exit status: 0 on success, 1 for data or fitting errors, 2 for usage errors.
    """
    try:
        # Known arguments first: an unknown option is then told against its command's
        # --help, not the top level's.
        args, unknown = build_parser().parse_known_args(argv)
    except SystemExit as exit_:  # usage errors, --help and --version
        return exit_.code if isinstance(exit_.code, int) else 2
    if unknown:
        return _usage_error(args.command, f"unrecognized arguments: {' '.join(unknown)}")
    # Option combinations argparse cannot check: usage errors too.
    if args.target is not None and args.data is None:
        return _usage_error(
            args.command, "--target needs a DATA file (the embedded data have their own)"
        )
    if args.no_header and args.data is None:
        return _usage_error(args.command, "--no-header needs a DATA file")
    if args.command == "fit" and args.method != "vs":
        given = [
            option
            for option, value in (
                ("--strategy", args.strategy != "auto"),
                ("--target-kl", args.target_kl is not None),
                ("--budget", args.budget is not None),
            )
            if value
        ]
        if given:  # refused rather than ignored: the fit would not be the one asked for
            verb = "is an option" if len(given) == 1 else "are options"
            return _usage_error("fit", f"{' and '.join(given)} {verb} of --method vs only")
    if args.command == "fit" and args.method not in SAMPLING_METHODS and args.n_samples != "auto":
        sampling = f"{', '.join(SAMPLING_METHODS[:-1])} and {SAMPLING_METHODS[-1]}"
        return _usage_error(
            "fit", f"--n-samples: --method {args.method} draws no points ({sampling} do)"
        )
    if args.command == "fit" and args.method == "vb" and args.link == "probit":
        return _usage_error(
            "fit",
            "argument --method: VB is logistic only (Jaakkola–Jordan bound); use --link logistic",
        )
    # The library only now: the answers above need none of it.
    from ..exceptions import EstimationError
    from .summary import Console

    console = Console(verbose=args.verbose)
    try:
        _check_outputs(args)
        if args.command == "fit":
            from .fit import run_fit as run
        else:
            from .compare import run_compare as run
        return run(args, console)
    except (ValueError, OSError, EstimationError, MemoryError) as error:
        print(f"vsbayes: error: {_one_line(error)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("vsbayes: error: interrupted", file=sys.stderr)
        return 130


def _check_outputs(args: argparse.Namespace) -> None:
    """The files --json and --plot will write, checked before the fit rather than after it
    (``args.plot`` becomes the name the plot is written to)."""
    from .plots import plot_file
    from .summary import STDOUT, check_output_path

    if args.plot:
        try:
            args.plot = plot_file(args.plot)
        except ValueError as error:
            if args.command == "compare" and args.data is None:
                # compare's --plot takes an optional name: it took the data file's.
                raise ValueError(
                    f"{error} (--plot takes an optional file name, so it took {args.plot}: "
                    f"put the data file first, vsbayes compare {args.plot} --plot)"
                ) from None
            raise
    data = args.data if args.data is not None and Path(args.data).is_file() else None
    outputs = [(option, path) for option, path in (("--json", args.json), ("--plot", args.plot))]
    outputs = [(option, path) for option, path in outputs if path and path != STDOUT]
    for option, path in outputs:
        check_output_path(path, option, data)
    if len(outputs) == 2 and Path(args.json).resolve() == Path(args.plot).resolve():
        raise ValueError(f"--json and --plot name the same file, {args.json}; name two files.")


def _usage_error(command: str, message: str) -> int:
    print(f"vsbayes: error: {message} (see vsbayes {command} --help)", file=sys.stderr)
    return 2


def _one_line(error: BaseException) -> str:
    """The error's message on one line (some library messages span several)."""
    return " ".join(str(error).split()) or type(error).__name__
