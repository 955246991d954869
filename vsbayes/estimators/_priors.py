"""How a fit takes a Gaussian prior: ``prior=`` read, each problem's model under it, and the
prior a stream carries to its next batch.

``prior`` is N(μ₀, Σ₀) on each problem's parameter vector (binary: ``[coef, intercept]``;
multinomial: ``[W.ravel(), b]``, ``sigma_``'s layout), given as a fitted vsbayes estimator
(its posterior), a Gaussian, a ``(mean, cov)`` pair or a dict, or a list of them, one per
problem (:func:`prior_specs`, :func:`as_prior`). How each model takes it
(:func:`problem_model`):

- binary, diagonal Σ₀: the model's own prior ``N(μ₀, diag(prior_var))``: exact, no copy of
  the rows, sparse and dask designs kept as they are;
- binary, full Σ₀: whitened (:mod:`vsbayes.models.priors`), the model of the design
  ``[X, 1] L`` with the prior N(L⁻¹μ₀, I) and the posterior mapped back. Exact, for every
  method; the whitened design is dense, M × p floats (a sparse design is densified: its
  size is checked first, :class:`~vsbayes._memory.MemoryLimitError` if it does not fit; a
  dask design is whitened chunk by chunk, on the workers);
- binary, arrowhead Σ₀ (a stream's carried structured posterior, below): in the
  coordinates where it is diagonal (:func:`_hub_design`), the fit mapped back;
- multinomial: the model's full prior precision (the softmax's Kronecker structure does not
  survive whitening), exact for Laplace and the sampling fits.

**The carried prior** (:func:`carried_prior`): ``partial_fit``'s posterior after a batch is
the prior of the next, a dense one as it is. A structured posterior (text scale: more
coefficients than the dense p × p covariance allows,
:func:`~vsbayes.approximations.structured_laplace.choose_covariance`, binary or each
one-vs-rest problem) is projected
onto the Gaussians whose coefficients are independent given the intercept (its mean,
marginal variances and the intercept's covariances: ADF's KL projection onto that family;
the correlations between coefficients dropped; without an intercept, the diagonal), held
in O(p), never p × p. Such a prior is diagonal in the coordinates ``(θ_rest − c θ_b,
θ_b)``, whose design is ``[X, 1 + X c]`` (:func:`_hub_design`): the batch's structured fit
takes it there as ``fit`` takes a diagonal prior, and is mapped back
(docs/decisions.md, D-112).
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import scipy.sparse as sp

from .._memory import check_memory, format_bytes
from ..approximations.softmax_laplace import check_softmax_dims
from ..approximations.structured_laplace import StructuredLaplaceResult
from ..gaussian import Gaussian, StructuredCovariance, StructuredGaussian
from ..models import (
    BinaryGLMPosterior,
    ChunkedPosterior,
    ChunkedSoftmaxPosterior,
    SoftmaxGLMPosterior,
)
from ..models.dask_chunks import is_dask_array
from ..models.priors import GaussianPrior
from ._methods import MethodFit

__all__ = [
    "CARRIED_PROJECTION_NOTE",
    "as_prior",
    "carried_note",
    "carried_prior",
    "prior_specs",
    "problem_model",
]


def prior_specs(estimator, prior, classes: np.ndarray) -> list:
    """The list of per-problem prior specifications ``prior`` gives."""
    posteriors = getattr(prior, "posteriors_", None)
    if posteriors is not None:  # a fitted estimator: its posterior(s)
        if getattr(prior, "fit_intercept", estimator.fit_intercept) != estimator.fit_intercept:
            raise ValueError(
                f"prior is a fitted {type(prior).__name__} with fit_intercept="
                f"{prior.fit_intercept}; this estimator has fit_intercept="
                f"{estimator.fit_intercept}, so its parameters are not the same vector."
            )
        if not np.array_equal(prior.classes_, classes):
            raise ValueError(
                f"prior is a fitted {type(prior).__name__} of classes "
                f"{prior.classes_.tolist()!r}; this fit's classes are {classes.tolist()!r}."
            )
        # Its coefficients meet this X's columns by position: named columns must agree.
        fitted_names = getattr(prior, "feature_names_in_", None)
        names = getattr(estimator, "feature_names_in_", None)
        named = fitted_names is not None and names is not None
        if named and not np.array_equal(fitted_names, names):
            raise ValueError(
                f"prior is a fitted {type(prior).__name__} of the feature names "
                f"{list(map(str, fitted_names))!r}; this X's are {list(map(str, names))!r}. "
                f"Its coefficients are matched to X's columns by position: pass X's columns "
                f"in the prior's order (X[prior_names])."
            )
        return list(posteriors)
    if hasattr(prior, "fit") and not hasattr(prior, "mean"):
        if hasattr(prior, "classes_"):  # fitted, but holds no Gaussian posterior
            inner = getattr(prior, "estimator_", None)  # (a meta-estimator's fitted one)
            hint = ""
            if hasattr(inner, "posteriors_"):
                hint = (
                    f" Its estimator_ holds the posterior (under the chosen prior scales; "
                    f"{getattr(inner, 'n_features_in_', '?')} features): prior=it.estimator_."
                )
            raise ValueError(
                f"prior is a fitted {type(prior).__name__}, which holds no posterior: pass "
                f"a fitted vsbayes estimator (its posterior is the prior), a Gaussian, a "
                f"(mean, cov) pair or a dict.{hint}"
            )
        # (scikit-learn clones the values of a search's parameter grid, and clone unfits
        # an estimator: a fitted prior in GridSearchCV's grid arrived here unfitted, and
        # the user, who had fitted it, was told to fit it. FrozenEstimator's clone is
        # itself.)
        raise ValueError(
            f"prior is an unfitted {type(prior).__name__}: fit it first (its posterior is "
            f"the prior). A fitted one given in the parameter grid of GridSearchCV or "
            f"RandomizedSearchCV (or to sklearn.base.clone) is cloned there, which unfits "
            f"it: give sklearn.frozen.FrozenEstimator(fitted) instead, which stays fitted."
        )
    if isinstance(prior, list) or (
        isinstance(prior, tuple)
        and all(isinstance(p, (Gaussian, GaussianPrior, dict)) for p in prior)
    ):
        return list(prior)
    return [prior]


def as_prior(spec) -> GaussianPrior:
    """A :class:`GaussianPrior` from a Gaussian, a (mean, cov) pair or a dict."""
    if isinstance(spec, GaussianPrior):
        return spec
    if isinstance(spec, Gaussian):
        return GaussianPrior.from_gaussian(spec)
    if isinstance(spec, dict):
        unknown = set(spec) - {"mean", "cov", "precision"}
        if "mean" not in spec or unknown:
            raise ValueError(
                f"A prior dict has the keys 'mean' and 'cov' or 'precision'; got {sorted(spec)!r}."
            )
        return GaussianPrior(spec["mean"], spec.get("cov"), spec.get("precision"))
    if isinstance(spec, tuple) and len(spec) == 2:
        return GaussianPrior(*spec)
    given = repr(spec) if isinstance(spec, str) else type(spec).__name__
    raise ValueError(
        f"prior must be a fitted vsbayes estimator, a Gaussian, a (mean, cov) pair or a dict "
        f"with 'mean' and 'cov' or 'precision' (or a list of them, one per problem), or a "
        f"shrinkage prior (vsbayes.LaplacePrior, StudentTPrior, HorseshoePrior; the L1 and "
        f"elastic-net priors are also penalty='l1'/'elasticnet'); got "
        f"{given}."
    )


def problem_model(estimator, X, labels, n_classes, weights, prior: GaussianPrior):
    """``(model, finish)``: the likelihood model of one problem under ``prior``, and the
    map of its fit (a :class:`~vsbayes.estimators._methods.MethodFit`) to θ's coordinates
    (the identity but for a whitened prior). See the module docstring for the routes."""
    chunked = is_dask_array(X)
    n_jobs = getattr(estimator, "n_jobs", None)  # the sampling estimators' parameter
    in_memory = {} if chunked else {"n_jobs": n_jobs}
    d = X.shape[1]
    # An arrowhead prior (partial_fit's carried structured posterior) in its own
    # coordinates, rows in memory: θ' = (θ_rest − c θ_b, θ_b) has a diagonal prior.
    hub = n_classes is None and prior.hub is not None and not chunked
    whitened = n_classes is None and not prior.diagonal and not hub
    if n_classes is not None:  # multinomial: the model's full prior precision
        # Sized before the p × p precision is formed (numpy's MemoryError at 100,005
        # parameters): the structured covariance takes the default prior only.
        check_softmax_dims(
            n_classes, d + int(estimator.fit_intercept), X.shape[0], under_prior=True
        )
        priors = {
            "prior_var": 1.0,
            "intercept_prior_var": 1.0 if estimator.fit_intercept else None,
            "prior_mean": prior.mean,
            "prior_precision": prior.precision,
        }
    elif hub:
        X, priors = _hub_design(X, prior)
    elif not whitened:
        priors = {
            "prior_var": prior.variances[:d],
            "intercept_prior_var": prior.variances[d] if estimator.fit_intercept else None,
            "prior_mean": prior.mean,
        }
    else:
        X = _whitened_design(X, prior.lower, estimator.fit_intercept)
        priors = {
            "prior_var": 1.0,
            "intercept_prior_var": None,
            "prior_mean": prior.whitened_mean(),
        }
    if n_classes is None:
        if chunked:
            model = ChunkedPosterior(X, labels, weights, estimator._link, **priors)
        else:
            model = BinaryGLMPosterior(X, labels, weights, estimator._link, **in_memory, **priors)
    elif chunked:
        model = ChunkedSoftmaxPosterior(X, labels, weights, n_classes, **priors)
    else:
        model = SoftmaxGLMPosterior(X, labels, weights, n_classes, **in_memory, **priors)
    if hub:
        return model, functools.partial(_from_hub_coordinates, slope=prior.slope)
    if not whitened:
        return model, _identity
    return model, lambda fit: dataclasses.replace(fit, posterior=prior.unwhiten(fit.posterior))


def _identity(fit):
    return fit


def _hub_design(X, prior: GaussianPrior):
    """``(design, model priors)`` of a binary problem under an arrowhead ``prior`` in the
    coordinates ``θ' = (θ_rest − c θ_b, θ_b)`` (``c``: the prior's slope), where the prior
    is diagonal: the latent value ``x·θ_rest + θ_b = x·θ'_rest + (1 + x·c) θ_b``, so the
    design is ``[X, 1 + X c]`` without a separate intercept, and the prior N((μ_rest −
    c μ_b, μ_b), diag(conditional variances, s)). Sparse rows stay sparse (one dense
    column more)."""
    slope = prior.slope
    column = 1.0 + np.asarray(X @ slope, dtype=float).ravel()
    if sp.issparse(X):
        design = sp.hstack([X, sp.csr_matrix(column[:, None])], format="csr")
    else:
        design = np.column_stack([X, column])
    priors = {
        "prior_var": np.append(prior.conditional_variances, prior.variances[-1]),
        "intercept_prior_var": None,
        "prior_mean": np.append(prior.mean[:-1] - slope * prior.mean[-1], prior.mean[-1]),
    }
    return design, priors


def _from_hub_coordinates(fit, slope: np.ndarray):
    """A fit in the coordinates of :func:`_hub_design` mapped back to θ = T θ', ``T = I +
    g e_bᵀ`` (``g = (c, 0)``): the mean ``m + g m_b``; the covariance ``S + g S_bᵀ + S_b gᵀ
    + S_bb g gᵀ`` — for a structured ``diag(δ) + U K Uᵀ``, the factor ``[U + g U_b, g, e_b]``
    with the core ``K ⊕ δ_b [[1, 1], [1, 0]]`` (rank + 2, the diagonal unchanged). T's
    determinant is 1: the evidence is unchanged, and a structure's stated error (a bound on
    the variance of every linear combination) holds as it is."""
    posterior = fit.posterior
    g = np.append(slope, 0.0)
    mean = np.asarray(posterior.mean) + g * float(posterior.mean[-1])
    if not isinstance(posterior, StructuredGaussian):
        cov = np.asarray(posterior.cov)
        last = cov[-1]
        cov = cov + np.outer(g, last) + np.outer(last, g) + last[-1] * np.outer(g, g)
        return dataclasses.replace(fit, posterior=posterior.with_moments(mean, 0.5 * (cov + cov.T)))
    covariance = posterior.covariance
    factor = covariance.factor
    unit = np.zeros(g.size)
    unit[-1] = 1.0
    rank = covariance.rank
    core = np.zeros((rank + 2, rank + 2))
    core[:rank, :rank] = covariance.core
    core[rank:, rank:] = covariance.diagonal_part[-1] * np.array([[1.0, 1.0], [1.0, 0.0]])
    mapped = StructuredCovariance(
        covariance.diagonal_part,
        np.column_stack([factor + np.outer(g, factor[-1]), g, unit]),
        core,
        covariance.structure,
    )
    if isinstance(posterior, StructuredLaplaceResult):
        result = StructuredLaplaceResult(
            mean,
            mapped,
            posterior.log_Z,
            posterior.error,
            error_factor=posterior.error_factor,
            evidence_exact=posterior.evidence_exact,
            evidence_bounds=posterior.evidence_bounds,
            n_iter=posterior.n_iter,
            converged=posterior.converged,
            grad_norm=posterior.grad_norm,
            log_density_at_mode=posterior.log_density_at_mode,
        )
    else:
        result = StructuredGaussian(mean, mapped, posterior.log_Z, posterior.error)
    return dataclasses.replace(fit, posterior=result)


def _whitened_design(X, lower: np.ndarray, fit_intercept: bool):
    """``[X, 1] L`` (or ``X L``): dense; a dask array's chunks whitened where they are."""
    p = lower.shape[0]
    if is_dask_array(X):
        return X.map_blocks(
            _whiten_rows,
            lower,
            fit_intercept,
            dtype=float,
            chunks=(X.chunks[0], (p,)),
            meta=np.empty((0, 0)),
        )
    if sp.issparse(X):
        check_memory(
            8.0 * X.shape[0] * p,
            f"the whitened design ({X.shape[0]} × {p}, dense) of a prior with a full covariance",
            f"A sparse design stays sparse under a diagonal prior covariance; a full one "
            f"densifies it ({format_bytes(8.0 * X.shape[0] * p)}). Pass a diagonal prior "
            f"(variances), or fewer rows per fit (partial_fit in batches).",
        )
    return _whiten_rows(X, lower, fit_intercept)


