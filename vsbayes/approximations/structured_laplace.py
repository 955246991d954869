"""The Laplace approximation of a binary GLM posterior with a structured covariance.

With many sparse features (text: 10⁴–10⁶ columns) the dense p × p posterior covariance
costs 8p² bytes and O(p³) work, and is the whole cost of a fit. Here the covariance of
the Laplace approximation, the inverse of ``H = D + Aᵀ W A`` (``D = diag(1/prior_var)``,
``W`` the curvature weights at the mode, ``A`` the signed design), is a
:class:`~vsbayes.gaussian.StructuredCovariance` ``diag(δ) + U K Uᵀ``:

* **"dual"** (exact): Woodbury's identity around the M × M matrix of
  :class:`~vsbayes.approximations._glm_gaussian.GLMGaussian`'s dual form,
  ``H⁻¹ = D⁻¹ − D⁻¹Aᵀ T^½ B⁻¹ T^½ A D⁻¹`` (+ the intercept's rank-one term): rank M + 2,
  to round-off the dense covariance. For few rows and many features.
* **"lowrank"** (approximate, error stated): in prior-whitened coordinates
  ``z = D^½ θ``, ``H_w = I + GᵀG`` with ``G = W^½ A D^{-½}``. The r leading eigenpairs
  ``(λ_k, q_k)`` of ``GᵀG`` (randomized SVD of the sparse G) give the covariance exactly
  on their span; on its complement (projector ``P = I − QQᵀ``) the covariance
  ``P (I + E)⁻¹ P`` (``E = P GᵀG P``) is replaced by ``P S P``, S diagonal:

  - with **exact marginals** (M ≤ :data:`EXACT_DIAGONAL_MAX_ROWS`): the exact marginal
    variances from one factorization and inversion of the M × M dual matrix at the mode
    (:func:`_exact_variances`, which gives the exact evidence too), and S such that
    ``diag(P S P)`` completes them (:func:`_schur_solve`), rows and columns rescaled so
    that every marginal is exact. A row's latent variance is exact on the span of Q; the
    posterior correlations between its features outside it, beyond P's, are not kept.
  - with **estimated marginals** (more rows): ``S = diag(1 / (1 + e_j / ρ_j))``,
    ``e_j = E_jj``, ``ρ_j = P_jj``, the inverse of ``I + E``'s Rayleigh quotient along
    ``P e_j``: exact where the remaining data term is diagonal (features that share no
    rows once the leading directions are taken out) and where it is zero. **Stated
    error**: both ``P (I + E)⁻¹ P`` and ``P S P`` lie between ``P / (1 + λ_{r+1})`` and
    ``P``, and the span of Q is exact, so the variance of any linear combination (a
    marginal, a row's latent value ``xᵀθ``) is within a factor ``1 + λ_{r+1}`` of the
    exact Laplace one, λ_{r+1} the largest eigenvalue left out (recorded). The
    evidence's ``log det(I + E)`` is estimated by ``Σ ρ_j log(1 + e_j/ρ_j)`` (exact in the
    same two cases).
* **"diagonal"**: "lowrank" with r = 0 — the exact marginal variances, or ``1 / H_jj``
  (the mean-field ones).

The mode is found by Newton's method with the Newton systems solved by preconditioned
conjugate gradients (Hessian-vector products with the sparse design, never a p × p or
M × M matrix) for "lowrank" and "diagonal", and by the dual factorization for "dual".

:func:`choose_covariance` picks the structure from the problem's size and the memory limit
(:func:`vsbayes.config_context`), before any work, and refuses a problem that no structure
fits with a :class:`~vsbayes.exceptions.MemoryLimitError` naming what would fit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import scipy.linalg
import scipy.sparse as sp
from scipy.linalg.lapack import dpotri
from scipy.sparse.linalg import LinearOperator, cg
from sklearn.utils.extmath import randomized_svd

import vsbayes._memory as _memory

from .._linalg import mirror_lower_to_upper
from .._memory import format_bytes, get_config
from .._warnings import warn
from ..exceptions import ConvergenceWarning, MemoryLimitError, NotPositiveDefiniteError
from ..gaussian import StructuredCovariance, StructuredGaussian
from ..models.latent import row_variances
from ._glm_gaussian import GLMGaussian
from ._softmax_dual import holds_dual
from .newton_laplace import GLMCurvature, NewtonLaplaceSolver

__all__ = [
    "CovarianceChoice",
    "StructuredLaplaceResult",
    "StructuredNewtonSolver",
    "choose_covariance",
    "structured_glm_laplace",
]

#: Above this many coefficients "auto" leaves the dense covariance: its p × p matrices
#: (128 MiB each at 4096) and O(p³) factorizations (≈ 1 s at 4096 on one core) would be
#: most of the fit's time, and the structured ones are accurate where features are many.
DENSE_MAX_DIM = 4096
#: Above this many rows "auto" leaves the exact dual form: its M × M factorization per
#: Newton step (M³/3 flops) and its rank-M factor (p × M, whose product with each
#: predicted row costs nnz · M) outgrow the low-rank one with exact marginals, which is as
#: accurate to ~1e-4 in probability (2000 × 5000: 5.4 s against 1.3 s).
DUAL_MAX_ROWS = 256
#: Above this many rows "lowrank" and "diagonal" estimate the marginal variances instead of
#: computing them exactly by one M × M factorization and inversion at the mode (M³ flops:
#: 2000 rows took 1.1–1.4 s, 5000 rows 17 s and 11,314 rows 539 s on the shared 2 cores,
#: 60× and 235× LogisticRegression's fit).
EXACT_DIAGONAL_MAX_ROWS = 4096
# Randomized SVD of the data term: oversampling and power iterations (Halko et al. 2011;
# 6 iterations resolve the leading eigenvalues of a flat text spectrum to ~1 %).
_OVERSAMPLES = 10
_POWER_ITERATIONS = 6
_STRUCTURES = ("dense", "dual", "lowrank", "diagonal")
# A variance whose square overflows float64 (√1.8e308 ≈ 1.3e154), with a margin.
_SQUARE_OVERFLOWS = 1e150


@dataclass(frozen=True)
class CovarianceChoice:
    """A binary posterior's covariance structure, why, and the rank of "lowrank"."""

    structure: str
    reason: str
    rank: int = 0
    exact_diagonal: bool = False

    @property
    def forced(self) -> bool:
        """Whether the user forced the structure (``vsbayes.config_context``)."""
        return self.reason.startswith(FORCED)


