"""The methods whose posterior is estimated from points drawn through a Gaussian kernel.

Importance sampling and Bayesian Monte Carlo, and the base they share with variational
sampling (``_strategy.py``): the number of points, the memory guard, the kernel — the
expectation-propagation posterior (default) or the Laplace one — and the engine's call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from numbers import Integral, Real
from typing import ClassVar

from .._memory import check_memory, format_bytes, memory_limit
from .._progress import mapped_states
from .._warnings import catch
from ..engine import bayesian_monte_carlo, importance_sampling, n_family_params
from ..engine.bayesian_monte_carlo import MAX_BMC_SAMPLES
from ..engine.sample_pool import pool_bytes
from ..exceptions import ConvergenceWarning, EstimationError, MemoryLimitError
from ..gaussian import Gaussian
from ..models.softmax_contrasts import ContrastPosterior
from ..models.work import expected_ep_work, likelihood_point_work, sampled_dim
from ._base import Interval
from ._methods import SOFTMAX_MODELS, MethodFit, ep_posterior, rows_in_memory, softmax_ep_posterior

__all__ = [
    "EP_WORK_RATIO",
    "KERNELS",
    "ROUNDS_CONSTRAINTS",
    "SAMPLING_CONSTRAINTS",
    "SAMPLING_WORK_LIMIT",
    "BMCMethod",
    "ISMethod",
    "SamplingMethod",
    "most_points",
]

#: Sampling kernels: the expectation-propagation posterior or the Laplace approximation.
KERNELS = ("ep", "laplace")

#: The parameters every sampling estimator has (see ``BayesianGLMClassifier._constraints``).
SAMPLING_CONSTRAINTS = {
    "n_samples": ("auto", Interval(Integral, 1)),
    "kernel": KERNELS,
    "rule": ("mc", "qmc"),
}
#: The parameters of the adaptive rounds (IS and VS).
ROUNDS_CONSTRAINTS = {
    "rounds": (Interval(Integral, 1),),
    "kernel_scale": (Interval(Real, 0, closed="neither"),),
}


EP_WORK_RATIO = 8.0
# The most work n_samples="auto" of importance sampling and BMC plans before drawing: the
# larger of SAMPLING_WORK_LIMIT and, for a binary posterior, EP_WORK_RATIO times EP's
# expected work (the bound VS's strategy puts on its global fit against EP, the route the
# refusal names; with many rows it is the larger, and IS's default fits there stay at 8n).
# At ~1e10 multiply-adds a second (IS, 100 rows × 500 features, one BLAS thread, 2 loaded
# cores) SAMPLING_WORK_LIMIT is ~6 s; the default fits of up to 1000 rows × 200 features
# and 10⁴ × 100 stay at 8n (docs/decisions.md D-125).
SAMPLING_WORK_LIMIT = 6e10


def most_points(fits: Callable[[int], bool], upper: int) -> int:
    """The largest N ≤ ``upper`` for which ``fits(N)`` (monotone: true up to some N), 0 if
    none; by bisection, without drawing anything."""
    if fits(upper):
        return upper
    low, high = 0, upper  # fits(low) or low == 0; not fits(high)
    while high - low > 1:
        middle = (low + high) // 2
        if fits(middle):
            low = middle
        else:
            high = middle
    return low


@dataclass(frozen=True, kw_only=True)
class SamplingMethod:
    """A method that fits the posterior from points drawn through a Gaussian kernel.

    A subclass sets ``engine`` — a fitter called as ``engine(log_target, kernel,
    n_samples, rule=..., random_state=..., **options)`` — and ``engine_options``.
    ``n_samples="auto"`` means ``max(auto_factor · n, auto_minimum)`` with n the
    parameter count of the Gaussian family the points determine.
    """

    n_samples: int | str
    kernel: str
    rule: str
    tol: float
    family: str = "gaussian"
    #: Named in the memory guard's message.
    estimator_name: str = ""

    falls_back: ClassVar[bool] = True
    records_strategy: ClassVar[bool] = False
    #: (See _methods.LaplaceMethod's.) The tilted moments: the exact posterior's, which
    #: the sampling fits estimate (as VS's); their fit of one row under a vague prior
    #: missed them by several posterior sds, and a stream carried the error.
    one_row: ClassVar[str | None] = "moments"
    #: Whether it fits a multinomial posterior under a shrinkage prior: not by drawing the
    #: contrasts alone (D-091), whose posterior is then not separate from the shift's.
    multinomial_shrinkage: ClassVar[bool] = False
    engine: ClassVar[Callable]
    #: The most points the engine takes (None: no cap).
    point_cap: ClassVar[int | None] = None
    auto_factor: ClassVar[int] = 8
    auto_minimum: ClassVar[int] = 256
    #: The engine's options for the multinomial posterior's contrasts (see ``draw``).
    contrast_options: ClassVar[tuple[tuple[str, object], ...]] = ()
    #: Whether the contrasts' target takes the float32 likelihood pass where the rows are
    #: in memory (``ContrastPosterior(single=True)``, D-165).
    single_likelihood: ClassVar[bool] = False
    #: p × p matrices a binary fit holds at its peak beside its sample points (see
    #: LaplaceMethod's; VS's default route measured 9.1 p² at 2000 × 1000 sparse).
    peak_covariances: ClassVar[float] = 10.0

    def fit(self, model, laplace, rng) -> MethodFit:
        """The engine's fit from the kernel: EP's posterior (the multinomial EP for the
        multinomial posterior) or Laplace's."""
        n_samples = self.auto_samples(model)
        self.check_memory(model, n_samples)
        # The multinomial EP as the kernel (measured against NUTS at C = 1, VS's global
        # fit: KL over Laplace's 0.020-0.023 on iris from 0.022-0.030 with the Laplace
        # kernel, 0.014-0.016 on wine from 0.044-0.105; three seeds).
        ep_fit = softmax_ep_posterior if isinstance(model, SOFTMAX_MODELS) else None
        kernel = self.sampling_kernel(model, laplace, ep_fit)
        posterior = self.draw(
            model, kernel, rng, n_samples, **self.engine_options(model.dim, n_samples)
        )
        return MethodFit(posterior, getattr(posterior, "n_iter", laplace.n_iter))

    def engine_options(self, dim: int, n_samples: int) -> dict:
        """Keyword arguments of the engine specific to the method, for a fit of ``dim``
        parameters from ``n_samples`` points."""
        return {}

    def total_samples(self, dim: int) -> int:
        """The number of points of a fit of ``dim`` parameters."""
        if isinstance(self.n_samples, str):
            n = n_family_params(dim, self.family)
            return max(self.auto_factor * n, self.auto_minimum)
        return int(self.n_samples)

    def planned_work(self, model, n_samples: int) -> float:
        """Multiply-adds of a fit from ``n_samples`` points: the log-density at each, and
        per point its draw through the kernel's factor and its share of the weighted
        second moments (d² each, d the sampled dimension)."""
        dim = sampled_dim(model)
        return n_samples * (likelihood_point_work(model) + 2.0 * dim * dim)

    def work_limit(self, model) -> float:
        """The most multiply-adds "auto" plans (see SAMPLING_WORK_LIMIT)."""
        if isinstance(model, SOFTMAX_MODELS):
            return SAMPLING_WORK_LIMIT
        return max(SAMPLING_WORK_LIMIT, EP_WORK_RATIO * expected_ep_work(model))

    def reliable_minimum(self, model) -> int:
        """The fewest points at which "auto" runs: n, the parameters of the Gaussian the
        points determine (over the sampled dimensions). Below it BMC's GP cannot resolve
        the posterior (measured: 5000 × 2000 sparse, 53 s and 5.8 GB for a fit 800
        standard errors off), and importance sampling's moments, even with ideal weights
        (effective sample size N), miss by 0.7-1.3 nats at N = n (a Gaussian's n
        parameters from N points); both engines refuse an explicit N below n too, and
        importance sampling an effective sample size below n (docs/decisions.md D-159)."""
        return n_family_params(sampled_dim(model), self.family)

    def auto_samples(self, model) -> int:
        """N of the fit, sized before any work: an explicit ``n_samples`` as given (only
        memory-checked); "auto" its rule (:meth:`total_samples`) unless that exceeds
        :data:`SAMPLING_WORK_LIMIT` or the memory limit, then as many points as fit within
        both. Raise ValueError (MemoryLimitError where memory binds) if those are fewer
        than :meth:`reliable_minimum`: the fit would be discarded after its work."""
        wanted = self.total_samples(model.dim)
        if not isinstance(self.n_samples, str):
            return wanted
        memory, work = memory_limit(), self.work_limit(model)
        within_work = most_points(lambda n: self.planned_work(model, n) <= work, wanted)
        within_memory = most_points(lambda n: self.planned_bytes(model.dim, n) <= memory, wanted)
        n_samples = min(wanted, within_work, within_memory)
        needed = self.reliable_minimum(model)
        if n_samples >= needed:
            return n_samples
        rule = SamplingMethod.total_samples(self, model.dim)  # before any cap of the method
        limits = [
            f"within the work limit of 'auto' ({work:.3g} multiply-adds) {within_work}",
            f"within the memory limit ({format_bytes(memory)}) {within_memory}",
        ]
        if self.point_cap is not None:
            limits.append(f"and {self.point_cap} at most (the method's own limit)")
        method = self.estimator_name or type(self).__name__
        family = method.removeprefix("IS").removeprefix("BMC")
        memory_binds = within_memory < min(wanted, within_work)
        error = MemoryLimitError if memory_binds else ValueError
        raise error(
            f"{method} with n_samples='auto': its rule asks for N={rule} points "
            f"({self.auto_factor}n, n = {n_family_params(model.dim, self.family)}) for "
            f"{model.dim} parameters and "
            f"{model.n_observations} rows: {self.planned_work(model, rule):.3g} multiply-adds "
            f"and {format_bytes(self.planned_bytes(model.dim, rule))}. Points that fit: "
            f"{', '.join(limits)}: fewer than the n = {needed} parameters of the Gaussian they "
            f"would determine ({sampled_dim(model)} sampled dimensions), too few to resolve "
            f"it. Nothing was drawn. Use VS{family} or "
            f"EP{family}, which hold for any number of features, fewer features, or an "
            f"explicit n_samples (checked only against memory)."
        )

    def planned_bytes(self, dim: int, n_samples: int) -> float:
        """Bytes the sampling fit holds at once (the engine's :func:`pool_bytes`)."""
        return pool_bytes(n_samples, dim)

    def check_memory(self, model, n_samples: int) -> None:
        """Raise MemoryLimitError now, before any fit, if the points would not fit."""
        check_memory(
            self.planned_bytes(model.dim, n_samples),
            f"the {n_samples} sample points over {model.dim} parameters of {self.estimator_name}",
            f"Use fewer samples (n_samples; 'auto' is 8n with n = (p+1)(p+2)/2 for p "
            f"parameters), fewer features, or the expectation-propagation estimators, which "
            f"need no points in the parameter space ({format_bytes(8 * model.dim**2)} per "
            f"covariance).",
        )

    def sampling_kernel(self, model, laplace, ep_fit=None):
        """The kernel: EP's posterior (``ep_fit``: the binary EP, or the multinomial one;
        to the fit's tolerance, so that results are reproducible to it, e.g. weights ≡
        duplicated rows — but VS's multinomial global fit takes ``softmax_ep_kernel``, see
        there), or Laplace's if EP fails or does not converge (an unconverged EP
        can sit far from the posterior: sampling from it measured a prior-like fit with
        sample weights of 1e3 and 1e-4); Laplace's for the multinomial posterior of rows in
        dask chunks."""
        if self.kernel == "laplace" or (ep_fit is not None and not rows_in_memory(model)):
            return laplace  # the multinomial EP over dask chunks is not implemented
        ep_fit = ep_posterior if ep_fit is None else ep_fit
        try:
            with catch(("ignore", ConvergenceWarning)):
                ep = ep_fit(model, laplace, tol=self.tol)
        except EstimationError:
            return laplace
        return ep if ep.converged else laplace

    def draw(self, model, kernel, rng, n_samples: int, **options):
        """The engine's fit of ``n_samples`` points from ``kernel``, with ``options``; the
        multinomial posterior's in its contrasts (the kernel's marginal there), mapped back
        with the shift directions' exact conditional (:class:`ContrastPosterior`)."""
        self.check_memory(model, n_samples)
        if isinstance(model, SOFTMAX_MODELS):
            single = self.single_likelihood and rows_in_memory(model)
            contrasts = ContrastPosterior(model, single=single)

            def lifted(state):  # a round's state, as callbacks see the coefficients'
                if isinstance(state, tuple):  # (mean, cov): no evidence
                    gaussian = contrasts.lift(Gaussian(*state))
                    return gaussian.mean, gaussian.cov
                return contrasts.lift(state)

            with mapped_states(lifted):
                fit = self.engine(
                    contrasts.log_density,
                    contrasts.reduce(kernel),
                    n_samples,
                    rule=self.rule,
                    random_state=rng,
                    **options,
                    **dict(self.contrast_options),
                )
            return contrasts.lift(fit)
        return self.engine(
            model.log_density, kernel, n_samples, rule=self.rule, random_state=rng, **options
        )


