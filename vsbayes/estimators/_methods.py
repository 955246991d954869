"""The posterior methods the estimators hand their models to: Laplace, EP, VB.

An estimator builds the likelihood model of a problem and its Laplace approximation, then
calls its method object's ``fit(model, laplace, rng)``, which returns a :class:`MethodFit`:
the posterior with its record. A method object is a frozen dataclass of the estimator's
options of the same names, made afresh by each ``fit``, so that whatever a method keeps
while it runs lives in its own calls, never on the estimator. The sampling methods (IS,
BMC) are in ``_sampling.py``, variational sampling with its choice of strategy in
``_strategy.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from ..approximations import expectation_propagation, jaakkola_jordan, softmax_ep
from ..approximations.expectation_propagation import DEFAULT_DAMPING
from ..approximations.softmax_ep import softmax_ep_cost
from ..approximations.softmax_prior_sites import softmax_ep_with_prior_sites as prior_sites_ep
from ..engine import LaplaceResult
from ..gaussian import Gaussian
from ..models import ChunkedSoftmaxPosterior, SoftmaxGLMPosterior
from ..models.softmax import MANY_CLASSES
from ..models.work import LAPLACE_SHRINKAGE_STEPS

__all__ = [
    "SOFTMAX_MODELS",
    "EPMethod",
    "LaplaceMethod",
    "MethodFit",
    "VBMethod",
    "ep_posterior",
    "rows_in_memory",
    "softmax_ep_kernel",
    "softmax_ep_posterior",
]

#: The models of the multinomial posterior (any other is one binary problem).
SOFTMAX_MODELS = (SoftmaxGLMPosterior, ChunkedSoftmaxPosterior)

#: Smallest site change at which the multinomial EP stops. Below it the sweep's own
#: round-off moves the sites: a site is the difference of the inverses of a tilted fit's
#: and a latent marginal's covariances, whose variances reach 2·10³ on digits, so the
#: fits' round-off is amplified to ~1e-9; there, mixed sweeps wandered (5.8e-10 after 43
#: sweeps, 2e-6 at 61) until damping was halved twice (5e-11 at 76 sweeps; 1e-8 at 37).
SOFTMAX_EP_MIN_TOL = 1e-8
#: Largest site change at which it stops, whatever the estimator's ``tol``.
SOFTMAX_EP_MAX_TOL = 1e-3
#: Multiply-adds of a sweep (``softmax_ep_cost``) below which the multinomial EP runs to
#: ``tol / 100`` instead of ``√tol``: ~10 ms a sweep (iris and wine: 4·10⁶ and 5·10⁶),
#: where the further sweeps cost little, and the fit on integer weights then equals the
#: fit on the duplicated rows to round-off (scikit-learn's ``check_sample_weight_equivalence``,
#: rtol 1e-7, on 15 rows and their up to 75 copies; at √tol the two EPs stop 1e-4 apart,
#: each within √tol of the fixed point).
SOFTMAX_EP_SMALL_SWEEP = 1e7
#: Where the multinomial EP stops at ``√tol``, it also stops once one undamped sweep moves
#: the posterior by at most this many nats (KL, ``tol · 10³`` if less): at most a tenth of
#: the error the sites' quadrature leaves EP's fixed point with (1.4-5.3·10⁻⁴ nats at 20-26
#: classes, against 8192 nodes a row), where the site change (1-3·10⁻⁴ relative) still
#: asked for a fifth sweep at 20-30 classes (D-080 in docs/decisions.md).
SOFTMAX_EP_POSTERIOR_TOL = 1e-5
#: From :data:`~vsbayes.models.softmax.MANY_CLASSES` classes on, that stop times this
#: factor (5·10⁻⁵ nats at the default tol): their quadrature leaves EP's fixed point
#: 5.0-9.8·10⁻⁴ nats from its exact one on 8192 nodes a row (the coarse narrow rows,
#: D-081), and the returned posterior, the damped sweep's, is a few 10⁻⁶ nats from the one
#: at tol = 10⁻⁸ where one undamped sweep moves it by 5·10⁻⁵ (D-097 in docs/decisions.md).
SOFTMAX_EP_MANY_POSTERIOR_FACTOR = 5.0
#: Where the multinomial EP stops at ``√tol``, it also stops once one undamped sweep moves
#: the posterior by at most this share of its KL divergence from the start (Laplace's),
#: where that is more than the stop above (``tol · 10⁴`` if less). KL(Laplace ‖ EP) is how
#: far the posterior is from a Gaussian at its mode, and EP's own error against exact
#: references has been at least 0.027 of Laplace's on every set measured (iris 0.092,
#: wine 0.027, 20 classes 0.070), Laplace's being about KL(Laplace ‖ EP): a sweep moving
#: the posterior by 10⁻⁴ of it is at most 1/270 of EP's error, and the damped candidate
#: returned is a tenth of that from EP's fixed point (D-102 in docs/decisions.md). Only
#: far-from-Gaussian posteriors reach past the stop above (digits: 154 nats, a stop of
#: 0.015 nats; 20 classes × 10 × 2000 rows: 0.03 nats, 3·10⁻⁶).
SOFTMAX_EP_POSTERIOR_SHARE = 1e-4
#: Site change at which the multinomial EP stops where it is only the kernel of VS's global
#: fit (``softmax_ep_kernel``), whatever the estimator's ``tol``: the global fit needs a
#: kernel near the posterior, not EP's fixed point to round-off. Measured on wine (178
#: rows, 3 classes): 8 sweeps instead of 18 (the stop at ``tol / 100``), the kernel within
#: 9·10⁻⁶ nats of the fixed point (EP's own error against NUTS: 0.11 nats), and the global
#: fit from it the same in distribution over 10 seeds (KL to the NUTS reference, interval
#: endpoints, largest probability gap: equal to three digits).
SOFTMAX_EP_KERNEL_TOL = 1e-3


@dataclass(frozen=True)
class MethodFit:
    """What a method object returns for one problem.

    Attributes
    ----------
    posterior : Gaussian
        The posterior, with the method's diagnostics.
    n_iter : int
        The iterations reported in ``n_iter_``.
    fell_back : bool
        Whether the posterior is the Laplace approximation because the method failed.
    strategy, reason : str or None
        The route taken and why (variational sampling: ``strategy_``,
        ``strategy_reason_``); None for the methods without routes.
    kl_error, stop_reason : float or str or None
        The predicted error and why the route stopped where the posterior itself does not
        carry them (a route that stopped at the Laplace approximation or at EP); None: the
        posterior's own (``kl_error_``, ``stop_reason_``).
    covariance, covariance_reason : str
        The posterior covariance's structure ("dense", or a structured one: "dual",
        "lowrank", "diagonal") and why (``covariance_structure_``, ``covariance_reason_``).
    """

    posterior: Gaussian
    n_iter: int
    fell_back: bool = False
    strategy: str | None = None
    reason: str | None = None
    kl_error: float | None = None
    stop_reason: str | None = None
    covariance: str = "dense"
    covariance_reason: str = ""

    @classmethod
    def fallback(cls, laplace: LaplaceResult, reason: str | None = None) -> MethodFit:
        """The Laplace approximation in place of a failed fit (``reason``: why, where the
        method knows it; else the warning says)."""
        return cls(laplace, laplace.n_iter, True, "laplace", reason or _FAILED)

    @classmethod
    def unconverged(cls, laplace: LaplaceResult) -> MethodFit:
        """The Laplace approximation at Newton's last iterate, where Newton's method for
        the mode did not converge within ``max_iter`` (the method is not run)."""
        reason = f"Newton's method did not converge in {laplace.n_iter} iterations"
        return cls(laplace, laplace.n_iter, False, "laplace", reason)

    @classmethod
    def prior(cls, prior: Gaussian) -> MethodFit:
        """The prior itself, where no iteration was allowed (``max_iter=0``)."""
        return cls(prior, 0, False, "prior", "max_iter=0: no iteration, the prior")


_FAILED = "the chosen fit failed; see laplace_fallback_"


def rows_in_memory(model) -> bool:
    """Whether the model holds its rows (else they are in dask chunks, on the workers)."""
    return getattr(model, "rows_in_memory", True)


def ep_posterior(
    model, laplace, *, tol: float, damping: float = DEFAULT_DAMPING, max_iter: int = 200
):
    """EP posterior (VS site fits; probit in closed form) started from the Laplace sites.

    ``tol`` is the estimator's: damped sweeps stop about the last change away from the
    fixed point, and a hundredth of it keeps results reproducible to about ``tol`` (e.g.
    weights ≡ duplicated rows).
    """
    return expectation_propagation(
        model, damping=damping, tol=1e-2 * tol, max_iter=max_iter, start=laplace.mean
    )


def softmax_ep_posterior(
    model,
    laplace,
    *,
    tol: float,
    damping: float = DEFAULT_DAMPING,
    max_iter: int = 200,
    verbose: int = 0,
):
    """Multinomial EP (tilted moments of the (K − 1)-dimensional sites) from the Laplace
    sites.

    ``tol`` is the estimator's; the sweeps stop at relative site changes of ``√tol``
    (10⁻⁴ at the default 10⁻⁸), within [:data:`SOFTMAX_EP_MIN_TOL`,
    :data:`SOFTMAX_EP_MAX_TOL`] (``tol / 100`` where a sweep is cheap: see
    :data:`SOFTMAX_EP_SMALL_SWEEP`). Sites within δ of their fixed point put the posterior
    about δ² (in KL) from EP's, so that ``tol`` bounds that; the sites' quadrature itself
    leaves EP 10⁻⁵-10⁻³ nats from its exact fixed point, and further sweeps only refine the
    quadrature's own fixed point (measured on iris, wine, 20 classes and 2000 rows of 3 to
    20 classes: the posteriors at 10⁻⁴ and 10⁻⁸ within 6·10⁻⁷ nats of each other, in about
    half the sweeps). There it also stops where one sweep moves the posterior by at most
    :data:`SOFTMAX_EP_POSTERIOR_TOL` nats, or by at most
    :data:`SOFTMAX_EP_POSTERIOR_SHARE` of its KL divergence from Laplace's where that is
    more (far-from-Gaussian posteriors, whose EP error is large). ``verbose`` ≥ 1 prints
    the route, its size and one line per sweep.
    """
    _, sweep_work = softmax_ep_cost(model)
    small = sweep_work < SOFTMAX_EP_SMALL_SWEEP
    stop = 1e-2 * tol if small else math.sqrt(tol)
    posterior_tol = posterior_share = None
    if not small:
        posterior_tol = min(SOFTMAX_EP_POSTERIOR_TOL, 1e3 * tol)
        if model.n_classes >= MANY_CLASSES:
            posterior_tol *= SOFTMAX_EP_MANY_POSTERIOR_FACTOR
        posterior_share = min(SOFTMAX_EP_POSTERIOR_SHARE, 1e4 * tol)
    # Under a shrinkage prior, its sites (one per coefficient) alternate with the rows'.
    fit = softmax_ep if getattr(model, "coefficient_prior", None) is None else prior_sites_ep
    return fit(
        model,
        damping=damping,
        tol=min(max(stop, SOFTMAX_EP_MIN_TOL), SOFTMAX_EP_MAX_TOL),
        max_iter=max_iter,
        start=laplace.mean,
        verbose=verbose,
        posterior_tol=posterior_tol,
        posterior_share=posterior_share,
    )


def softmax_ep_kernel(model, laplace, *, tol: float, damping: float = DEFAULT_DAMPING):
    """The multinomial EP as the kernel of VS's global fit: as :func:`softmax_ep_posterior`,
    but stopped at a relative site change of :data:`SOFTMAX_EP_KERNEL_TOL` (``tol``, the
    estimator's, is not used: the kernel's distance from EP's fixed point, ~10⁻⁵ nats,
    moves the fit far less than its own Monte Carlo error). The fit on integer weights
    then equals the fit on the duplicated rows to ~3·10⁻⁵ relative (wine: 6·10⁻⁵ posterior
    sd) instead of round-off: the two kernels stop apart. Importance sampling keeps EP to
    the fit's tolerance: its weights take the kernel as it is, and scikit-learn's
    ``check_sample_weight_equivalence`` (rtol 10⁻⁷) measured 9·10⁻⁷ from this kernel.
    Its rows' tilted moments start on the rule's coarsest level whatever their cavities'
    width (``spread_levels=False``): a quarter to a sixteenth of the nodes on wide rows,
    whose quadrature error at the fixed point (wine: ~0.01 nats) the fit does not see (D-163)."""
    del tol
    return softmax_ep(
        model,
        damping=damping,
        tol=SOFTMAX_EP_KERNEL_TOL,
        max_iter=200,
        start=laplace.mean,
        posterior_tol=SOFTMAX_EP_POSTERIOR_TOL,
        spread_levels=False,
    )


@dataclass(frozen=True)
class LaplaceMethod:
    """The Laplace approximation itself (it cannot fail after Newton's method)."""

    falls_back: ClassVar[bool] = False
    records_strategy: ClassVar[bool] = False
    #: How partial_fit updates a Gaussian prior with one row without the general fit
    #: (estimators/_site_window.py): "mode" (the Laplace approximation, by Newton's method in
    #: the row's latent), "moments" (the tilted moments: EP's fixed point with one site,
    #: which is also the exact posterior's moments), "bound" (the Jaakkola–Jordan bound's
    #: optimum for the row), None (the general fit). "mode" and "bound" streams also fit
    #: their batches of several rows jointly with the window's (binary, one-vs-rest).
    one_row: ClassVar[str | None] = "mode"
    #: Whether it fits a multinomial posterior under a shrinkage prior.
    multinomial_shrinkage: ClassVar[bool] = True
    #: The dense steps a fit under a shrinkage prior counts (``expected_shrinkage_work``:
    #: Newton's alone; a method that runs EP counts its sweeps too, the default).
    shrinkage_steps: ClassVar[int] = LAPLACE_SHRINKAGE_STEPS
    #: p × p matrices a binary fit holds at its peak, Newton's included (measured with
    #: tracemalloc: 5.1 p² at 2000 × 1000 sparse, 4.0 at 20 × 1500), with a margin.
    peak_covariances: ClassVar[float] = 6.0

    def fit(self, model, laplace: LaplaceResult, rng) -> MethodFit:
        factor = getattr(model, "coefficient_prior", None)
        if factor is not None and not factor.exact_mode:
            raise ValueError(
                f"The {factor!r} prior has no Laplace approximation: its density is infinite "
                f"at 0, so it has no mode. Use EPLogisticRegression or VSLogisticRegression."
            )
        return MethodFit(laplace, laplace.n_iter)


@dataclass(frozen=True)
class EPMethod:
    """Expectation propagation from the Laplace sites: binary, or the multinomial EP."""

    tol: float
    damping: float
    max_iter: int
    verbose: int = 0

    falls_back: ClassVar[bool] = True
    records_strategy: ClassVar[bool] = False
    one_row: ClassVar[str | None] = "moments"  # (see LaplaceMethod's)
    multinomial_shrinkage: ClassVar[bool] = True  # (see LaplaceMethod's)
    #: As LaplaceMethod's (measured 8.1 p² at 2000 × 1000 sparse).
    peak_covariances: ClassVar[float] = 9.0

    def fit(self, model, laplace: LaplaceResult, rng) -> MethodFit:
        options = {"tol": self.tol, "damping": self.damping, "max_iter": self.max_iter}
        if not isinstance(model, SOFTMAX_MODELS):
            posterior = ep_posterior(model, laplace, **options)
        elif rows_in_memory(model):
            posterior = softmax_ep_posterior(model, laplace, **options, verbose=self.verbose)
        else:
            raise ValueError(
                "EPLogisticRegression fits more than two classes with the multinomial EP, "
                "which needs the rows in memory (over dask chunks it is not implemented). "
                "Pass X.compute() if the data fit in memory, or fit one-vs-rest "
                "posteriors, e.g. OneVsRestClassifier(EPLogisticRegression()), or use "
                "VSLogisticRegression or LaplaceLogisticRegression."
            )
        return MethodFit(posterior, posterior.n_iter)


@dataclass(frozen=True)
class VBMethod:
    """The Jaakkola–Jordan bound's updates from the Laplace approximation (binary only)."""

    tol: float
    max_iter: int

    falls_back: ClassVar[bool] = True
    records_strategy: ClassVar[bool] = False
    one_row: ClassVar[str | None] = "bound"  # (see LaplaceMethod's)
    multinomial_shrinkage: ClassVar[bool] = False  # (binary only)
    #: As LaplaceMethod's (measured 7.1 p² at 2000 × 1000 sparse, 6.0 at 20 × 1500).
    peak_covariances: ClassVar[float] = 8.0

    def fit(self, model, laplace: LaplaceResult, rng) -> MethodFit:
        factor = getattr(model, "coefficient_prior", None)
        if factor is not None:
            raise ValueError(
                f"The Jaakkola-Jordan bound needs a Gaussian prior; the {factor!r} prior is "
                f"not. Use EPLogisticRegression or VSLogisticRegression."
            )
        posterior = jaakkola_jordan(model, start=laplace, tol=self.tol, max_iter=self.max_iter)
        return MethodFit(posterior, posterior.n_iter)