#: The reason of a structure the user forced (its start).
FORCED = "forced by vsbayes.config_context(covariance=...)"


def _held_bytes(design) -> float:
    if sp.issparse(design):
        return float(design.data.nbytes + design.indices.nbytes + design.indptr.nbytes)
    return float(getattr(design, "nbytes", 0))


def structure_bytes(structure: str, p: int, m: int, rank: int, held: float) -> float:
    """Bytes a fit with ``structure`` holds at its peak (the rows' copy ``held`` counted
    once more, as the margin for the rest of the process); "exact-diagonal" is the
    M × M factorization that gives "lowrank" and "diagonal" their exact diagonal."""
    if structure == "dense":  # as check_posterior_memory: the p × p matrix three times
        dense = 3.0 * p * p + ((4.0 * m * m + p * m) if p > m else 0.0)
    elif structure == "dual":  # kernel, B, its factor and inverse; the p × M spread twice
        dense = 5.0 * m * m + 2.0 * p * m
    elif structure == "exact-diagonal":  # one M × M array in place, the sparse kernel
        dense = 2.5 * m * m
    else:  # randomized SVD's bases and the factor [Q, SQ]; vectors of CG
        width = rank + 1 + _OVERSAMPLES
        dense = 8.0 * (p + m) * width + 20.0 * (p + m)
    return 8.0 * dense + 2.0 * held


def kept_bytes(structure: str, p: int, m: int, rank: int) -> float:
    """Bytes a fitted posterior with ``structure`` keeps once its fit ends (its covariance:
    the p × p matrix, or the diagonal, factor and core): what each of a one-vs-rest fit's
    other problems holds beside the one being fitted."""
    if structure == "dense":
        return 8.0 * p * p
    width = {"dual": m + 2, "lowrank": 2 * rank}.get(structure, 0)
    return 8.0 * (p + p * width + width * width)


def _refusal(
    what: str,
    structure: str,
    sizes: str,
    need: dict[str, float],
    limit: float,
    alternative: str | None,
) -> MemoryLimitError:
    """The error refusing ``structure`` (it needs ``need[structure]`` bytes, over
    ``limit``), naming the ``alternative`` structure that fits, if any."""
    remedy = (
        f"The {alternative!r} structure would fit ({format_bytes(need[alternative])}): "
        f"vsbayes.config_context(covariance={alternative!r})."
        if alternative
        else "No covariance structure fits: reduce the number of features (feature "
        "selection, hashing to fewer columns) or of rows, or raise memory_limit."
    )
    return MemoryLimitError(
        f"The {what} with a {structure} covariance ({sizes}) would allocate about "
        f"{format_bytes(need[structure])}, more than the memory limit of "
        f"{format_bytes(limit)}. {remedy}"
    )