@dataclass(frozen=True, kw_only=True)
class ISMethod(SamplingMethod):
    """Self-normalized importance sampling in adaptive rounds."""

    rounds: int
    kernel_scale: float

    engine: ClassVar[Callable] = staticmethod(importance_sampling)

    def engine_options(self, dim: int, n_samples: int) -> dict:
        return {"rounds": self.rounds, "kernel_scale": self.kernel_scale}


@dataclass(frozen=True, kw_only=True)
class BMCMethod(SamplingMethod):
    """Bayesian Monte Carlo: a Gaussian process over the ratio posterior / kernel."""

    length_scale: float

    engine: ClassVar[Callable] = staticmethod(bayesian_monte_carlo)
    point_cap: ClassVar[int | None] = MAX_BMC_SAMPLES

    def engine_options(self, dim: int, n_samples: int) -> dict:
        return {"length_scale": self.length_scale}

    def planned_bytes(self, dim: int, n_samples: int) -> float:
        # The Gaussian-process solve holds a few N × N matrices.
        return super().planned_bytes(dim, n_samples) + 24.0 * n_samples**2

    def planned_work(self, model, n_samples: int) -> float:
        """The points' work (:meth:`SamplingMethod.planned_work`) and the Gaussian process's
        solve: the Gram matrix of the points (N² d multiply-adds, d the sampled dimension)
        and its Cholesky factor (N³/6). Beyond a few thousand points the solve is most of
        the fit: left out, "auto" took the cap's 16384 points from 36 features on, a
        ~100 s factorization per problem (docs/decisions.md D-211)."""
        n = float(n_samples)
        solve = n * n * sampled_dim(model) + n**3 / 6.0
        return super().planned_work(model, n_samples) + solve

    def total_samples(self, dim: int) -> int:
        # The GP stores an N×N matrix: "auto" stops at the engine's limit (its O(N²) memory
        # at 16384 points; the O(N³) solve's time is planned_work's).
        total = super().total_samples(dim)
        if not isinstance(self.n_samples, str):
            return total
        return min(total, self.point_cap)
