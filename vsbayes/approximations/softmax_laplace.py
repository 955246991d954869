"""Laplace approximation of the multinomial logistic posterior by Newton's method.

Newton's method on the K(d + 1) parameters with the exact Hessian (K(K + 1)/2 weighted
Gram matrices of the design, see :class:`~vsbayes.models.SoftmaxGLMPosterior`), Cholesky
solves and Armijo backtracking: the binary model's
:class:`~vsbayes.approximations.NewtonLaplaceSolver` with the multinomial curvature
(:class:`~vsbayes.approximations.newton_laplace.SoftmaxCurvature`); this module holds the
wrapper and the size limits of that dense route. An iteration costs about
``M K² (d + 1)² / 2 + (K(d + 1))³ / 3`` multiply-adds and holds two ``p × p`` matrices
(p = K(d + 1)): the Hessian and its factor; the covariance is a third, formed on first
use. Where the rows are fewer than the columns, the steps solve the same system in the
rows' space (:class:`~vsbayes.approximations.newton_laplace.DualSoftmaxCurvature`, D-197:
``(M (K − 1))³/3`` a step), and only the covariance is dense.
The memory guard (:func:`~vsbayes._memory.check_memory`) refuses a p whose three
matrices would not fit (p ≈ 30,000 on 8 GiB: e.g. 10 classes of 3,000 features), with the
remedy — fewer features, or one-vs-rest (``OneVsRestClassifier``), whose binary problems
need no ``p × p`` matrix beyond p = d + 1. Long before memory, time runs out: one
factorization takes ``p³/3`` multiply-adds (10 s at p = 10,000 on two cores at
30 GFlop/s), Newton makes about ten and the multinomial EP one per sweep, so p above
:data:`MAX_SOFTMAX_PARAMS` is refused up front with the same remedies, rather than
fitting for hours (5 classes of 5,000 sparse features: p = 25,005, 5·10¹² multiply-adds
per factorization). Beyond that size the estimators take the matrix-free route with a
structured covariance instead (:mod:`~vsbayes.approximations.structured_softmax`).

The posterior is proper but wide along the sum of the intercepts (its prior only, variance
``intercept_prior_var / K``: the likelihood does not see it), so the negative Hessian's
condition number is about ``M · intercept_prior_var``: ~10¹⁰ for 10⁴ rows and the
estimators' 10⁶, well within float64's Cholesky factorization. Newton's iterates started
from 0 stay in the centred subspace (``Σ_k w_k = 0``, ``Σ_k b_k = 0``), where the mode is.
"""

from __future__ import annotations

from .._memory import MAX_DENSE_PARAMS, block_bytes, check_memory, format_bytes
from ..engine import LaplaceResult
from ..models.softmax import SoftmaxGLMPosterior
from ._threads import blas_policy
from .newton_laplace import NewtonLaplaceSolver, softmax_curvature
from .shrinkage_mode import softmax_shrinkage_laplace

__all__ = [
    "MAX_SOFTMAX_PARAMS",
    "check_softmax_dims",
    "check_softmax_size",
    "softmax_dense_bytes",
    "softmax_laplace",
]

#: The most parameters K(d + 1) of a dense multinomial posterior: a p × p factorization
#: then takes up to 3.3·10¹¹ multiply-adds, about 10 s on two cores; a fit makes tens
#: (the bound of every dense posterior without a structured one, ``MAX_DENSE_PARAMS``).
MAX_SOFTMAX_PARAMS = MAX_DENSE_PARAMS


def check_softmax_size(model: SoftmaxGLMPosterior) -> None:
    """Raise before Newton's method if its p × p matrices would take hours to factorize
    (ValueError, p above :data:`MAX_SOFTMAX_PARAMS`) or would not fit (MemoryLimitError)."""
    chunks = getattr(model, "chunks", None)  # rows in dask chunks
    check_softmax_dims(
        model.n_classes,
        model.n_features + int(model.fit_intercept),
        model.n_observations,
        n_chunks=0 if chunks is None else chunks.n_chunks,
        shrinkage=getattr(model, "coefficient_prior", None),
    )


def softmax_dense_bytes(
    n_classes: int, per_class: int, n_rows: int, *, under_prior: bool = False, n_chunks: int = 0
) -> float:
    """Bytes :func:`check_softmax_dims` requires of the dense posterior (its arguments):
    the covariance chooser sizes the dense structure by the same count, so that a limit
    it finds room under is one Newton's method starts under."""
    p, k, m = n_classes * per_class, n_classes, n_rows
    # Beside the p × p matrices: the rows' K × K curvatures' distinct entries (three arrays
    # of M K(K + 1)/2 while the Hessian is assembled, counted as M K² each: the guard's
    # margin), their probabilities, and the Gram blocks' rows.
    rows = 8.0 * m * (3 * k * k + 4 * k)
    matrices = (5 if under_prior else 3) + (n_chunks + 2 if n_chunks else 0)
    return matrices * 8.0 * p * p + rows + block_bytes()


