"""Structured posterior covariances (text scale): exact where the structure is exact, within
the stated error where it is approximate, and refused before any work where nothing fits."""

import copy
import warnings

import numpy as np
import pytest
import scipy.sparse as sp

import vsbayes
import vsbayes._memory as _memory
from vsbayes._blas import single_blas_thread
from vsbayes.approximations._glm_gaussian import GLMGaussian
from vsbayes.approximations.structured_laplace import (
    CovarianceChoice,
    _dual_structure,
    _exact_variances,
    _lowrank_structure,
    choose_covariance,
)
from vsbayes.exceptions import ConvergenceWarning, MemoryLimitError, UnreliableFitWarning
from vsbayes.gaussian import CentredStructuredCovariance, StructuredCovariance
from vsbayes.models import BinaryGLMPosterior
from vsbayes.models.latent import IndependentLatents, StructuredLatents

# Estimated evidences warn (D-178); the tests here are about the posterior's structure,
# and the one about that warning records it.
pytestmark = pytest.mark.filterwarnings(
    r"ignore:.*evidence \(log_marginal_likelihood_value_\) is an estimate"
    ":vsbayes.exceptions.UnreliableFitWarning"
)

M, P = 60, 150  # more features than rows: the dual form's regime


@pytest.fixture(autouse=True)
def one_thread():
    # Small matrices: BLAS's idle threads would spin (as in the fits themselves).
    with single_blas_thread():
        yield


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(3)
    X = sp.random(M, P, density=0.08, random_state=4, format="csr")
    X.data = rng.exponential(1.0, X.nnz)
    truth = np.zeros(P)
    truth[:15] = rng.normal(0.0, 3.0, 15)
    y = rng.random(M) < 1.0 / (1.0 + np.exp(-(X @ truth)))
    new_rows = sp.random(40, P, density=0.08, random_state=5, format="csr")
    return X, y, new_rows


def model_of(X, y, intercept=True):
    labels = np.where(y, 1.0, -1.0)
    return BinaryGLMPosterior(
        X,
        labels,
        np.ones(len(labels)),
        "logistic",
        prior_var=2.0,
        intercept_prior_var=1e6 if intercept else None,
    )


@pytest.fixture(scope="module")
def weights(data):
    return np.random.default_rng(6).uniform(0.02, 0.25, M)


@pytest.mark.parametrize("intercept", [True, False])
def test_the_dual_structure_is_the_dense_covariance(data, weights, intercept):
    model = model_of(*data[:2], intercept)
    dense = GLMGaussian(model, weights, form="primal").cov
    covariance = _dual_structure(model, GLMGaussian(model, weights, form="dual"))
    scale = np.abs(dense).max()
    np.testing.assert_allclose(covariance.toarray(), dense, rtol=0, atol=1e-12 * scale)
    np.testing.assert_allclose(covariance.diagonal(), np.diag(dense), rtol=1e-10)
    v = np.random.default_rng(0).standard_normal((model.dim, 3))
    np.testing.assert_allclose(covariance.dot(v), dense @ v, rtol=0, atol=1e-10 * scale)
    assert covariance.log_det() == pytest.approx(np.linalg.slogdet(dense)[1], abs=1e-9)
    # Σ^½ applied to the identity's rows: its Gram matrix is Σ (the draws' covariance).
    root = covariance.sample_normal(np.eye(model.dim))
    np.testing.assert_allclose(root.T @ root, dense, rtol=0, atol=1e-10 * scale)
    # xᵀΣ⁻¹x by Woodbury's identity (a negative definite core here: the data's).
    expected = np.einsum("ji,ji->i", v, np.linalg.solve(dense, v))
    np.testing.assert_allclose(covariance.inverse_quadratic(v.T), expected, rtol=1e-8)


@pytest.mark.parametrize("intercept", [True, False])
def test_the_exact_diagonal_and_evidence_match_the_dense_ones(data, weights, intercept):
    model = model_of(*data[:2], intercept)
    gaussian = GLMGaussian(model, weights, form="primal")
    var, half_log_det = _exact_variances(model, weights)
    np.testing.assert_allclose(var, np.diag(gaussian.cov), rtol=1e-10)
    assert half_log_det == pytest.approx(gaussian.half_log_det, abs=1e-9)
    covariance, *_ = _lowrank_structure(model, weights, 5, exact_diagonal=True)
    np.testing.assert_allclose(covariance.diagonal(), var, rtol=1e-10)


@pytest.mark.parametrize("rank", [0, 8])
def test_the_estimated_structure_keeps_its_stated_error(data, weights, rank):
    # Every variance within the stated factor 1 + λ_{r+1} of the exact one, both ways: the
    # marginals, the training rows (where the data term acts) and new rows.
    X, y, new_rows = data
    model = model_of(X, y)
    dense = GLMGaussian(model, weights, form="primal").cov
    covariance, _, _, factor, _ = _lowrank_structure(model, weights, rank, exact_diagonal=False)
    assert factor > 1.0
    approx = covariance.toarray()
    rows = sp.vstack([model.design, sp.hstack([new_rows, np.ones((40, 1))])]).toarray()
    rows = np.vstack([rows, np.eye(model.dim)])
    ratio = np.einsum("ij,jk,ik->i", rows, approx, rows) / np.einsum(
        "ij,jk,ik->i", rows, dense, rows
    )
    slack = 1e-6  # the randomized SVD's eigenvectors are exact to about this
    assert ratio.max() <= factor * (1 + slack) and ratio.min() >= 1 / factor * (1 - slack)
    # The density of the Gaussian the draws come from is the approximate covariance's.
    expected = np.einsum("ij,ji->i", rows[:5], np.linalg.solve(approx, rows[:5].T))
    np.testing.assert_allclose(covariance.inverse_quadratic(rows[:5]), expected, rtol=1e-8)