def choose_covariance(model, estimator_name: str = "", n_problems: int = 1) -> CovarianceChoice:
    """The covariance structure of a posterior, from its size and the memory limit.

    "auto" (:func:`vsbayes.get_config`'s ``covariance``) takes the dense covariance where
    p ≤ :data:`DENSE_MAX_DIM` and it fits; else the exact "dual" one where there are more
    coefficients than rows, M ≤ :data:`DUAL_MAX_ROWS` and it fits; else "lowrank", else
    "diagonal" — with the exact marginal variances (one M × M factorization at the mode)
    where M ≤ :data:`EXACT_DIAGONAL_MAX_ROWS` and it fits. A forced structure is checked
    against the memory limit too.

    A multinomial posterior (a ``model`` with ``n_classes``) takes the dense covariance
    up to :data:`~vsbayes.approximations.softmax_laplace.MAX_SOFTMAX_PARAMS` parameters
    where it fits, else "lowrank" (its rank the configured one plus the K − 1 intercept
    contrasts, :func:`softmax_rank`), else
    "diagonal", with estimated marginals; it has no "dual" form.

    A binary posterior that is one of ``n_problems`` one-vs-rest problems of the same rows
    takes the choice each of them takes: each is sized beside the other ``n_problems − 1``
    posteriors, fitted and held (:func:`kept_bytes`), so that the last problem's fit fits.

    Raises
    ------
    MemoryLimitError
        Before any work, if the structure asked for (or, with "auto", every structure) does
        not fit the memory limit; the message names the structure that would fit.
    """
    settings = get_config()
    asked, rank = settings["covariance"], int(settings["covariance_rank"])
    p, m = model.dim, model.n_observations
    classes = getattr(model, "n_classes", None)
    if classes is not None:
        return _choose_softmax_covariance(model, asked, rank, estimator_name)
    rank = max(0, min(rank, p - 1, m))
    held = _held_bytes(model.design)
    limit = _memory.memory_limit()  # (through the module: tests lower it)
    others = n_problems - 1
    need = {
        s: structure_bytes(s, p, m, rank, held) + others * kept_bytes(s, p, m, rank)
        for s in _STRUCTURES
    }
    fits = {s: need[s] <= limit for s in _STRUCTURES}
    exact_bytes = need["lowrank"] + structure_bytes("exact-diagonal", p, m, rank, 0.0)
    exact = m <= EXACT_DIAGONAL_MAX_ROWS and exact_bytes <= limit
    name = f"{estimator_name} " if estimator_name else ""
    sizes = f"{p} coefficients, {m} rows"
    if others:
        sizes = f"{sizes}, each of {n_problems} one-vs-rest problems beside the others' posteriors"
    too_many = m > EXACT_DIAGONAL_MAX_ROWS
    why_estimated = f"> {EXACT_DIAGONAL_MAX_ROWS}" if too_many else "over the memory limit"
    diagonal_note = (
        "exact marginal variances (one M × M factorization at the mode)"
        if exact
        else f"estimated marginal variances (the M × M factorization for {m} rows is "
        f"{why_estimated})"
    )

    def refuse(structure: str, alternative: str | None) -> MemoryLimitError:
        return _refusal(f"{name}posterior", structure, sizes, need, limit, alternative)

    if asked != "auto":
        if not fits[asked]:
            raise refuse(asked, next((s for s in _STRUCTURES if fits[s]), None))
        reason = FORCED
        if asked in ("lowrank", "diagonal"):
            reason = f"{reason}; {diagonal_note}"
        return CovarianceChoice(asked, reason, rank if asked == "lowrank" else 0, exact)
    if p <= DENSE_MAX_DIM and fits["dense"]:
        return CovarianceChoice(
            "dense", f"{sizes}: the dense covariance fits ({p} ≤ {DENSE_MAX_DIM} coefficients)"
        )
    why_not_dense = (
        f"{p} > {DENSE_MAX_DIM} coefficients: the dense {p} × {p} covariance "
        f"({format_bytes(8.0 * p * p)}, O(p³) work) is not formed"
        if p > DENSE_MAX_DIM
        else f"the dense covariance needs {format_bytes(need['dense'])}, over the limit"
    )
    if p > m and m <= DUAL_MAX_ROWS and fits["dual"]:
        return CovarianceChoice(
            "dual", f"{why_not_dense}; exact dual (Woodbury) form over the {m} rows", rank
        )
    if fits["lowrank"] and rank > 0:
        return CovarianceChoice(
            "lowrank",
            f"{why_not_dense}; diagonal plus rank {rank} with {diagonal_note} (error stated "
            f"in {'posteriors_[0]' if n_problems == 1 else 'each of posteriors_'}.error)",
            rank,
            exact,
        )
    if fits["diagonal"]:
        return CovarianceChoice(
            "diagonal", f"{why_not_dense}; diagonal with {diagonal_note}", 0, exact
        )
    raise refuse("diagonal", None)


def softmax_rank(rank: int, n_classes: int, fit_intercept: bool) -> int:
    """The rank of a multinomial "lowrank" structure: the configured ``rank`` plus the
    K − 1 intercept contrasts (module docstring), if there are intercepts."""
    return rank + (n_classes - 1 if fit_intercept and rank > 0 else 0)


def softmax_subspace_bytes(p: int, m: int, k: int, vectors: int) -> float:
    """Bytes of the multinomial structure's subspace iteration over ``vectors`` vectors:
    four p-long arrays per vector at once (the basis, the products' whitened copy, the
    coefficients in the rows' layout and the result) and the rows' M × K latent values
    (counted six times: the products' temporaries)."""
    return 8.0 * (4.0 * p + 6.0 * m * k) * vectors


def softmax_intercept_bytes(p: int, m: int, k: int, rank: int) -> float:
    """Bytes of the multinomial structure's exact intercept contrasts: K conjugate-gradient
    solves at once, about 11 vectors over θ per class with the products' (M, K, K)
    latents (measured: 10-10.5 p K at 8-50 classes), beside the structure, whose factor
    gains K columns."""
    return 8.0 * (11.0 * p * k + m * k * k + p * (rank + 2))