def check_softmax_dims(
    n_classes: int,
    per_class: int,
    n_rows: int,
    *,
    under_prior: bool = False,
    n_chunks: int = 0,
    shrinkage=None,
) -> None:
    """:func:`check_softmax_size` from the problem's dimensions, before its model exists:
    ``per_class`` parameters (features and intercept) per class, ``n_rows`` rows.
    ``under_prior``: a fit under a general Gaussian prior (``prior=``, or ``partial_fit``'s
    carried posterior), which the structured covariance does not take, and whose dense
    prior precision and carried covariance are two more p × p matrices. ``n_chunks``: the
    dask chunks of the rows, each pass over which gathers one p × p Hessian per chunk
    before their (compensated) sum, two more. ``shrinkage``: the model's shrinkage prior
    (a :class:`~vsbayes.models.shrinkage_priors.CoefficientFactor`), whose fits keep the
    dense covariance whatever its size, so that the structured one is no remedy."""
    p, k, m = n_classes * per_class, n_classes, n_rows
    structured = (
        f"A shrinkage prior ({shrinkage!r}) keeps the dense covariance (its sites, one per "
        f"coefficient, are fitted on it): the Gaussian prior (penalty='l2' or l1_ratio=0, "
        f"no shrinkage prior=) takes the structured covariance beyond this size; "
        if shrinkage is not None
        else "A fit under a prior (prior=, or partial_fit's carried posterior) has the dense "
        "covariance, which the structured one does not replace: fit all the rows at once "
        "with fit and no prior= (a structured covariance beyond this size), stream "
        "one-vs-rest binary posteriors (OneVsRestClassifier(...).partial_fit: each binary "
        "one carries a structured covariance in O(p)), "
        if under_prior
        else "Use a structured covariance, the default beyond this size "
        "(vsbayes.config_context(covariance='lowrank') or 'auto'); "
    )
    if p > MAX_SOFTMAX_PARAMS:
        raise ValueError(
            f"The multinomial posterior has {p} parameters ({k} classes × {per_class}), "
            f"above the {MAX_SOFTMAX_PARAMS} its dense {p} × {p} Newton and "
            f"expectation-propagation steps allow: each factorization takes {p**3 / 3:.2g} "
            f"multiply-adds, and a fit makes tens. {structured}or reduce the number of "
            f"features (e.g. sklearn.feature_selection.SelectKBest or "
            f"sklearn.decomposition.TruncatedSVD in the pipeline), or fit one-vs-rest binary "
            f"posteriors with sklearn.multiclass.OneVsRestClassifier, whose factorizations "
            f"are of min(features, rows) only."
        )
    check_memory(
        softmax_dense_bytes(k, per_class, m, under_prior=under_prior, n_chunks=n_chunks),
        f"the {p} × {p} Hessian, Cholesky factor and covariance of the multinomial posterior "
        f"({k} classes × {per_class} parameters)"
        + (", its prior's precision and carried covariance," if under_prior else "")
        + (f", the sum of a pass over {n_chunks} dask chunks," if n_chunks else "")
        + f" with the {m} rows' {k} × {k} curvatures",
        f"Reduce the number of features or rows (each {p} × {p} matrix takes "
        f"{format_bytes(8.0 * p * p)})"
        + (", or use fewer, larger dask chunks (X.rechunk)" if n_chunks else "")
        + ", or fit one-vs-rest binary posteriors with "
        "sklearn.multiclass.OneVsRestClassifier, which need matrices of the features' size "
        "only.",
    )


@blas_policy
def softmax_laplace(
    model: SoftmaxGLMPosterior,
    *,
    tol: float = 1e-8,
    max_iter: int = 100,
    theta0=None,
    verbose: int = 0,
) -> LaplaceResult:
    """Laplace approximation of the multinomial logistic posterior.

    The mode (MAP) is found by Newton's method from ``theta0`` (default 0); the Gaussian has
    the inverse negative Hessian at the mode as covariance (layout of θ: ``[W.ravel(), b]``,
    see :mod:`vsbayes.models.softmax`), and ``log_Z = log p(mode) + p/2 log 2π −
    ½ log det(−H)`` estimates the log evidence.

    Parameters
    ----------
    model : SoftmaxGLMPosterior
        The posterior.
    tol : float, default=1e-8
        Stop when half the squared Newton decrement is at most ``tol`` (nats).
    max_iter : int, default=100
        Maximum Newton iterations; a ConvergenceWarning is emitted when reached.
    theta0 : array-like of shape (p,), optional
        Starting point.
    verbose : int, default=0
        Print the iterations when > 1.

    Returns
    -------
    LaplaceResult
        Under a shrinkage prior on the coefficients (``model.coefficient_prior``), that of
        :func:`~vsbayes.approximations.shrinkage_mode.softmax_shrinkage_laplace`
        (proximal Newton).

    Raises
    ------
    ValueError
        If p is above :data:`MAX_SOFTMAX_PARAMS` (see the module docstring).
    MemoryLimitError
        If the p × p matrices would not fit in memory (see the module docstring).
    """
    check_softmax_size(model)
    if getattr(model, "coefficient_prior", None) is not None:
        return softmax_shrinkage_laplace(
            model, tol=tol, max_iter=max_iter, theta0=theta0, verbose=verbose
        )
    solver = NewtonLaplaceSolver(
        model, tol=tol, max_iter=max_iter, verbose=verbose, curvature=softmax_curvature(model)
    )
    return solver.solve(theta0)