def test_structured_latents_are_the_dense_ones(data, weights):
    X, y, new_rows = data
    model = model_of(X, y)
    covariance = _dual_structure(model, GLMGaussian(model, weights, form="dual"))
    coef, intercept = np.linspace(-1, 1, P)[None], np.array([0.3])
    for rows in (new_rows, new_rows.toarray()):
        mean, var = StructuredLatents(rows, coef, intercept, covariance)(slice(None))
        ref_mean, ref_var = IndependentLatents(rows, coef, intercept, covariance.toarray()[None])(
            slice(None)
        )
        np.testing.assert_allclose(mean, ref_mean, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(var, ref_var, rtol=1e-10)


@pytest.fixture(scope="module")
def fits(data):
    X, y, _ = data
    out = {}
    for structure in ("dense", "dual", "lowrank"):
        with vsbayes.config_context(covariance=structure, covariance_rank=8):
            out[structure] = vsbayes.LaplaceLogisticRegression(C=2.0, tol=1e-12).fit(X, y)
    return out


def test_the_estimator_records_and_reads_the_structure(data, fits):
    _, _, new_rows = data
    dense, dual, lowrank = fits["dense"], fits["dual"], fits["lowrank"]
    assert (dense.covariance_structure_, dual.covariance_structure_) == ("dense", "dual")
    assert "forced" in lowrank.covariance_reason_ and "exact marginal" in lowrank.covariance_reason_
    assert isinstance(dual.sigma_, StructuredCovariance)
    # The dual structure is the Laplace posterior itself (up to Newton's tolerance).
    np.testing.assert_allclose(dual.coef_, dense.coef_, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(np.asarray(dual.sigma_), dense.sigma_, rtol=1e-6, atol=1e-9)
    assert dual.log_marginal_likelihood_value_ == pytest.approx(
        dense.log_marginal_likelihood_value_, abs=1e-7
    )
    np.testing.assert_allclose(
        dual.predict_proba(new_rows), dense.predict_proba(new_rows), rtol=0, atol=1e-8
    )
    # The low-rank one: the mode by conjugate-gradient Newton steps, the same; the marginals
    # and the evidence exact; the probabilities close (measured 0.0043 on these
    # strongly coupled features: 5 rows per feature, 12 features per row).
    np.testing.assert_allclose(lowrank.coef_, dense.coef_, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(lowrank.sigma_.diagonal(), np.diag(dense.sigma_), rtol=1e-6)
    assert lowrank.log_marginal_likelihood_value_ == pytest.approx(
        dense.log_marginal_likelihood_value_, abs=1e-6
    )
    assert np.abs(lowrank.predict_proba(new_rows) - dense.predict_proba(new_rows)).max() < 0.01
    table = lowrank.summary()
    np.testing.assert_allclose(table["sd"].to_numpy(), np.sqrt(np.diag(dense.sigma_)), rtol=1e-6)


def test_draws_follow_the_structured_posterior(fits):
    fit = fits["lowrank"]
    coef, intercept = fit.sample_coef(4000, random_state=0)
    draws = np.column_stack([coef[:, 0], intercept[:, 0]])
    sd = np.sqrt(fit.sigma_.diagonal())
    # Each mean within 5 standard errors (4000 draws), the sds within 10 %.
    mean = np.r_[fit.coef_[0], fit.intercept_]
    assert np.all(np.abs(draws.mean(axis=0) - mean) < 5 * sd / np.sqrt(4000))
    np.testing.assert_allclose(draws.std(axis=0), sd, rtol=0.1)


def test_auto_takes_a_structure_beyond_the_dense_size():
    rng = np.random.default_rng(0)
    X = sp.random(30, 5000, density=0.01, random_state=1, format="csr")
    y = rng.random(30) < 0.5
    fit = vsbayes.VSLogisticRegression().fit(X, y)
    assert fit.covariance_structure_ == "dual" and "4096" in fit.covariance_reason_
    assert fit.strategy_[0] == "laplace" and "dense covariance" in fit.strategy_reason_[0]
    assert fit.predict_proba(X[:5]).shape == (5, 2)
    with pytest.warns(UserWarning, match="Laplace approximation with a dual covariance"):
        vsbayes.VSLogisticRegression(strategy="global").fit(X, y)


def test_a_problem_that_cannot_fit_is_refused_before_any_work(data, monkeypatch):
    import vsbayes.estimators._base as base

    def no_work(*args, **kwargs):
        raise AssertionError("the fit started")

    monkeypatch.setattr(base, "glm_laplace", no_work)
    monkeypatch.setattr(base, "structured_glm_laplace", no_work)
    X, y, _ = data
    with (
        vsbayes.config_context(memory_limit=1000.0),
        pytest.raises(MemoryLimitError, match="No covariance structure fits"),
    ):
        vsbayes.VSLogisticRegression().fit(X, y)
    # A shrinkage prior keeps the dense covariance: its refusal names the Gaussian prior's
    # structure that fits, not the structured covariance it has no access to.
    with (
        vsbayes.config_context(memory_limit=4e5),
        pytest.raises(MemoryLimitError, match=r"penalty='l2'.*'(dual|lowrank|diagonal)'"),
    ):
        vsbayes.EPLogisticRegression(l1_ratio=1.0).fit(X, y)
    # A forced structure that does not fit names one that does.
    model = model_of(X, y)
    with (
        vsbayes.config_context(memory_limit=4e5, covariance="dense"),
        pytest.raises(MemoryLimitError, match=r"'(dual|lowrank|diagonal)' structure would"),
    ):
        choose_covariance(model)


def test_the_settings_are_checked_and_restored():
    before = vsbayes.get_config()
    with vsbayes.config_context(covariance="diagonal", memory_limit=2**30):
        assert vsbayes.get_config()["covariance"] == "diagonal"
        assert _memory.memory_limit() == 2**30
    assert vsbayes.get_config() == before
    with pytest.raises(ValueError, match="covariance must be one of"):
        vsbayes.set_config(covariance="full")
    with pytest.raises(ValueError, match="covariance_rank"):
        vsbayes.set_config(covariance_rank=0)
    assert CovarianceChoice("dense", "").rank == 0


def test_row_views_share_the_rows_and_equal_their_copies(data):
    from vsbayes.models.latent import _row_view

    X = data[0]
    for rows in (slice(0, 25), slice(25, None), slice(10, 10)):
        view = _row_view(X, rows)
        assert (view != X[rows]).nnz == 0 and view.shape == X[rows].shape
        assert view.nnz == 0 or np.shares_memory(view.data, X.data)


# --- The multinomial posterior ------------------------------------------------------------


@pytest.fixture(scope="module")
def multinomial_data():
    rng = np.random.default_rng(7)
    X = sp.random(90, 24, density=0.2, random_state=8, format="csr")
    X.data = rng.exponential(1.0, X.nnz)
    latent = X @ rng.normal(0.0, 2.0, (24, 3))
    proba = np.exp(latent - latent.max(axis=1, keepdims=True))
    proba /= proba.sum(axis=1, keepdims=True)
    y = (proba.cumsum(axis=1) < rng.random((90, 1))).sum(axis=1)
    new_rows = sp.random(30, 24, density=0.2, random_state=9, format="csr")
    return X, y, new_rows


@pytest.fixture(scope="module")
def multinomial_fits(multinomial_data):
    X, y, _ = multinomial_data
    out = {}
    # Full rank (the data term's rank is below 74 = 3 × 25 − 1): exact to Newton's and the
    # solves' tolerance; rank 2 (+ 2 intercept contrasts): within its stated factor.
    for name, settings in (
        ("dense", {"covariance": "dense"}),
        ("full", {"covariance": "lowrank", "covariance_rank": 200}),
        ("low", {"covariance": "lowrank", "covariance_rank": 2}),
    ):
        with vsbayes.config_context(**settings):
            out[name] = vsbayes.LaplaceLogisticRegression(tol=1e-12).fit(X, y)
    return out


def test_the_structured_multinomial_posterior_is_the_dense_one_at_full_rank(
    multinomial_data, multinomial_fits
):
    new_rows = multinomial_data[2]
    dense, full = multinomial_fits["dense"], multinomial_fits["full"]
    assert full.covariance_structure_ == "lowrank" and full.posteriors_[0].error_factor == 1.0
    assert isinstance(full.sigma_, StructuredCovariance)
    np.testing.assert_allclose(full.coef_, dense.coef_, rtol=0, atol=1e-7)
    np.testing.assert_allclose(full.coef_.sum(axis=0), 0.0, atol=1e-12)  # centred
    np.testing.assert_allclose(full.sigma_.diagonal(), np.diag(dense.sigma_), rtol=1e-6)
    assert full.log_marginal_likelihood_value_ == pytest.approx(
        dense.log_marginal_likelihood_value_, abs=1e-5
    )
    np.testing.assert_allclose(
        full.predict_proba(new_rows), dense.predict_proba(new_rows), rtol=0, atol=1e-6
    )
    table = full.summary()
    np.testing.assert_allclose(table["sd"].to_numpy(), dense.summary()["sd"].to_numpy(), rtol=1e-6)


def test_the_low_rank_multinomial_posterior_keeps_its_stated_error(multinomial_fits):
    dense, low = multinomial_fits["dense"], multinomial_fits["low"]
    factor = low.posteriors_[0].error_factor
    # Rank 2 + 2 intercept contrasts, [Q, SQ], and K = 3 for the intercepts' block.
    assert low.sigma_.rank == 2 * 4 + 3 and 1.0 < factor < np.inf
    ratio = low.sigma_.diagonal() / np.diag(dense.sigma_)
    assert np.all(ratio <= factor * (1 + 1e-8)) and np.all(ratio >= 1 / factor / (1 + 1e-8))
    # The shift directions (each column's classes together) are exact, the prior's, as the
    # dense posterior's: Σ n_j = c_j n_j (C = 1 for the coefficients, 10⁶ the intercepts).
    k, d = low.coef_.shape
    shift = np.zeros((low.sigma_.shape[0], 2))
    shift[np.arange(k) * d + 5, 0] = 1.0
    shift[k * d :, 1] = 1.0
    expected = shift * np.array([1.0, 1e6])
    # The intercepts' contrasts are exact (K solves), to the solves' tolerance.
    rows = k * d + np.arange(k)
    centring = np.eye(k) - 1.0 / k
    exact = np.diag(centring @ dense.sigma_[np.ix_(rows, rows)] @ centring)
    np.testing.assert_allclose(low.sigma_.contrast_variances()[rows], exact, rtol=1e-6)
    for fit in (low, dense):
        np.testing.assert_allclose(
            fit.sigma_.dot(shift) if fit is low else fit.sigma_ @ shift,
            expected,
            rtol=1e-8,
            atol=1e-8,
        )


def test_the_summary_says_how_far_its_variances_can_be(fits, multinomial_fits):
    """summary()'s attrs carry the structure and the bound on its variances: 1 where the
    table's are the exact ones (dense, dual, the exact marginals of a binary low rank),
    else the structure's recorded factor, which bounds the table's centred variances."""
    for fit in (fits["dense"], fits["dual"], fits["lowrank"], multinomial_fits["full"]):
        attrs = fit.summary().attrs
        assert attrs["covariance"] == fit.covariance_structure_
        assert attrs["variance_error_factor"] == 1.0
    dense, low = multinomial_fits["dense"], multinomial_fits["low"]
    attrs = low.summary().attrs
    factor = low.posteriors_[0].error_factor
    assert attrs["covariance"] == "lowrank" and attrs["variance_error_factor"] == factor > 1.0
    ratio = low.summary()["sd"].to_numpy() ** 2 / dense.summary()["sd"].to_numpy() ** 2
    assert np.all(ratio <= factor * (1 + 1e-8)) and np.all(ratio >= 1 / factor / (1 + 1e-8))
    # The ArviZ export's attributes carry them too.
    pytest.importorskip("arviz_base")
    exported = low.to_inference_data(n_draws=2, random_state=0)["posterior"].attrs
    assert exported["variance_error_factor"] == factor


@pytest.mark.parametrize("intercept, rank", [(True, 3), (False, 2), (True, 0)])
def test_a_centred_structured_covariance_is_its_dense_form(intercept, rank):
    # Σ = Π (diag(δ) + U K Uᵀ) Π + N diag(c) Nᵀ, written out densely.
    rng = np.random.default_rng(11)
    k, d = 3, 4
    width = d + int(intercept)
    p = k * width
    factor = rng.normal(size=(p, rank))
    core = np.diag(rng.uniform(-0.2, 1.0, rank))  # indefinite core, definite Σ
    diagonal = rng.uniform(0.5, 2.0, p)
    columns = rng.uniform(0.5, 3.0, width)
    shift_var = np.concatenate([np.tile(columns[:d], k), np.repeat(columns[d:], k)])
    sigma = CentredStructuredCovariance(diagonal, factor, core, k, d, shift_var)
    shifts = np.zeros((p, width))
    for j in range(width):
        entries = np.arange(k) * d + j if j < d else k * d + np.arange(k)
        shifts[entries, j] = 1.0 / np.sqrt(k)
    centring = np.eye(p) - shifts @ shifts.T
    base = np.diag(diagonal) + factor @ core @ factor.T
    dense = centring @ base @ centring + shifts @ np.diag(columns) @ shifts.T
    np.testing.assert_allclose(sigma.toarray(), dense, rtol=0, atol=1e-12)
    np.testing.assert_allclose(sigma.diagonal(), np.diag(dense), rtol=1e-12)
    np.testing.assert_allclose(
        sigma.contrast_variances(), np.diag(centring @ base @ centring), rtol=1e-12
    )
    np.testing.assert_allclose(sigma.dot(np.eye(p)), dense, rtol=0, atol=1e-12)
    assert sigma.log_det() == pytest.approx(np.linalg.slogdet(dense)[1], rel=1e-12)
    # sample_normal is a square root: the draws of the unit vectors are L's columns.
    root = sigma.sample_normal(np.eye(p)).T
    np.testing.assert_allclose(root @ root.T, dense, rtol=0, atol=1e-12)
    np.testing.assert_allclose(sigma.scaled(2.0).toarray(), 2.0 * dense, rtol=0, atol=1e-12)
    points = rng.normal(size=(5, p))
    expected = np.einsum("ij,ji->i", points, np.linalg.solve(dense, points.T))
    np.testing.assert_allclose(sigma.inverse_quadratic(points), expected, rtol=1e-10)
    z = rng.normal(size=(5, p))  # a draw L z is |z|² away from the mean
    np.testing.assert_allclose(
        sigma.inverse_quadratic(sigma.sample_normal(z)), (z * z).sum(axis=1), rtol=1e-10
    )
    with pytest.raises(ValueError, match="same for the classes"):
        CentredStructuredCovariance(diagonal, factor, core, k, d, np.arange(1.0, p + 1))


def test_structured_joint_latents_are_the_dense_ones(multinomial_data, multinomial_fits):
    from vsbayes.models.latent import JointLatents, StructuredJointLatents

    rows = multinomial_data[2]
    low = multinomial_fits["low"]
    args = (rows, low.coef_, low.intercept_)
    mean, cov = StructuredJointLatents(*args, low.sigma_)(slice(None))
    ref_mean, ref_cov = JointLatents(*args, low.sigma_.toarray())(slice(None))
    np.testing.assert_allclose(mean, ref_mean, rtol=0, atol=1e-12)
    # Centring cancels the intercepts' vague prior (10⁶ / K along their sum): round-off of
    # 10⁶ · eps per term.
    np.testing.assert_allclose(cov, ref_cov, rtol=0, atol=1e-8)


def test_auto_structures_the_multinomial_posterior_beyond_the_dense_size(
    multinomial_data, monkeypatch
):
    import sys

    X, y, new_rows = multinomial_data
    # (The module, not the package's function of the same name.)
    dense_route = sys.modules["vsbayes.approximations.softmax_laplace"]
    monkeypatch.setattr(dense_route, "MAX_SOFTMAX_PARAMS", 50)
    fit = vsbayes.VSLogisticRegression().fit(X, y)
    assert fit.covariance_structure_ == "lowrank" and "> 50 parameters" in fit.covariance_reason_
    proba = fit.predict_proba(new_rows)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-12)
    coef, intercept = fit.sample_coef(5, random_state=0)
    assert coef.shape == (5, 3, 24) and intercept.shape == (5, 3)
    with (
        vsbayes.config_context(covariance="dual"),
        pytest.raises(ValueError, match="no 'dual' covariance"),
    ):
        vsbayes.VSLogisticRegression().fit(X, y)
    with (
        vsbayes.config_context(memory_limit=1000.0),
        pytest.raises(MemoryLimitError, match="multinomial posterior"),
    ):
        vsbayes.VSLogisticRegression().fit(X, y)

    # partial_fit carries a dense posterior: refused before its prior's p × p precision is
    # formed (at 100,005 parameters that was NumPy's MemoryError), naming fit's route.
    def no_precision(self):
        raise AssertionError("the p × p prior precision was formed")

    monkeypatch.setattr(vsbayes.models.priors.GaussianPrior, "precision", property(no_precision))
    with pytest.raises(ValueError, match=r"A fit under a prior .* fit all the rows at once"):
        vsbayes.VSLogisticRegression().partial_fit(X, y, classes=np.unique(y))


def test_many_class_memory_check_counts_the_intercepts_solves():
    # 20 classes × 30 features on 40 rows: the intercepts' K solves over all 620
    # parameters (about 11 p K floats, measured) outweigh the diagonal structure's own
    # subspace, so a limit the diagonal alone would fit refuses before any work, naming
    # them; without intercepts the same limit fits.
    rng = np.random.default_rng(0)
    X, y = rng.standard_normal((40, 30)), np.arange(40) % 20
    with vsbayes.config_context(memory_limit=1e6):
        with pytest.raises(MemoryLimitError, match=r"intercepts.*fit_intercept=False"):
            vsbayes.LaplaceLogisticRegression().fit(X, y)
        fit = vsbayes.LaplaceLogisticRegression(fit_intercept=False, max_iter=2)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            assert fit.fit(X, y).covariance_structure_ in ("lowrank", "diagonal")


# --- What a user reaches from a structured fit --------------------------------------------


@pytest.mark.parametrize(
    "multinomial, settings",
    [
        (False, {"covariance": "lowrank", "covariance_rank": 4}),
        (False, {"covariance": "dual"}),
        (True, {"covariance": "lowrank", "covariance_rank": 2}),
    ],
    ids=["binary-lowrank", "binary-dual", "multinomial-lowrank"],
)
def test_callbacks_see_each_newton_iterate_with_its_structure(
    data, multinomial_data, multinomial, settings
):
    # Each iteration's fitted estimator is the fit max_iter iterations give: the Laplace
    # approximation at that iterate with the structured covariance built there (the
    # conjugate-gradient Hessian has no log-determinant, and the dense one is not formed).
    callback = pytest.importorskip("sklearn.callback")
    from sklearn.exceptions import ConvergenceWarning as SklearnConvergenceWarning
    from sklearn.metrics import log_loss

    from vsbayes.exceptions import ConvergenceWarning

    X, y, new_rows = multinomial_data if multinomial else data
    seen = []

    class Iterates:
        def setup(self, estimator, context):
            pass

        def on_fit_task_begin(self, estimator, context, *, fitted_estimator=None):
            pass

        def on_fit_task_end(self, estimator, context, *, X=None, fitted_estimator=None):
            if context.task_name == "newton iteration":
                seen.append(fitted_estimator)

        def teardown(self, estimator, context):
            pass

    monitor = callback.ScoringMonitor(scoring="neg_log_loss")
    with vsbayes.config_context(**settings):
        est = vsbayes.LaplaceLogisticRegression().set_callbacks(Iterates(), monitor).fit(X, y)
        assert len(seen) == est.n_iter_[0] >= 2
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", (ConvergenceWarning, SklearnConvergenceWarning))
            stopped = vsbayes.LaplaceLogisticRegression(max_iter=1).fit(X, y)
    first, last = seen[0], seen[-1]
    assert first.covariance_structure_ == settings["covariance"]
    assert isinstance(first.sigma_, StructuredCovariance)
    np.testing.assert_array_equal(first.coef_, stopped.coef_)
    np.testing.assert_array_equal(first.sigma_.diagonal(), stopped.sigma_.diagonal())
    assert first.log_marginal_likelihood_value_ == stopped.log_marginal_likelihood_value_
    np.testing.assert_array_equal(first.predict_proba(new_rows), stopped.predict_proba(new_rows))
    np.testing.assert_array_equal(last.coef_, est.coef_)  # the mode
    assert last.log_marginal_likelihood_value_ == est.log_marginal_likelihood_value_
    # The monitor scored every iterate's fitted estimator (on the training rows).
    scores = [
        r["neg_log_loss"] for r in monitor.get_logs().data if r["task_name"] == "newton iteration"
    ]
    assert len(scores) == len(seen) and np.all(np.isfinite(scores))
    assert scores[-1] == pytest.approx(-log_loss(y, est.predict_proba(X)), rel=1e-12)


@pytest.fixture(scope="module")
def loo_fits():
    # More rows than parameters (importance sampling's regime), exact structures: the dual
    # one, and the multinomial "lowrank" at full rank.
    rng = np.random.default_rng(3)
    X = sp.random(150, 12, density=0.3, random_state=4, format="csr")
    y = rng.random(150) < 1.0 / (1.0 + np.exp(-(X @ rng.normal(0.0, 1.0, 12))))
    latent = X @ rng.normal(0.0, 1.0, (12, 3))
    proba = np.exp(latent) / np.exp(latent).sum(axis=1, keepdims=True)
    classes = (proba.cumsum(axis=1) < rng.random((150, 1))).sum(axis=1)
    out = {}
    for name, labels, settings in (
        ("binary", y, {"covariance": "dual"}),
        ("multinomial", classes, {"covariance": "lowrank", "covariance_rank": 60}),
    ):
        fits = []
        for config in ({"covariance": "dense"}, settings):
            with vsbayes.config_context(**config):
                fits.append(vsbayes.LaplaceLogisticRegression(tol=1e-12).fit(X, labels))
        out[name] = (X, labels, *fits)
    return out


@pytest.mark.filterwarnings("ignore::vsbayes.exceptions.PSISWarning")  # (a row or two)
@pytest.mark.parametrize("problem", ["binary", "multinomial"])
def test_loo_draws_from_the_structure(loo_fits, problem, monkeypatch):
    X, labels, dense, structured = loo_fits[problem]
    scale = np.abs(dense.sigma_).max()  # (the intercepts' vague prior, along their shift)
    np.testing.assert_allclose(structured.sigma_.toarray(), dense.sigma_, rtol=0, atol=1e-9 * scale)
    reference = dense.loo(X, labels, n_draws=1000, random_state=0)

    def no_dense(self):
        raise AssertionError("the p × p covariance was formed")

    monkeypatch.setattr(StructuredCovariance, "toarray", no_dense)
    result = structured.loo(X, labels, n_draws=1000, random_state=0)
    # The same covariance, other draws: the same to Monte Carlo error (measured
    # differences up to 0.13 and 0.65 nats over 3 seeds, of ~87 and ~149).
    assert result.method == "psis" and result.posterior_pareto_k < 0.7
    assert result.elpd_loo == pytest.approx(reference.elpd_loo, abs=1.5)


@pytest.mark.filterwarnings("ignore::vsbayes.exceptions.PSISWarning")  # (random labels)
def test_loo_holds_one_copy_of_the_draws_beside_their_products():
    # Many parameters, few rows: the draws θ (S × p) dominate leave-one-out's memory. Drawn
    # all at once, z, θ and the structure's products held 3.2 θ (NumPy's MemoryError at
    # 4000 draws of 100,001 parameters, under an estimate of one θ); in blocks of draws,
    # θ and the rows' products' copy of it (2.07 θ measured).
    import tracemalloc

    import sklearn

    rng = np.random.default_rng(3)
    X = sp.random(30, 4000, density=0.05, random_state=4, format="csr")
    y = rng.random(30) < 0.5
    with vsbayes.config_context(covariance="dual"):
        fit = vsbayes.LaplaceLogisticRegression().fit(X, y)
    draws, theta_bytes = 200, 200 * 4001 * 8
    with sklearn.config_context(working_memory=16):
        tracemalloc.start()
        try:
            result = fit.loo(X, y, n_draws=draws, random_state=0)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert np.isfinite(result.elpd_loo)
    assert peak < 2.5 * theta_bytes
    # The estimate counts both copies, and the refusal says how many draws fit.
    with (
        vsbayes.config_context(memory_limit=1.5 * theta_bytes),
        pytest.raises(MemoryLimitError, match=r"200 posterior draws.*at most about 1\d\d fit"),
    ):
        fit.loo(X, y, n_draws=draws, random_state=0)


@pytest.fixture(scope="module")
def export_fits():
    # Text-like: more features than rows, forced structures — the binary one with estimated
    # marginal variances (the exact ones' row limit lowered), the multinomial low rank.
    from vsbayes.approximations import structured_laplace

    rng = np.random.default_rng(5)
    X = sp.random(200, 600, density=0.02, random_state=6, format="csr")
    X.data = rng.exponential(1.0, X.nnz)
    y = rng.random(200) < 1.0 / (1.0 + np.exp(-(X @ rng.normal(0.0, 2.0, 600))))
    classes = rng.integers(0, 3, 200)
    with (
        pytest.MonkeyPatch.context() as patch,
        vsbayes.config_context(covariance="lowrank", covariance_rank=4),
    ):
        patch.setattr(structured_laplace, "EXACT_DIAGONAL_MAX_ROWS", 100)
        binary = vsbayes.LaplaceLogisticRegression().fit(X, y)
        multinomial = vsbayes.LaplaceLogisticRegression().fit(X[:, :100], classes)
    return {"binary": (X, y, binary), "multinomial": (X[:, :100], classes, multinomial)}


@pytest.mark.parametrize("problem", ["binary", "multinomial"])
def test_the_export_of_a_structured_posterior_has_its_densities(export_fits, problem, monkeypatch):
    """``sample_stats``: ``log_q`` the structured Gaussian's density at the exported draws
    (scipy's of the dense covariance), ``lp`` the log-likelihood plus the prior, neither
    forming the p × p covariance."""
    pytest.importorskip("arviz_base")
    from scipy.stats import multivariate_normal

    from vsbayes._random import reproducible_generator
    from vsbayes.estimators._base import INTERCEPT_PRIOR_VAR

    X, labels, fit = export_fits[problem]
    posterior = fit.posteriors_[0]
    assert problem == "multinomial" or "estimated marginal" in fit.covariance_reason_
    dense = posterior.covariance.toarray()

    def no_dense(self):
        raise AssertionError("the p × p covariance was formed")

    monkeypatch.setattr(StructuredCovariance, "toarray", no_dense)
    tree = fit.to_inference_data(X, labels, n_draws=40, random_state=0)
    stats = tree["sample_stats"]
    # The export's own draws, as drawn (the multinomial tree holds them centred).
    theta = posterior.sample(40, reproducible_generator(0))
    k = len(fit.classes_) if problem == "multinomial" else 1
    coef = theta[:, :-k].reshape(40, k, -1)
    if problem == "multinomial":
        coef = coef - coef.mean(axis=1, keepdims=True)
    np.testing.assert_allclose(tree["posterior"]["coef"].values[0], coef, rtol=1e-12)
    expected = multivariate_normal(posterior.mean, dense).logpdf(theta)
    np.testing.assert_allclose(stats["log_q"].values[0], expected, rtol=1e-8)
    # lp: Σ_i log p(y_i | θ) + log N(θ; 0, diag(C, 10⁶ for the intercepts)), up to a constant.
    log_prior = (
        -0.5 * (theta[:, :-k] ** 2).sum(axis=1)
        - 0.5 * (theta[:, -k:] ** 2).sum(axis=1) / INTERCEPT_PRIOR_VAR
    )
    log_likelihood = tree["log_likelihood"]["y"].values[0].sum(axis=1)
    np.testing.assert_allclose(stats["lp"].values[0], log_likelihood + log_prior, rtol=1e-12)
    # The draws are sized before they are made: 40 draws fit, 4000 do not.
    per_draw = 8.0 * (3 * posterior.dim + X.shape[0])
    with (
        vsbayes.config_context(memory_limit=100 * per_draw),
        pytest.raises(MemoryLimitError, match=r"4000 posterior draws.*about 100 fit"),
    ):
        fit.to_inference_data(X, labels, n_draws=4000)


@pytest.mark.filterwarnings("ignore::vsbayes.exceptions.PSISWarning")  # (a row or two)
@pytest.mark.parametrize("problem", ["binary", "multinomial"])
def test_arviz_leave_one_out_of_a_structured_export_is_loo(loo_fits, problem):
    """ArviZ's leave-one-out of the approximation's draws, with the exported ``lp`` and
    ``log_q``, agrees with ``loo()``'s within its standard error."""
    pytest.importorskip("arviz_base")
    loo_approximate_posterior = pytest.importorskip("arviz_stats").loo_approximate_posterior
    X, labels, _, structured = loo_fits[problem]
    tree = structured.to_inference_data(X, labels, n_draws=1000, random_state=1)
    stats = tree["sample_stats"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # (ArviZ's k̂ of a row or two)
        theirs = loo_approximate_posterior(tree, log_p=stats["lp"], log_q=stats["log_q"])
    ours = structured.loo(X, labels, n_draws=1000, random_state=0)
    # Other draws of the same reweighting: measured 0.03-0.4 nats over 3 seeds (se 3.7, 7.2).
    assert abs(float(theirs.elpd) - ours.elpd_loo) < 0.2 * ours.se


@pytest.fixture(scope="module")
def binary_fits(multinomial_data):
    X, y, _ = multinomial_data
    with vsbayes.config_context(covariance="dual"):
        return {"dual": vsbayes.LaplaceLogisticRegression(tol=1e-12).fit(X, y == 0)}


def test_a_structured_posterior_is_carried_where_it_fits_and_refused_clearly(
    multinomial_data, binary_fits, multinomial_fits
):
    X, y, _ = multinomial_data
    with vsbayes.config_context(covariance="diagonal"):
        diagonal = vsbayes.LaplaceLogisticRegression().fit(X, y == 0)
    carried = vsbayes.models.priors.GaussianPrior.from_gaussian(diagonal.posteriors_[0])
    assert carried.diagonal  # its variances, exactly: no p × p matrix
    np.testing.assert_array_equal(carried.variances, diagonal.sigma_.diagonal())
    # Correlated: dense where that fits (here), else refused before any work, naming why.
    updated = vsbayes.LaplaceLogisticRegression(prior=binary_fits["dual"]).fit(X, y == 0)
    assert updated.covariance_structure_ == "dense"
    limit = 30_000.0  # the structures fit; their dense 25 × 25 (75 × 75) forms do not
    carries = [
        lambda: vsbayes.LaplaceLogisticRegression(prior=binary_fits["dual"]).fit(X, y == 0),
        lambda: copy.deepcopy(multinomial_fits["full"]).partial_fit(X[:5], y[:5]),
        lambda: vsbayes.LaplaceLogisticRegression(prior=multinomial_fits["full"]).fit(X, y),
    ]
    for carry in carries:
        with (
            vsbayes.config_context(memory_limit=limit),
            pytest.raises(MemoryLimitError, match=r"partial_fit, prior=.*structured"),
        ):
            carry()
    # partial_fit carries a binary structured posterior as its projection in O(p) (mean,
    # marginal variances, the intercept's covariances), never p × p: the fit of the batch
    # under that prior, whatever the memory limit.
    posterior = binary_fits["dual"].posteriors_[0]
    unit = np.zeros(posterior.dim)
    unit[-1] = 1.0
    projection = vsbayes.models.priors.GaussianPrior.arrowhead(
        posterior.mean, posterior.covariance.diagonal(), posterior.covariance.dot(unit)[:-1]
    )
    with vsbayes.config_context(memory_limit=limit):
        streamed = copy.deepcopy(binary_fits["dual"]).partial_fit(X[:5], (y == 0)[:5])
        reference = vsbayes.LaplaceLogisticRegression(prior=projection, tol=1e-12)
        reference.fit(X[:5], (y == 0)[:5])
    # (The same fit by two paths, a stream's batch and fit under the prior: equal to round-off.)
    np.testing.assert_allclose(streamed.coef_, reference.coef_, rtol=1e-10, atol=0)
    assert "given the intercept" not in reference.covariance_reason_
    # Below the dense covariance's memory, a binary batch under a diagonal prior takes a
    # structure, as fit does.
    with vsbayes.config_context(memory_limit=10_000.0):
        streamed = copy.deepcopy(diagonal).partial_fit(X[:5], (y == 0)[:5])
    assert streamed.covariance_structure_ == "dual"
    assert "given the intercept" in streamed.covariance_reason_


@pytest.mark.parametrize("problem", ["binary", "multinomial"])
def test_the_basis_of_draws_is_sized_before_it_is_formed(problem, fits, multinomial_fits):
    import pickle

    fit = fits["lowrank"] if problem == "binary" else multinomial_fits["low"]
    sigma = pickle.loads(pickle.dumps(fit.sigma_))  # nothing kept yet
    z = np.zeros((1, sigma.shape[0]))
    # Its two p × r arrays (the factored copy and the kept basis) exceed the limit.
    with vsbayes.config_context(memory_limit=1.5 * sigma.factor.nbytes):
        variances = sigma.diagonal()  # (needs no basis)
        with pytest.raises(MemoryLimitError, match=r"orthonormal basis .* lowrank .*rank="):
            sigma.sample_normal(z)
    np.testing.assert_array_equal(variances, fit.sigma_.diagonal())
    assert np.all(np.isfinite(sigma.sample_normal(z)))


@pytest.mark.parametrize("problem", ["binary", "multinomial"])
def test_reads_of_a_structured_posterior_reuse_their_first_call(
    problem, fits, multinomial_fits, multinomial_data, data, monkeypatch
):
    import pickle

    from sklearn.base import clone

    fit = fits["lowrank"] if problem == "binary" else multinomial_fits["low"]
    rows = data[2] if problem == "binary" else multinomial_data[2]
    first = fit.sample_coef(3, random_state=0), fit.summary(), fit.sigma_.diagonal()
    first_proba = fit.sample_proba(rows[:5], 3, random_state=1)
    # A fresh copy of the covariance computes once, then reads what it kept.
    sigma = pickle.loads(pickle.dumps(fit.sigma_))  # arrays writable again: not mutated
    factor = sigma.factor.copy()
    calls = []
    qr = vsbayes.gaussian.thin_qr
    monkeypatch.setattr(
        vsbayes.gaussian, "thin_qr", lambda a, **kw: calls.append(a.shape) or qr(a, **kw)
    )
    z = np.random.default_rng(2).standard_normal((3, sigma.shape[0]))
    once = sigma.sample_normal(z), sigma.log_det(), sigma.diagonal()
    n_bases = len(calls)
    assert n_bases == (1 if problem == "binary" else 2)  # (+ the shift directions' basis)
    twice = sigma.sample_normal(z), sigma.log_det(), sigma.diagonal()
    assert len(calls) == n_bases
    for a, b in zip(once, twice, strict=True):
        np.testing.assert_array_equal(a, b)
    twice[2][:] = -1.0  # each call's own array
    np.testing.assert_array_equal(sigma.diagonal(), once[2])
    np.testing.assert_array_equal(sigma.factor, factor)
    assert "_reads" not in pickle.loads(pickle.dumps(sigma)).__dict__
    # The estimator's reads: the same draws for the same seed, the same table, no new basis.
    calls.clear()
    coef, intercept = fit.sample_coef(3, random_state=0)
    np.testing.assert_array_equal(coef, first[0][0])
    np.testing.assert_array_equal(intercept, first[0][1])
    np.testing.assert_array_equal(fit.sample_proba(rows[:5], 3, random_state=1), first_proba)
    assert fit.summary().equals(first[1])
    np.testing.assert_array_equal(fit.sigma_.diagonal(), first[2])
    assert calls == []
    assert clone(fit).get_params() == fit.get_params()


def test_the_structured_softmax_fit_sizes_its_bases_and_solves_first():
    # The in-fit guards use choose_covariance's formulas (never stricter than the choice
    # made before any work); with a limit below them each names what it would allocate.
    from vsbayes.approximations import structured_softmax as module
    from vsbayes.models.softmax import SoftmaxGLMPosterior

    rng = np.random.default_rng(0)
    X, y = rng.standard_normal((30, 8)), np.arange(30) % 3
    model = SoftmaxGLMPosterior(X, y, np.ones(30), 3, prior_var=1.0, intercept_prior_var=1e2)
    theta = np.zeros(model.dim)
    data = module._SoftmaxDataTerm(model, model.probabilities(theta)[1])
    small = vsbayes.config_context(memory_limit=1000.0)
    with small, pytest.raises(MemoryLimitError, match=r"subspace iteration's 27 × 13 bases"):
        module._softmax_lowrank_structure(model, data, 2)
    covariance = module._softmax_lowrank_structure(model, data, 2)[0]
    small = vsbayes.config_context(memory_limit=1000.0)
    with small, pytest.raises(MemoryLimitError, match=r"intercept contrasts.*fit_intercept=False"):
        module._with_exact_intercepts(model, covariance, data, 2)


@pytest.mark.parametrize("structure", ["lowrank", "diagonal"])
def test_huge_C_on_a_structure_gives_a_valid_posterior_or_names_C(structure):
    # More features than rows: along the unseen directions the posterior keeps the prior's
    # variance C. The dual form carries C=1e300; the low-rank one raised numpy's
    # "Eigenvalues did not converge", the diagonal one squared C into inf, so that
    # predict_proba blamed the features' scale.
    X = sp.random(12, 40, density=0.2, random_state=0, format="csr")
    y = np.arange(12) % 2
    for C in (1e160, 1e300):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                with vsbayes.config_context(covariance=structure):
                    est = vsbayes.LaplaceLogisticRegression(C=C).fit(X, y)
            except ValueError as error:
                assert f"C={C:g}" in str(error) and "rows cannot span" in str(error)
                continue
        assert np.all(np.isfinite(est.sigma_.diagonal()))
        np.testing.assert_allclose(est.predict_proba(X), 0.5, atol=1e-6)


def test_unconverged_intercept_solves_keep_the_structure_and_say_so(monkeypatch):
    # The intercept contrasts' conjugate-gradient solves never converge on an
    # ill-conditioned precision (C=1e30: 10 × dim iterations, minutes at 3 × 4000, and the
    # unconverged solution used silently); capped, the structure's own estimate is kept.
    import vsbayes.approximations.structured_softmax as structured_softmax

    monkeypatch.setattr(structured_softmax, "_CG_MAX_ITER", 1)
    X = sp.random(9, 60, density=0.1, random_state=0, format="csr")
    y = np.arange(9) % 3
    with (
        vsbayes.config_context(covariance="lowrank"),
        pytest.warns(UnreliableFitWarning, match="conjugate-gradient"),
    ):
        est = vsbayes.LaplaceLogisticRegression().fit(X, y)
    proba = est.predict_proba(X)
    assert np.all(np.isfinite(proba)) and np.allclose(proba.sum(axis=1), 1.0)


@pytest.mark.parametrize("n_classes", [2, 3])
def test_an_estimated_evidence_is_bounded_and_warned_about(monkeypatch, n_classes):
    """A structure's estimated ``log det`` leaves the evidence an estimate (off by 40 nats
    on 600 × 300 sparse rows, 3 classes): the fit warns, with bounds that hold the exact
    Laplace evidence (the dense fit's: the bounds are the eigenvalues' left out, not an
    approximation), and an exact route does not warn."""
    import vsbayes.approximations.structured_laplace as structured

    monkeypatch.setattr(structured, "EXACT_DIAGONAL_MAX_ROWS", 0)  # binary: as over 4096 rows
    rng = np.random.default_rng(0)
    X = sp.random(200, 100, density=0.05, format="csr", random_state=0)
    y = np.argmax(
        X @ rng.standard_normal((100, n_classes)) * 3 + rng.gumbel(size=(200, n_classes)), axis=1
    )
    with (
        vsbayes.config_context(covariance="lowrank", covariance_rank=2),
        pytest.warns(UnreliableFitWarning, match="evidence .* is an estimate"),
    ):
        low = vsbayes.LaplaceLogisticRegression().fit(X, y)
    dense = vsbayes.LaplaceLogisticRegression().fit(X, y)
    assert dense.covariance_structure_ == "dense"
    bounds = low.posteriors_[0].evidence_bounds
    assert bounds[1] - bounds[0] > 1.0
    assert bounds[0] <= float(low.log_marginal_likelihood_value_) <= bounds[1]
    assert bounds[0] <= float(dense.log_marginal_likelihood_value_) <= bounds[1]
    exact = "dual" if n_classes == 2 else "dense"  # (the multinomial has no "dual")
    with vsbayes.config_context(covariance=exact), warnings.catch_warnings():
        warnings.simplefilter("error", UnreliableFitWarning)
        vsbayes.LaplaceLogisticRegression().fit(X, y)


def test_the_log_det_bounds_hold_the_exact_value():
    """The estimated ``log det(I + GᵀG)``'s bounds, from the trace and the Ritz values of
    any orthonormal basis (an eigenbasis, or a random one), hold the exact value."""
    from vsbayes.approximations.structured_laplace import _estimated_complement

    rng = np.random.default_rng(1)
    for _ in range(100):
        p, r = int(rng.integers(3, 30)), int(rng.integers(0, 4))
        G = rng.standard_normal((int(rng.integers(1, 40)), p)) * rng.exponential(size=p)
        H = G.T @ G
        exact = np.linalg.slogdet(np.eye(p) + H)[1]
        start = rng.standard_normal((p, r))
        if rng.random() < 0.5:
            start += 3.0 * np.linalg.eigh(H)[1][:, ::-1][:, :r]
        Q = np.linalg.qr(start)[0]
        lam, vectors = np.linalg.eigh(Q.T @ H @ Q)
        basis = Q @ vectors
        inside = np.maximum(1.0 - np.einsum("ij,ij->i", basis, basis), 0.0)
        _, _, (low, high) = _estimated_complement(basis, lam, np.diag(H).copy(), inside)
        assert low - 1e-9 * abs(exact) <= exact <= high + 1e-9 * abs(exact)


def test_every_fit_records_why_its_covariance_is_dense():
    # covariance_reason_ was "" on every dense fit (the choice's reason was kept for a
    # structured one only). A one-vs-rest fit's problems take the binary chooser, each
    # sized beside the others' posteriors (D-200), and say so.
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 3))
    y3 = np.digitize(X[:, 0], [-0.5, 0.5])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        binary = vsbayes.LaplaceLogisticRegression().fit(X, y3 > 0)
        one_vs_rest = vsbayes.LaplaceProbitRegression().fit(X, y3)
        stream = vsbayes.LaplaceProbitRegression()
        for i in range(2):
            stream.partial_fit(X[i : i + 1], y3[i : i + 1], classes=[0, 1, 2])
    assert binary.covariance_structure_ == "dense"
    assert "the dense covariance fits" in binary.covariance_reason_
    for reasons in (one_vs_rest.covariance_reason_, stream.covariance_reason_):
        assert len(reasons) == 3
    assert all(
        "3 one-vs-rest problems" in r and "the dense covariance fits" in r
        for r in one_vs_rest.covariance_reason_
    )
    assert all("stream begun with the dense covariance" in r for r in stream.covariance_reason_)


def test_predictions_factor_the_structured_covariance_once(monkeypatch):
    # Each predict_proba eigendecomposed the r × r core and rotated the p × r factor again,
    # O(p r²) a call whatever its rows: on a "dual" posterior (r = its rows + 2) of
    # 300 × 6000 sparse rows, 0.1-0.5 s to predict one row, against 2-7 ms once kept.
    rng = np.random.default_rng(0)
    X = sp.random(40, 300, density=0.05, format="csr", random_state=0)
    y = np.arange(40) % 2
    with vsbayes.config_context(covariance="dual"):
        model = vsbayes.LaplaceLogisticRegression().fit(X, y)
    expected = model.predict_proba(X[:3])
    calls = []
    eigh = np.linalg.eigh
    monkeypatch.setattr(np.linalg, "eigh", lambda a, *args, **kw: calls.append(1) or eigh(a))
    for _ in range(3):
        np.testing.assert_array_equal(model.predict_proba(X[:3]), expected)
        model.predict_proba(rng.random((1, 300)))
    assert len(calls) == 0  # the first call's factors are kept with the covariance


def test_a_limit_the_dense_multinomial_is_chosen_under_is_one_newton_starts_under():
    # The chooser sized the dense multinomial structure without the row block that
    # check_softmax_size counts (sklearn's working_memory / 4): under a limit between the
    # two counts it chose "dense" and Newton's method then refused the fit. Both now take
    # softmax_dense_bytes, so the fit falls back to a structured covariance and says so.
    from vsbayes.approximations.softmax_laplace import softmax_dense_bytes

    rng = np.random.default_rng(0)
    X, y = rng.standard_normal((30, 40)), np.arange(30) % 3
    dense_bytes = softmax_dense_bytes(3, 41, 30)
    limit = dense_bytes - _memory.block_bytes() + 8.0 * X.size * 4  # the old count's room
    assert limit < dense_bytes
    with vsbayes.config_context(memory_limit=limit), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        est = vsbayes.LaplaceLogisticRegression().fit(X, y)
    assert est.covariance_structure_ != "dense"
