"""Command line: ``vsbayes fit`` (layer 7).

Until the Bayesian estimators land, ``vsbayes fit`` runs the engine on an embedded target —
the paper's Gaussian-mixture posterior — and compares variational sampling with importance
sampling and the Laplace approximation on the same draws.
"""

from __future__ import annotations

import argparse
import sys
import time

from ._version import __version__
from .engine import importance_sampling, laplace, n_family_params, variational_sampling
from .exceptions import EstimationError
from .gaussian import excess_kl
from .models import GaussianMixtureTarget

__all__ = ["main"]


def _fit_demo(args) -> int:
    target = GaussianMixtureTarget.paper(args.dim, args.delta, random_state=args.seed)
    truth = target.moment_matched()
    n_params = n_family_params(args.dim)
    n_samples = args.n_samples or 16 * n_params
    print(
        f"Target: mixture of 100 unit normals in d={args.dim}, delta={args.delta} "
        f"(paper, section 4.1); exact moments known.\n"
        f"Kernel: Laplace approximation; N={n_samples} draws (n={n_params} parameters).\n"
    )
    t0 = time.perf_counter()
    kernel = laplace(target, target.means.mean(axis=0), target.gradient, target.hessian)
    rows = [("Laplace", kernel, time.perf_counter() - t0, "")]
    runs = [
        ("VS", lambda: variational_sampling(target, kernel, n_samples, random_state=args.seed)),
        (
            "VS, 2 rounds",
            lambda: variational_sampling(
                target, kernel, n_samples, rounds=2, kernel_scale=1.5, random_state=args.seed
            ),
        ),
        ("IS", lambda: importance_sampling(target, kernel, n_samples, random_state=args.seed)),
    ]
    for name, run in runs:
        t0 = time.perf_counter()
        try:
            fit = run()
        except EstimationError as exc:
            print(f"{name}: failed: {exc}", file=sys.stderr)
            continue
        note = f"kl_error={fit.kl_error:.2e}" if hasattr(fit, "kl_error") else f"ESS={fit.ess:.0f}"
        rows.append((name, fit, time.perf_counter() - t0, note))
    print(f"{'method':<14}{'excess KL':>12}{'log Z':>10}{'time [ms]':>11}  diagnostics")
    for name, fit, seconds, note in rows:
        print(
            f"{name:<14}{excess_kl(truth, fit):>12.2e}{fit.log_Z:>10.4f}"
            f"{1e3 * seconds:>11.1f}  {note}"
        )
    print(f"{'exact':<14}{0.0:>12.2e}{truth.log_Z:>10.4f}")
    return 0


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vsbayes", description="Bayesian inference by variational sampling."
    )
    parser.add_argument("--version", action="version", version=f"vsbayes {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    fit = sub.add_parser("fit", help="fit the embedded demo target and compare methods")
    fit.add_argument("--dim", type=int, default=10, help="dimension (default 10)")
    fit.add_argument("--delta", type=float, default=2.0, help="non-Gaussianity (default 2)")
    fit.add_argument("--n-samples", type=int, default=None, help="draws (default 16 n)")
    fit.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    fit.set_defaults(handler=_fit_demo)
    return parser


def main(argv=None) -> int:
    """Entry point of the ``vsbayes`` command; returns the exit status."""
    args = _build_parser().parse_args(argv)
    if args.command == "fit" and (
        args.dim < 1 or (args.n_samples is not None and args.n_samples < 1)
    ):
        print("vsbayes: error: --dim and --n-samples must be positive", file=sys.stderr)
        return 2
    try:
        return args.handler(args)
    except (ValueError, EstimationError) as exc:
        print(f"vsbayes: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