def _choose_softmax_covariance(model, asked: str, rank: int, estimator_name: str):
    """:func:`choose_covariance` of a multinomial posterior (see there)."""
    from .softmax_laplace import MAX_SOFTMAX_PARAMS, softmax_dense_bytes  # (tests lower it)

    p, m, k = model.dim, model.n_observations, model.n_classes
    width = model.n_features + int(model.fit_intercept)
    rank = max(0, min(softmax_rank(rank, k, model.fit_intercept), p - 1))
    held = _held_bytes(model.X)
    limit = _memory.memory_limit()
    # Dense: check_softmax_size's count (else a limit between the two counts chose the
    # dense structure and Newton's method then refused it), beside the rows' copies.
    chunks = getattr(model, "chunks", None)  # rows in dask chunks
    n_chunks = 0 if chunks is None else chunks.n_chunks
    # Structured: the subspace iteration's bases and the rows' probabilities, then the
    # intercepts' solves, beside the squared rows' copy.
    vectors = rank + 1 + _OVERSAMPLES

    def structured(rank: int, vectors: int, intercepts: bool = model.fit_intercept) -> float:
        subspace = softmax_subspace_bytes(p, m, k, vectors) + 8.0 * 6.0 * m * k
        if not intercepts:
            return subspace + 3.0 * held
        return max(subspace, softmax_intercept_bytes(p, m, k, rank)) + 3.0 * held

    need = {
        "dense": softmax_dense_bytes(k, width, m, n_chunks=n_chunks) + 2.0 * held,
        "lowrank": structured(rank, vectors),
        "diagonal": structured(0, 1 + _OVERSAMPLES),
    }
    fits = {s: need[s] <= limit for s in need}
    name = f"{estimator_name} " if estimator_name else ""
    sizes = f"{p} parameters: {k} classes × {width}, {m} rows"

    def refuse(structure: str) -> MemoryLimitError:
        alternative = next((s for s in need if fits[s]), None)
        error = _refusal(f"{name}multinomial posterior", structure, sizes, need, limit, alternative)
        without = structured(0, 1 + _OVERSAMPLES, intercepts=False)
        if alternative is None and model.fit_intercept and without <= limit:
            error.args = (
                f"{error.args[0]} Most of it is for the intercepts (K solves over all "
                f"{p} parameters): without them (fit_intercept=False, on centred features) "
                f"the diagonal structure would need about {format_bytes(without)}.",
            )
        return error

    if asked == "dual":
        raise ValueError(
            "The multinomial posterior has no 'dual' covariance structure: use "
            "vsbayes.config_context(covariance='lowrank') (or 'diagonal', 'dense')."
        )
    if asked != "auto":
        if not fits[asked]:
            raise refuse(asked)
        reason = FORCED
        return CovarianceChoice(asked, reason, rank if asked == "lowrank" else 0)
    if p <= MAX_SOFTMAX_PARAMS and fits["dense"]:
        # (Where the rows are fewer, the fit runs in their dual form and forms the dense
        # covariance once, at the end: D-197, D-202.)
        dual = f"; fitted in the {m} rows' dual form, the dense covariance formed once from it"
        return CovarianceChoice(
            "dense",
            f"{sizes}: the dense covariance fits ({p} ≤ {MAX_SOFTMAX_PARAMS})"
            + (dual if holds_dual(model) else ""),
        )
    why_not_dense = (
        f"{p} > {MAX_SOFTMAX_PARAMS} parameters: the dense {p} × {p} covariance "
        f"({format_bytes(8.0 * p * p)}, O(p³) work per Newton step) is not formed"
        if p > MAX_SOFTMAX_PARAMS
        else f"the dense covariance needs {format_bytes(need['dense'])}, over the limit"
    )
    if fits["lowrank"] and rank > 0:
        return CovarianceChoice(
            "lowrank",
            f"{why_not_dense}; diagonal plus rank {rank} (the configured rank plus the "
            f"{k - 1} intercept contrasts, if fitted) with estimated marginal variances "
            f"(error stated in posteriors_[0].error)",
            rank,
        )
    if fits["diagonal"]:
        return CovarianceChoice(
            "diagonal", f"{why_not_dense}; diagonal with estimated marginal variances"
        )
    raise refuse("diagonal")


class StructuredLaplaceResult(StructuredGaussian):
    """The Laplace approximation with a structured covariance, and Newton's record.

    Attributes
    ----------
    n_iter : int
        Newton iterations.
    converged : bool
        Whether Newton's method converged.
    grad_norm : float
        Norm of the gradient at the mode.
    log_density_at_mode : float
        ``log p`` at the mode.
    error_factor : float
        Every variance of the structure (marginal, or of a row's latent value) is within
        this factor of the exact Laplace covariance's: 1 for "dual" (exact), ``1 + λ_{r+1}``
        for the estimated diagonal, NaN where there is no such bound (the exact diagonal
        with its rank-r part: marginals exact, see ``error``).
    evidence_exact : bool
        Whether ``log_Z`` is the exact Laplace evidence ("dual", or the exact marginals'
        M × M factorization) or has an estimated ``log det(I + E)``, biased low by an
        amount that grows with the prior variance: not comparable across C.
    evidence_bounds : tuple of float
        ``(low, high)``: the exact Laplace evidence lies within them (both ``log_Z`` where
        it is exact), from bounds on the eigenvalues the structure leaves out
        (``_estimated_complement``).
    """

    def __init__(
        self,
        mean,
        covariance,
        log_Z,
        error,
        *,
        error_factor: float,
        evidence_exact: bool,
        evidence_bounds: tuple[float, float] | None = None,
        **diagnostics,
    ):
        super().__init__(mean, covariance, log_Z, error)
        self.error_factor = float(error_factor)
        self.evidence_exact = bool(evidence_exact)
        low, high = (float(log_Z),) * 2 if evidence_bounds is None else evidence_bounds
        self.evidence_bounds = (min(float(low), float(log_Z)), max(float(high), float(log_Z)))
        self.n_iter = int(diagnostics["n_iter"])
        self.converged = bool(diagnostics["converged"])
        self.grad_norm = float(diagnostics["grad_norm"])
        self.log_density_at_mode = float(diagnostics["log_density_at_mode"])

    def diagnostics(self) -> dict[str, object]:
        """Newton's record and the structure, by name."""
        return {
            "n_iter": self.n_iter,
            "converged": self.converged,
            "grad_norm": self.grad_norm,
            "covariance_structure": self.covariance.structure,
            "covariance_rank": self.covariance.rank,
        }