def _whiten_rows(rows, lower: np.ndarray, fit_intercept: bool) -> np.ndarray:
    d = rows.shape[1]
    out = np.asarray(rows @ lower[:d])
    if fit_intercept:
        out = out + lower[d]
    return out


#: What a structured posterior's ``covariance_reason_`` adds in a stream.
CARRIED_PROJECTION_NOTE = (
    "; partial_fit carries it to the next batch with the coefficients independent given "
    "the intercept (the mean, the marginal variances and the intercept's covariances: "
    "assumed-density filtering, the Kullback-Leibler projection onto that family; the "
    "correlations between coefficients are dropped)"
)


def carried_prior(posterior: Gaussian, binary: bool, fit_intercept: bool) -> GaussianPrior:
    """The prior of the next batch from a problem's posterior: a dense one as it is; a
    ``binary`` (or one-vs-rest) structured one (its covariance never p × p) projected onto
    the Gaussians whose coefficients are independent given the intercept (an arrowhead
    precision; the diagonal ones without an intercept): its mean, marginal variances and
    the intercept's covariances with the coefficients — the moments that assumed-density
    filtering keeps under that family, its KL projection — held in O(p), which the next
    batch's structured fit takes as a diagonal prior in its own coordinates (:func:`_hub_design`;
    docs/decisions.md, D-112). The intercept, shared by every row, is correlated with
    every coefficient: a diagonal carried batch after batch over-counts it (its sd fell to
    0.35× the batch fit's). A multinomial fit under a prior has the dense covariance (its
    full prior precision): a structured multinomial posterior is made dense where that
    fits, else refused, naming what to do."""
    if binary and isinstance(posterior, StructuredGaussian):
        covariance = posterior.covariance
        variances = covariance.diagonal()
        if not fit_intercept:
            return GaussianPrior(posterior.mean, variances, name="carried posterior")
        unit = np.zeros(posterior.dim)
        unit[-1] = 1.0
        hub = covariance.dot(unit)[:-1]
        if not hub.any():  # the "diagonal" structure: no correlations to keep
            return GaussianPrior(posterior.mean, variances, name="carried posterior")
        return GaussianPrior.arrowhead(posterior.mean, variances, hub, name="carried posterior")
    return GaussianPrior.from_gaussian(posterior, name="carried posterior")


def carried_note(fit: MethodFit) -> MethodFit:
    """A stream's fit with its structured covariance's carriage in its reason."""
    if fit.covariance in (None, "dense") or not isinstance(fit.posterior, StructuredGaussian):
        return fit
    return dataclasses.replace(
        fit, covariance_reason=f"{fit.covariance_reason}{CARRIED_PROJECTION_NOTE}"
    )