class _IterativeHessian:
    """The negative Hessian ``D + Aᵀ W A`` as products only: :meth:`solve` by conjugate
    gradients preconditioned by its diagonal (Jacobi), never a p × p or M × M matrix."""

    def __init__(self, model, weights: np.ndarray, squares):
        self.model, self.weights = model, weights
        self.diagonal = np.asarray(squares.T @ weights).ravel() + 1.0 / model.prior_var

    def product(self, v: np.ndarray) -> np.ndarray:
        design = self.model.design
        return (
            np.asarray(design.T @ (self.weights * (design @ v))).ravel() + v / self.model.prior_var
        )

    def solve(self, g: np.ndarray) -> np.ndarray:
        p = g.shape[0]
        operator = LinearOperator((p, p), matvec=self.product, dtype=float)
        preconditioner = LinearOperator((p, p), matvec=lambda r: r / self.diagonal, dtype=float)
        # 1e-10 of the right-hand side: the decrement gᵀH⁻¹g that stops Newton is then
        # exact to ~1e-10 of itself, and the step to ~1e-5 relative where it matters
        # (the last steps, whose gradients are small: rtol is relative).
        x, _ = cg(operator, g, rtol=1e-10, maxiter=10 * p, M=preconditioner)
        return x


class _IterativeCurvature(GLMCurvature):
    """:class:`GLMCurvature` with the Newton systems solved by conjugate gradients."""

    def __init__(self, model):
        super().__init__(model)
        design = model.design
        self._squares = design.multiply(design).tocsr() if sp.issparse(design) else design**2

    def _negative_hessian(self, weights: np.ndarray) -> _IterativeHessian:
        return _IterativeHessian(self.model, weights, self._squares)


def structured_glm_laplace(
    model,
    choice: CovarianceChoice,
    *,
    tol: float = 1e-8,
    max_iter: int = 100,
    theta0=None,
    verbose: int = 0,
) -> StructuredLaplaceResult:
    """The Laplace approximation of a binary posterior with the structure ``choice`` names.

    Parameters
    ----------
    model : BinaryGLMPosterior
        The posterior, its rows in memory.
    choice : CovarianceChoice
        From :func:`choose_covariance`; "dual", "lowrank" or "diagonal".
    tol, max_iter, theta0, verbose
        As for :func:`~vsbayes.approximations.glm_laplace`.

    Returns
    -------
    StructuredLaplaceResult
    """
    solver = StructuredNewtonSolver(model, choice, tol=tol, max_iter=max_iter, verbose=verbose)
    return solver.laplace_at_mode(theta0, "the posterior mode")


class StructuredNewtonSolver(NewtonLaplaceSolver):
    """Newton's method for the mode of a binary posterior whose Laplace approximation at
    an iterate (:meth:`laplace_here`) has the structured covariance ``choice`` names, built
    at that iterate's curvature — never the dense p × p one, nor a ``½ log det H`` the
    conjugate-gradient Hessian does not have.

    It is the fit's result at the mode, and what an observer of the fit
    (:mod:`vsbayes._progress`: scikit-learn's callbacks) sees at each iteration: the fit
    ``max_iter`` iterations would return. Built only when asked for (each build costs
    what the final one does: a randomized SVD, and the M × M factorization of the exact
    marginals where the choice has them).

    Parameters
    ----------
    model : BinaryGLMPosterior
    choice : CovarianceChoice
        "dual", "lowrank" or "diagonal".
    **solver_parameters
        :class:`~vsbayes.approximations.newton_laplace.NewtonLaplaceSolver`'s (the
        curvature is the choice's: the dual factorization, else conjugate gradients).
    """

    def __init__(self, model, choice: CovarianceChoice, **solver_parameters):
        if choice.structure == "dual":
            solver_parameters["form"] = "dual"
        else:
            solver_parameters["curvature"] = self._curvature_of(model)
        super().__init__(model, **solver_parameters)
        self.choice = choice

    @staticmethod
    def _curvature_of(model):
        return _IterativeCurvature(model)

    def laplace_at_mode(self, theta0, what: str) -> StructuredLaplaceResult:
        """Newton's method from ``theta0`` (warning where it did not converge, ``what``
        naming the mode), then :meth:`laplace_here` at the mode."""
        self.find_mode(theta0)
        if not (self.converged or self.stalled):
            warn(
                f"Newton's method for {what} did not converge in max_iter={self.max_iter} "
                f"iterations (predicted gain {self.half_decrement:.3g} in log-posterior, "
                f"tol={self.tol:g}). Increase max_iter or standardize the features.",
                ConvergenceWarning,
            )
        return self.laplace_here()

    def structure_here(self):
        """``(θ, covariance, ½ log det H, error, error factor, bounds)`` at the current
        iterate: ``bounds`` those of the exact ``½ log det H`` (both it, where exact)."""
        model, choice = self.model, self.choice
        if choice.structure == "dual":
            covariance = _dual_structure(model, self.gaussian)
            half_log_det = self.gaussian.half_log_det
            return self.theta, covariance, half_log_det, "", 1.0, (half_log_det,) * 2
        weights = self._curvature._weights  # the last expansion's: the current iterate's
        rank = choice.rank if choice.structure == "lowrank" else 0
        covariance, half_log_det, error, factor, bounds = _lowrank_structure(
            model, weights, rank, choice.exact_diagonal
        )
        return self.theta, covariance, half_log_det, error, factor, bounds

    def laplace_here(self) -> StructuredLaplaceResult:
        """The Laplace approximation at the current iterate, with the structured
        covariance (its evidence from the structure's ``½ log det H``)."""
        theta, covariance, half_log_det, error, factor, bounds = self.structure_here()
        constant = self.value + 0.5 * self.model.dim * math.log(2 * math.pi)
        log_Z = constant - half_log_det
        return StructuredLaplaceResult(
            theta,
            covariance,
            log_Z,
            error,
            error_factor=factor,
            evidence_exact=self.choice.structure == "dual" or self.choice.exact_diagonal,
            evidence_bounds=(constant - bounds[1], constant - bounds[0]),
            n_iter=self.n_iter,
            converged=self.converged or self.stalled,
            grad_norm=float(np.linalg.norm(self.grad)),
            log_density_at_mode=self.value,
        )


def _dual_structure(model, gaussian: GLMGaussian) -> StructuredCovariance:
    """The exact covariance of ``gaussian``'s dual form as diagonal plus rank M (+ 2):
    ``P₀ + γ ĝĝᵀ`` with ``P₀ = D_w⁻¹ − V Vᵀ`` (module docstring of ``_glm_gaussian``).

    The intercept's prior variance is 0 in ``D_w⁻¹``; its posterior variance γ takes that
    place on the diagonal (which must be positive), and ``γ ĝĝᵀ − γ e_b e_bᵀ`` becomes
    ``γ g'g'ᵀ − γ (g' e_bᵀ + e_b g'ᵀ)`` (g' = ĝ without its last entry) in the core."""
    spread = gaussian._dual_spread()  # V, p × M
    diagonal = np.array(gaussian._parts.coef_var)
    intercept = gaussian._intercept
    if intercept is None:
        return StructuredCovariance(diagonal, spread, -np.eye(spread.shape[1]), "dual")
    p, m = spread.shape
    gamma = intercept.var
    diagonal[-1] = gamma
    g = intercept.g.copy()
    g[-1] = 0.0
    unit = np.zeros(p)
    unit[-1] = 1.0
    factor = np.column_stack([spread, g, unit])
    core = np.zeros((m + 2, m + 2))
    core[:m, :m] = -np.eye(m)
    core[m, m] = gamma
    core[m, m + 1] = core[m + 1, m] = -gamma
    return StructuredCovariance(diagonal, factor, core, "dual")


def _lowrank_structure(model, weights: np.ndarray, rank: int, exact_diagonal: bool):
    """``(covariance, ½ log det H, error, factor)`` of the "lowrank" (rank ≥ 1) or
    "diagonal" (rank 0) structure at the curvature ``weights`` (module docstring): every
    variance within ``factor`` of the exact one (NaN: no such bound); with
    ``exact_diagonal``, the diagonal is the exact marginal variances' remainder. Last, the
    bounds of the exact ``½ log det H`` (both it, where exact)."""
    design = model.design
    scale = np.sqrt(model.prior_var)  # D^{-½}
    root = np.sqrt(np.maximum(weights, 0.0))
    if sp.issparse(design):
        whitened = (sp.diags(root) @ design @ sp.diags(scale)).tocsr()
        column_norms = np.asarray(whitened.multiply(whitened).sum(axis=0)).ravel()
    else:
        whitened = root[:, None] * design * scale
        column_norms = np.einsum("ij,ij->j", whitened, whitened)
    width = min(rank + 1, min(whitened.shape))
    _, singular, right = randomized_svd(
        whitened,
        n_components=width,
        n_oversamples=_OVERSAMPLES,
        n_iter=_POWER_ITERATIONS,
        random_state=0,
    )
    eigen = singular**2
    basis = right[:rank].T  # Q, p × r
    lam = eigen[:rank]
    left_out = float(eigen[rank]) if eigen.size > rank else 0.0
    structure = "lowrank" if rank else "diagonal"
    inside = np.maximum(1.0 - np.einsum("ij,ij->i", basis, basis), 0.0)  # ρ_j = P_jj
    if exact_diagonal:
        # Σ_w ≈ Q diag(1/(1+λ)) Qᵀ + P S P with S chosen so that the marginal variances
        # are the exact ones: diag(P S P) = (P∘P) s = the exact variances less the span of
        # Q's. P's off-diagonal entries −(QQᵀ)_jk are kept (a diagonal alone in their place
        # missed them: probabilities off by 0.02 at full rank).
        var, half_log_det = _exact_variances(model, weights)
        bounds = (half_log_det, half_log_det)
        target = var / model.prior_var - (basis * basis) @ (1.0 / (1.0 + lam))
        s_diag = _schur_solve(basis, inside, target)
        error = (
            f"marginal variances and the evidence exact (one M × M factorization at the "
            f"mode); a row's latent variance exact on the leading {rank} directions of the "
            f"data term, outside them P S P with S matching the exact marginals (the "
            f"posterior correlations between a row's features there are not kept; largest "
            f"eigenvalue left out: {left_out:.4g}, prior-whitened)"
        )
        factor = math.nan
    else:
        s_diag, log_det_whitened, log_det_bounds = _estimated_complement(
            basis, lam, column_norms, inside
        )
        prior = float(np.log(model.prior_var).sum())
        half_log_det = 0.5 * (log_det_whitened - prior)
        bounds = tuple(0.5 * (value - prior) for value in log_det_bounds)
        error = (
            f"every variance (marginal, or of a row's latent value) within a factor "
            f"{1.0 + left_out:.4g} of the exact Laplace covariance's (1 + the largest "
            f"eigenvalue left out of the rank-{rank} part, {left_out:.4g}, in prior-whitened "
            f"units); the evidence's log det(I + E) estimated"
        )
        factor = 1.0 + left_out
    diagonal, factor_matrix, core = _assembled(basis, lam, s_diag, scale)
    if exact_diagonal:
        # Where s_j's floor bound (a coefficient Q nearly contains: the intercept), rows
        # and columns rescaled (correlations kept) make every marginal the exact one.
        raw = diagonal + np.einsum("ij,jk,ik->i", factor_matrix, core, factor_matrix)
        rescale = np.sqrt(var / raw)
        diagonal = diagonal * rescale**2
        factor_matrix = factor_matrix * rescale[:, None]
    covariance = StructuredCovariance(diagonal, factor_matrix, core, structure)
    return covariance, half_log_det, error, factor, bounds


def _estimated_complement(basis, lam, column_norms, inside) -> tuple[np.ndarray, float, tuple]:
    """``(diag S, log det(I + GᵀG) estimated, its bounds)`` of the estimated marginals
    (module docstring): ``S_j = 1 / (1 + e_j / ρ_j)`` from the data term's diagonal
    ``column_norms`` less the span of Q's part, and ``ρ_j = P_jj`` (``inside``).

    The bounds hold for the exact value whatever the estimate: the eigenvalues μ of
    ``GᵀG`` sum to its trace ``t = Σ_j column_norms_j``, and the leading r are at least
    ``lam`` (Ritz values of an orthonormal basis: interlacing), so ``Σ log(1 + μ)``, a
    concave function of μ, is at least its value with all that ``lam`` leaves of t on the
    largest (a vertex of that set) and at most its value with it spread evenly over the
    other p − r (and over the smaller of ``lam`` below that level: :func:`_spread`)."""
    p = basis.shape[0]
    residual = np.maximum(column_norms - (basis * basis) @ lam, 0.0)  # e_j
    quotient = np.divide(residual, inside, out=np.zeros(p), where=inside > 1e-12)
    s_diag = 1.0 / (1.0 + quotient)
    log_det_whitened = float(np.log1p(lam).sum()) + float((inside * np.log1p(quotient)).sum())
    ritz = np.sort(np.maximum(np.asarray(lam, dtype=float), 0.0))[::-1]
    left = max(float(column_norms.sum()) - float(ritz.sum()), 0.0)
    if ritz.size:
        low = float(np.log1p(ritz[1:]).sum()) + math.log1p(ritz[0] + left)
    else:
        low = math.log1p(left)
    return s_diag, log_det_whitened, (low, _spread(ritz, left, p - ritz.size))


def _spread(ritz: np.ndarray, left: float, count: int) -> float:
    """The largest ``Σ log(1 + μ)`` over the spectra of ``len(ritz) + count`` values summing
    to ``Σ ritz + left``, each leading one at least its ``ritz`` (descending): the level c
    that the smallest of them and the other ``count`` share (water-filling)."""
    total = float(ritz.sum()) + left
    for kept in range(ritz.size, -1, -1):  # the leading ``kept`` stay at their Ritz value
        shared = ritz.size - kept + count
        if shared == 0:
            continue
        level = (total - float(ritz[:kept].sum())) / shared
        above = kept == 0 or ritz[kept - 1] >= level
        if above and (kept == ritz.size or ritz[kept] <= level):
            return float(np.log1p(ritz[:kept]).sum()) + shared * math.log1p(level)
    return float(np.log1p(ritz).sum()) + math.log1p(left)  # count = 0: only the leading


def _assembled(basis, lam, s_diag, scale) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(δ, U, K)`` with ``diag(δ) + U K Uᵀ = D^{-½} (P S P + Q diag(1/(1+λ)) Qᵀ) D^{-½}``
    (``scale`` = D^{-½}): in whitened units ``diag(S) + [Q, SQ] K [Q, SQ]ᵀ``."""
    rank = basis.shape[1]
    scaled_basis = s_diag[:, None] * basis
    core = np.zeros((2 * rank, 2 * rank))
    core[:rank, :rank] = np.diag(1.0 / (1.0 + lam)) + basis.T @ scaled_basis
    core[:rank, rank:] = core[rank:, :rank] = -np.eye(rank)
    factor_matrix = np.hstack([basis, scaled_basis]) * scale[:, None]
    diagonal = s_diag * scale**2
    return diagonal, factor_matrix, core


def complement_covariance(
    basis: np.ndarray,
    lam: np.ndarray,
    column_norms: np.ndarray,
    scale: np.ndarray,
    null_share: float = 0.0,
) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray], float, tuple[float, float]]:
    """The covariance with estimated marginals (module docstring) from the leading
    eigenpairs ``(lam, basis)`` of the whitened data term ``GᵀG``, its diagonal
    ``column_norms`` and ``scale`` = D^{-½}, as ``(δ, U, K)``, and ``log det(I + GᵀG)``
    estimated with the bounds of the exact one (:func:`_estimated_complement`): the part
    shared by every model whose negative Hessian is ``D + (data term)``. ``null_share``:
    ``(N Nᵀ)_jj`` of a known null space N of the data term that the caller holds exactly
    (the multinomial's shift directions: 1/K); the complement is then ``P = I − QQᵀ −
    NNᵀ``, whose diagonal ``ρ_j`` the Rayleigh quotients ``e_j / ρ_j`` are taken along."""
    inside = np.maximum(1.0 - null_share - np.einsum("ij,ij->i", basis, basis), 0.0)
    s_diag, log_det_whitened, bounds = _estimated_complement(basis, lam, column_norms, inside)
    return _assembled(basis, lam, s_diag, scale), log_det_whitened, bounds


def _schur_solve(basis: np.ndarray, inside: np.ndarray, target: np.ndarray) -> np.ndarray:
    """``s`` with ``diag(P diag(s) P) = target`` (``P = I − QQᵀ``), i.e. ``(P∘P) s =
    target``, by conjugate gradients: ``(P∘P) s = s (1 − 2|q_j|²) + q_jᵀ (Qᵀ S Q) q_j``,
    O(p r²) per product. P∘P is positive semi-definite (a Schur product), and the identity
    where Q is small, so that a few iterations suffice; ``s`` is kept above a thousandth
    of its target (positive definiteness)."""
    p = basis.shape[0]
    if basis.shape[1] == 0:
        return np.maximum(target, 1e-12)
    first = 1.0 - 2.0 * (1.0 - inside)

    def product(s: np.ndarray) -> np.ndarray:
        inner = basis.T @ (s[:, None] * basis)
        return s * first + np.einsum("ij,jk,ik->i", basis, inner, basis)

    # A coefficient that Q (nearly) contains (ρ_j = P_jj small: the intercept, whose vague
    # prior makes it the leading direction) has P e_j ≈ 0: its s_j hardly acts, and left
    # in the system it makes it singular. Its s_j is the floor.
    free = inside > 1e-3
    solution = np.zeros(p)

    def free_product(values: np.ndarray) -> np.ndarray:
        solution[free] = values
        return product(solution)[free]

    size = int(free.sum())
    operator = LinearOperator((size, size), matvec=free_product, dtype=float)
    jacobi = inside[free] ** 2  # (P∘P)_jj
    preconditioner = LinearOperator((size, size), matvec=lambda r: r / jacobi, dtype=float)
    values, _ = cg(
        operator,
        target[free],
        x0=target[free] / jacobi,
        rtol=1e-13,
        maxiter=500,
        M=preconditioner,
    )
    solution[free] = values
    return np.maximum(solution, 1e-3 * np.maximum(target, 1e-12))


def _exact_variances(model, weights: np.ndarray) -> tuple[np.ndarray, float]:
    """The exact marginal variances of the Laplace covariance and ``½ log det H``, by one
    factorization of the M × M dual matrix ``B₀ = I + T^½ A D_w⁻¹ Aᵀ T^½`` at the mode
    (the intercept in closed form, as ``GLMGaussian``'s dual form), never a p × p matrix:
    ``var_j = D_j⁻¹ − D_j⁻² ã_jᵀ B₀⁻¹ ã_j (+ γ g_j²)``, ``ã_j`` the j-th column of
    ``T^½ A``. The M × M arrays are overwritten in place (the kernel, its factor, the
    inverse: one M × M array at a time)."""
    design = model.design
    m, p = design.shape
    coef_var = np.array(model.prior_var, dtype=float)
    column = None
    if model.fit_intercept:
        coef_var[-1] = 0.0
        column = design[:, -1]
        column = np.asarray(column.toarray() if sp.issparse(column) else column).ravel()
    root = np.sqrt(np.maximum(weights, 0.0))
    if sp.issparse(design):
        scaled = (sp.diags(root) @ design @ sp.diags(np.sqrt(coef_var))).tocsr()
        dual = np.asarray((scaled @ scaled.T).toarray())
    else:
        scaled = root[:, None] * design * np.sqrt(coef_var)
        dual = scaled @ scaled.T
    dual[np.diag_indices(m)] += 1.0
    try:  # B₀ is symmetric: its transpose is the Fortran-ordered view LAPACK takes in place
        upper = scipy.linalg.cholesky(dual.T, lower=False, overwrite_a=True, check_finite=False)
    except scipy.linalg.LinAlgError:
        raise NotPositiveDefiniteError(
            "The dual matrix of the posterior is not definite."
        ) from None
    half_log_det = float(np.log(np.diag(upper)).sum()) - 0.5 * float(np.log(model.prior_var).sum())
    # B₀⁻¹ from the factor (LAPACK fills one triangle, in place), then both triangles: the
    # variances need only the entries of B₀⁻¹ at the pairs of rows that share a feature,
    # ã_jᵀ B₀⁻¹ ã_j over the non-zero pairs of each column ã_j of T^½ A — for text, a few
    # dozen pairs per feature instead of an M-long product.
    inverse, info = dpotri(upper, lower=0, overwrite_c=1)
    if info != 0:
        raise NotPositiveDefiniteError("The dual factor is singular.")
    del upper, dual
    inverse = inverse.T  # C-ordered (the same memory); symmetric once mirrored
    mirror_lower_to_upper(inverse)
    var = np.array(coef_var)
    # The intercept's column (prior variance 0 in D_w⁻¹) is left out: its M non-zeros
    # would be M²/2 pairs.
    d = p - 1 if column is not None else p
    if sp.issparse(design):
        columns = (design[:, :d].T @ sp.diags(root)).tocsr()  # the columns ã_j as CSR rows
        columns.sort_indices()
        quadratic = row_variances(columns, inverse)
    else:
        weighted = root[:, None] * design[:, :d]
        quadratic = np.einsum("ij,ij->j", inverse @ weighted, weighted)
    # v_j − v_j² q_j; where v_j² overflows (C beyond ~1e154, the variance of directions no
    # row sees), as v_j (v_j q_j), v_j q_j ≤ 1 (elsewhere as before, to the bit).
    huge = coef_var[:d] > _SQUARE_OVERFLOWS
    if huge.any():
        with np.errstate(over="ignore", invalid="ignore"):
            squared = np.square(coef_var[:d]) * quadratic
        var[:d] -= np.where(huge, coef_var[:d] * (coef_var[:d] * quadratic), squared)
    else:
        var[:d] -= np.square(coef_var[:d]) * quadratic
    if column is not None:  # b in closed form: γ = s / (1 + s uᵀB₀⁻¹u), var += γ ĝ²
        u = root * column
        z = inverse @ u
        gain = model.prior_var[-1] * float(u @ z)
        gamma = model.prior_var[-1] / (1.0 + gain)
        g = coef_var * np.asarray(design.T @ (root * z)).ravel()
        g[-1] = -1.0
        var += gamma * np.square(g)
        half_log_det += 0.5 * math.log1p(gain)
    return var, half_log_det
