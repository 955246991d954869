"""Bayesian updating: a general Gaussian prior, partial_fit, forgetting, Thompson draws."""

import pickle
import sys
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.integrate import quad
from scipy.special import expit, log_expit
from sklearn import metrics
from sklearn.datasets import load_breast_cancer, load_iris, make_classification
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import StandardScaler

import vsbayes as vb
from vsbayes import Gaussian, kl_divergence
from vsbayes.models.links import Link, get_link
from vsbayes.models.priors import GaussianPrior


@pytest.fixture(scope="module")
def cancer():
    X, y = load_breast_cancer(return_X_y=True)
    X = StandardScaler().fit_transform(X)[:, :6]
    order = np.random.default_rng(0).permutation(len(y))
    return X[order], y[order]


@pytest.fixture(scope="module")
def iris():
    X, y = load_iris(return_X_y=True)
    order = np.random.default_rng(1).permutation(len(y))
    return StandardScaler().fit_transform(X)[order], y[order]


def _posterior(estimator) -> Gaussian:
    return estimator.posteriors_[0]


def _correlated_prior(p: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    root = rng.normal(size=(p, p)) / np.sqrt(p)
    return rng.normal(size=p) * 0.3, root @ root.T + 0.5 * np.eye(p)


# --- the prior's checks ---------------------------------------------------------------


@pytest.mark.parametrize(
    "mean, cov, precision, message",
    [
        (np.zeros(3), np.eye(2), None, r"shape \(2, 2\).*must be \(3, 3\)"),
        (np.zeros(2), np.array([[1.0, 0.5], [0.0, 1.0]]), None, "not symmetric"),
        (np.zeros(2), np.array([[1.0, 2.0], [2.0, 1.0]]), None, "not positive definite"),
        (np.zeros(2), None, -np.eye(2), "not positive definite"),
        (np.zeros(2), np.eye(2), np.eye(2), "exactly one"),
        (np.zeros(2), np.array([1.0, -1.0]), None, "variances must be positive"),
        (np.array([0.0, np.nan]), np.eye(2), None, "finite vector"),
    ],
)
def test_a_bad_prior_is_a_value_error_naming_it(mean, cov, precision, message):
    with pytest.raises(ValueError, match=message):
        GaussianPrior(mean, cov, precision)


def test_a_sparse_covariance_or_precision_is_its_dense_self():
    """scipy.sparse (a diagonal one is how a wide prior is written) was a TypeError."""
    mean, cov = _correlated_prior(3)
    for sparse, dense in (
        ({"cov": sp.diags([1.0, 2.0, 4.0])}, {"cov": np.array([1.0, 2.0, 4.0])}),
        ({"precision": sp.diags([1.0, 2.0, 4.0])}, {"cov": 1.0 / np.array([1.0, 2.0, 4.0])}),
        ({"cov": sp.csr_matrix(cov)}, {"cov": cov}),
    ):
        a, b = GaussianPrior(mean, **sparse), GaussianPrior(mean, **dense)
        assert a.diagonal == b.diagonal
        np.testing.assert_allclose(a.cov, b.cov, rtol=1e-12)
    with pytest.raises(ValueError, match="variances must be positive"):
        GaussianPrior(mean, cov=sp.diags([1.0, 0.0, 1.0]))


def test_precision_and_covariance_give_the_same_prior():
    mean, cov = _correlated_prior(4)
    by_cov, by_precision = (
        GaussianPrior(mean, cov),
        GaussianPrior(mean, precision=np.linalg.inv(cov)),
    )
    np.testing.assert_allclose(by_precision.cov, by_cov.cov, rtol=1e-12, atol=1e-12)
    assert not by_cov.diagonal and GaussianPrior(mean, np.ones(4)).diagonal


def test_forgetting_mixes_the_natural_parameters():
    mean, cov = _correlated_prior(3)
    carried, original = GaussianPrior(mean, cov), GaussianPrior(np.zeros(3), 4.0 * np.ones(3))
    assert carried.forgotten(1.0, original) is carried
    mixed = carried.forgotten(0.3, original)
    expected = 0.3 * np.linalg.inv(cov) + 0.7 * np.eye(3) / 4.0
    np.testing.assert_allclose(mixed.precision, expected, rtol=1e-10)
    np.testing.assert_allclose(mixed.precision @ mixed.mean, 0.3 * np.linalg.solve(cov, mean))


# --- the prior in fit -------------------------------------------------------------------


@pytest.mark.parametrize("cls", [vb.LaplaceLogisticRegression, vb.EPProbitRegression])
def test_the_default_prior_given_explicitly_changes_nothing(cls, cancer):
    X, y = cancer
    plain = cls(C=0.5).fit(X, y)
    variances = np.r_[np.full(X.shape[1], 0.5), 1e6]
    given = cls(prior=(np.zeros(X.shape[1] + 1), variances)).fit(X, y)
    np.testing.assert_allclose(given.coef_, plain.coef_, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(given.sigma_, plain.sigma_, rtol=1e-9, atol=1e-12)
    assert given.log_marginal_likelihood_value_ == pytest.approx(
        plain.log_marginal_likelihood_value_, abs=1e-9
    )


def test_laplace_under_a_full_prior_is_the_exact_mode_and_curvature(cancer):
    """The whitened route against the log-posterior written out directly."""
    X, y = cancer[0][:150], cancer[1][:150]
    mean, cov = _correlated_prior(X.shape[1] + 1)
    fit = vb.LaplaceLogisticRegression(prior={"mean": mean, "cov": cov}, tol=1e-14).fit(X, y)
    design = np.hstack([X, np.ones((len(y), 1))])
    theta = np.r_[fit.coef_[0], fit.intercept_]
    signs = np.where(y == 1, 1.0, -1.0)
    precision = np.linalg.inv(cov)
    gradient = design.T @ (signs * expit(-signs * (design @ theta))) - precision @ (theta - mean)
    assert np.abs(gradient).max() < 1e-8
    p = expit(design @ theta)
    hessian = design.T @ (design * (p * (1 - p))[:, None]) + precision
    np.testing.assert_allclose(fit.sigma_, np.linalg.inv(hessian), rtol=1e-8, atol=1e-12)
    # The Laplace evidence, from the same terms (the whitening's Jacobian cancels).
    centred = theta - mean
    log_joint = log_expit(signs * (design @ theta)).sum() - 0.5 * centred @ precision @ centred
    log_joint -= 0.5 * np.linalg.slogdet(cov)[1]
    expected = log_joint - 0.5 * np.linalg.slogdet(hessian)[1]
    assert fit.log_marginal_likelihood_value_ == pytest.approx(expected, abs=1e-8)


class _QuadraticLink(Link):
    """``log F(t) = −(t − 1)²/2``: a Gaussian likelihood, under which Laplace is exact."""

    name = "quadratic"

    @staticmethod
    def log_cdf(t, out=None):
        return np.multiply(-0.5, np.square(t - 1.0), out=out)

    @staticmethod
    def log_pdf(t):
        raise NotImplementedError

    @staticmethod
    def derivatives(t):
        return 1.0 - t, np.ones_like(t)

    @staticmethod
    def predictive_log_proba(mean, var):
        raise NotImplementedError


class _GaussianLikelihoodLaplace(vb.LaplaceProbitRegression):
    _link = _QuadraticLink()


def test_prior_from_an_earlier_posterior_is_exact_under_a_gaussian_likelihood(cancer):
    """Fitting B under A's posterior is fitting A ∪ B, evidence included (chain rule)."""
    X, y = cancer
    half = len(y) // 2
    both = _GaussianLikelihoodLaplace().fit(X, y)
    first = _GaussianLikelihoodLaplace().fit(X[:half], y[:half])
    second = _GaussianLikelihoodLaplace(prior=first).fit(X[half:], y[half:])
    np.testing.assert_allclose(second.coef_, both.coef_, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(second.sigma_, both.sigma_, rtol=1e-8, atol=1e-14)
    chained = first.log_marginal_likelihood_value_ + second.log_marginal_likelihood_value_
    assert chained == pytest.approx(both.log_marginal_likelihood_value_, abs=1e-8)


@pytest.mark.parametrize("cls", [vb.LaplaceLogisticRegression, vb.EPLogisticRegression])
def test_prior_from_an_earlier_posterior_is_the_batch_fit_within_the_method_error(cls, cancer):
    X, y = cancer
    half = len(y) // 2
    both = cls().fit(X, y)
    second = cls(prior=cls().fit(X[:half], y[:half])).fit(X[half:], y[half:])
    # Assumed-density filtering's own error: A's likelihood replaced by a Gaussian
    # (measured 0.02-0.06 nats here, against 6-7 nats between prior and posterior).
    assert kl_divergence(_posterior(second), _posterior(both)) < 0.15


def test_variational_bayes_under_an_earlier_posterior(cancer):
    """VB's bound is tight only where ξ is, and its covariances are too narrow (half of
    Laplace's variances here), so the KL between two VB fits magnifies small mean shifts:
    the means agree to a tenth of a standard deviation of the exact posterior."""
    X, y = cancer
    half = len(y) // 2
    both = vb.VBLogisticRegression().fit(X, y)
    first = vb.VBLogisticRegression().fit(X[:half], y[:half])
    second = vb.VBLogisticRegression(prior=first).fit(X[half:], y[half:])
    exact_sd = np.sqrt(np.diag(vb.LaplaceLogisticRegression().fit(X, y).sigma_))
    shift = np.r_[second.coef_[0] - both.coef_[0], second.intercept_ - both.intercept_]
    assert np.all(np.abs(shift) < 0.75 * exact_sd)


def test_sparse_and_dask_designs_give_the_dense_result_under_a_full_prior(cancer):
    da = pytest.importorskip("dask.array")
    X, y = cancer[0][:200], cancer[1][:200]
    prior = _correlated_prior(X.shape[1] + 1)
    dense = vb.LaplaceLogisticRegression(prior=prior).fit(X, y)
    sparse = vb.LaplaceLogisticRegression(prior=prior).fit(sp.csr_matrix(X), y)
    chunked = vb.LaplaceLogisticRegression(prior=prior).fit(
        da.from_array(X, chunks=(64, -1)), da.from_array(y, chunks=64)
    )
    for other in (sparse, chunked):
        np.testing.assert_allclose(other.coef_, dense.coef_, rtol=1e-8, atol=1e-10)
        np.testing.assert_allclose(other.sigma_, dense.sigma_, rtol=1e-7, atol=1e-10)


def test_multinomial_ep_under_a_general_prior_is_its_diagonal_ep(iris):
    """The contrast EP's general-prior route, given the default prior as a full matrix."""
    from vsbayes.approximations import softmax_ep
    from vsbayes.models import SoftmaxGLMPosterior

    X, y = iris
    plain = SoftmaxGLMPosterior(X, y, np.ones(len(y)), 3, prior_var=1.0, intercept_prior_var=1e6)
    general = SoftmaxGLMPosterior(
        X, y, np.ones(len(y)), 3, prior_var=1.0, intercept_prior_var=1e6,
        prior_precision=np.diag(1.0 / plain.prior_var),
    )  # fmt: skip
    a, b = softmax_ep(plain), softmax_ep(general)
    np.testing.assert_allclose(b.mean, a.mean, atol=1e-9)
    np.testing.assert_allclose(b.cov, a.cov, rtol=1e-9, atol=1e-9)
    assert b.log_Z == pytest.approx(a.log_Z, abs=1e-9)


@pytest.mark.parametrize("cls", [vb.LaplaceLogisticRegression, vb.EPLogisticRegression])
def test_multinomial_prior_from_an_earlier_posterior(cls, iris):
    X, y = iris
    both = cls().fit(X, y)
    second = cls(prior=cls().fit(X[:75], y[:75])).fit(X[75:], y[75:])
    assert kl_divergence(_posterior(second), _posterior(both)) < 0.5


@pytest.mark.parametrize(
    "prior, message",
    [
        ((np.zeros(3), np.eye(3)), "prior has 3 parameters; this fit has 7"),
        ((np.zeros(7), -np.eye(7)), "not positive definite"),
        ("flat", "prior must be a fitted vsbayes estimator"),
        # a name for a shrinkage prior: the message names the prior objects and penalty=
        ("laplace", r"got 'laplace'.*LaplacePrior.*penalty='l1'|LaplacePrior.*got 'laplace'"),
        ({"mean": np.zeros(7)}, "exactly one of a covariance and a precision"),
        ("fitted LogisticRegression", "which holds no posterior"),
    ],
)
def test_fit_names_a_bad_prior(prior, message, cancer):
    if prior == "fitted LogisticRegression":
        prior = LogisticRegression().fit(*cancer)
    with pytest.raises(ValueError, match=message):
        vb.LaplaceLogisticRegression(prior=prior).fit(*cancer)


def test_a_prior_estimator_of_other_classes_is_refused(cancer, iris):
    with pytest.raises(ValueError, match="classes"):
        vb.LaplaceLogisticRegression(prior=vb.LaplaceLogisticRegression().fit(*iris)).fit(*cancer)


def test_a_prior_estimator_of_other_feature_names_is_refused(cancer):
    """The earlier posterior's coefficients are matched to this X's columns by position:
    a DataFrame with its columns reordered or renamed would mix them up silently."""
    pd = pytest.importorskip("pandas")
    X, y = cancer
    names = [f"f{j}" for j in range(X.shape[1])]
    frame = pd.DataFrame(X, columns=names)
    earlier = vb.LaplaceLogisticRegression().fit(frame[:100], y[:100])
    reordered = frame[[names[1], names[0], *names[2:]]][100:]
    for model in (
        vb.LaplaceLogisticRegression(prior=earlier),
        vb.EPLogisticRegression(prior=earlier),
    ):
        with pytest.raises(ValueError, match=r"feature names .*'f1', 'f0'"):
            model.fit(reordered, y[100:])
        with pytest.raises(ValueError, match="feature names"):
            model.partial_fit(reordered[:1], y[100:101], classes=[0, 1])
        assert not hasattr(model, "coef_")
    # The same columns, or an unnamed X (positional, as the prior's arrays), are taken.
    same = vb.LaplaceLogisticRegression(prior=earlier).fit(frame[100:], y[100:])
    unnamed = vb.LaplaceLogisticRegression(prior=earlier).fit(X[100:], y[100:])
    np.testing.assert_array_equal(same.coef_, unnamed.coef_)
    # An empirical-Bayes fit is no posterior: its message names the one it holds.
    chosen = vb.EmpiricalBayesClassifier(Cs=3, refine=False).fit(X[:100], y[:100])
    with pytest.raises(ValueError, match=r"estimator_"):
        vb.LaplaceLogisticRegression(prior=chosen).fit(X[100:], y[100:])


# --- partial_fit ------------------------------------------------------------------------


def test_streaming_matches_the_batch_fit(cancer):
    X, y = cancer
    batch = vb.LaplaceLogisticRegression().fit(X, y)
    stream = vb.LaplaceLogisticRegression()
    for start in range(0, len(y), 100):
        stream.partial_fit(X[start : start + 100], y[start : start + 100], classes=[0, 1])
    # Assumed-density filtering's error (measured 0.033 nats at batches of 100).
    assert kl_divergence(_posterior(stream), _posterior(batch)) < 0.1
    log_loss = -np.mean(stream.predict_log_proba(X)[np.arange(len(y)), y])
    batch_loss = -np.mean(batch.predict_log_proba(X)[np.arange(len(y)), y])
    assert log_loss <= 1.01 * batch_loss
    # ADF's running evidence: the sum of each batch's predictive evidence.
    assert stream.log_marginal_likelihood_value_ == pytest.approx(
        batch.log_marginal_likelihood_value_, abs=1.0
    )


def test_batches_of_one_row(cancer):
    X, y = cancer
    stream = vb.EPLogisticRegression()
    for i in range(30):
        stream.partial_fit(X[i : i + 1], y[i : i + 1], classes=[0, 1])
    batch = vb.EPLogisticRegression().fit(X[:30], y[:30])
    # ADF of single rows depends on their order; its means stay well inside the batch
    # posterior's spread (measured: within 0.8 standard deviations on 30 rows).
    shift = _posterior(stream).mean - _posterior(batch).mean
    assert np.all(np.abs(shift) < 1.0 * np.sqrt(np.diag(batch.sigma_)))


@pytest.mark.parametrize(
    "cls, moments, data",
    [
        (vb.ISLogisticRegression, vb.EPLogisticRegression, "cancer"),
        (vb.BMCProbitRegression, vb.EPProbitRegression, "cancer"),
        (vb.ISLogisticRegression, vb.EPLogisticRegression, "iris"),
    ],
)
def test_sampling_streams_of_one_row_take_the_exact_moments(cls, moments, data, request):
    """IS and BMC estimate the exact posterior's moments, which one row's update has to
    round-off (its tilted density's): their one-row calls take them, as VS's do, rather
    than an importance-sampling fit of a one-row posterior under a vague prior, whose
    errors the stream carried (30 rows: means several batch sds away)."""
    X, y = request.getfixturevalue(data)
    classes = np.unique(y)
    stream, reference = cls(random_state=0), moments()
    for i in range(30):
        for model in (stream, reference):
            model.partial_fit(X[i : i + 1], y[i : i + 1], classes=classes)
    a, b = _posterior(stream), _posterior(reference)
    np.testing.assert_allclose(a.mean, b.mean, rtol=0, atol=1e-10)
    np.testing.assert_allclose(a.cov, b.cov, rtol=0, atol=1e-10 * np.abs(b.cov).max())


@pytest.mark.parametrize(
    "cls, weight, sparse, decay",
    [
        (vb.LaplaceLogisticRegression, 1.0, False, 1.0),
        (vb.LaplaceProbitRegression, 2.5, True, 0.9),
        (vb.EPLogisticRegression, 1.0, True, 1.0),
        (vb.EPProbitRegression, 0.5, False, 0.9),
        (vb.VSLogisticRegression, 0.5, False, 1.0),
    ],
)
def test_one_row_update_is_the_general_fit(cls, weight, sparse, decay, cancer, monkeypatch):
    """The direct one-row update (Newton in the row's latent, or its tilted moments) and
    the general fit on that row: the same posterior, to the general fit's tolerance."""
    X, y = cancer
    X = X[:, :4]
    mean, cov = _correlated_prior(5, seed=3)
    # buffer_size=0: each row on its own (a stream's window also revisits earlier rows).
    direct, general = (cls(prior=(mean, cov), decay=decay, buffer_size=0) for _ in range(2))
    general._one_row_rule = lambda: None
    module = vb.estimators._site_window
    calls = []
    for name in ("row_laplace", "assumed_density_row"):
        original = getattr(module, name)
        monkeypatch.setattr(
            module, name, lambda *a, _f=original, **k: calls.append(1) or _f(*a, **k)
        )
    for k, classes in ((0, [0, 1]), (1, None), (2, None)):  # the given prior, then carried
        row = sp.csr_matrix(X[k : k + 1]) if sparse else X[k : k + 1]
        for model in (direct, general):
            model.partial_fit(row, y[k : k + 1], classes=classes, sample_weight=[weight])
        a, b = _posterior(direct), _posterior(general)
        scale = np.abs(b.cov).max()
        np.testing.assert_allclose(a.mean, b.mean, rtol=0, atol=1e-8 * np.sqrt(scale))
        np.testing.assert_allclose(a.cov, b.cov, rtol=0, atol=1e-8 * scale)
        assert direct.log_marginal_likelihood_value_ == pytest.approx(
            general.log_marginal_likelihood_value_, abs=1e-8
        )
    assert len(calls) == 3  # each row took the direct update
    if hasattr(direct, "strategy_"):
        assert (
            direct.strategy_[0] == "sites" and direct.strategy_reason_[0] == module.ONE_ROW_REASON
        )


def test_one_row_update_of_one_vs_rest_and_its_exceptions(iris, cancer):
    """One-vs-rest problems each take the direct update; a weight above 1 (power EP's
    copies) and a global VS fit asked by name take the general fit."""
    X, y = iris
    direct, general = vb.EPProbitRegression(), vb.EPProbitRegression()
    general._one_row_rule = lambda: None
    for model in (direct, general):
        model.partial_fit(X[:20], y[:20], classes=[0, 1, 2])
        model.partial_fit(X[20:21], y[20:21])
    assert direct.n_iter_.tolist() == [1, 1, 1]  # one tilted-moment match per problem
    np.testing.assert_allclose(direct.coef_, general.coef_, rtol=0, atol=1e-8)
    np.testing.assert_allclose(direct.sigma_, general.sigma_, rtol=0, atol=1e-8)
    heavy = vb.EPLogisticRegression().partial_fit(X[:20], y[:20] > 0, classes=[False, True])
    heavy.partial_fit(X[20:21], y[20:21] > 0, sample_weight=[3.0])
    assert heavy.n_iter_[0] > 1  # EP's sweeps
    Xc, yc = cancer
    vs = vb.VSLogisticRegression(strategy="global").partial_fit(Xc[:1], yc[:1], classes=[0, 1])
    assert vs.strategy_[0] == "global"


@pytest.mark.parametrize("fit_intercept", [True, False])
def test_a_vb_row_is_the_bound_optimum(fit_intercept, cancer, recwarn):
    """A VB one-row call is the Jaakkola–Jordan bound at its optimal ξ for the row: the
    bound's site on the latent t = aᵀθ, ``1/v̂ = 1/v + 2sλ(ξ)`` and ``m̂ = v̂(m/v + s/2)``,
    at ``ξ² = E[t²]``, rank one. Under the default intercept's N(0, 10⁶) the general fit's
    updates approach it too slowly (1000 updates left it 5 % short, and warned); without
    the intercept they reach it (to their tolerance)."""
    X, y = cancer
    weight = 2.5
    row, label = X[:1] * 3.0, y[:1]
    model = vb.VBLogisticRegression(fit_intercept=fit_intercept)
    model.partial_fit(row, label, classes=[0, 1], sample_weight=[weight])
    a = (2 * label[0] - 1) * (np.append(row[0], 1.0) if fit_intercept else row[0])
    prior_var = np.append(np.ones(6), 1e6) if fit_intercept else np.ones(6)
    m, v = 0.0, float(a**2 @ prior_var)
    post = _posterior(model)
    xi = post.xi[0]
    new_mean, new_var = float(a @ post.mean), float(a @ post.cov @ a)
    assert xi**2 == pytest.approx(new_var + new_mean**2, rel=1e-12)
    lam = np.tanh(xi / 2) / (4 * xi)
    new_precision = 1 / new_var
    assert new_precision == pytest.approx(1 / v + 2 * weight * lam, rel=1e-10)
    assert new_mean == pytest.approx(new_var * (m / v + weight / 2), rel=1e-10)
    # Rank one: the prior's covariance changed along Σ₀a only.
    gain = prior_var * a
    expected = np.diag(prior_var) - np.outer(gain, gain) * (v - new_var) / v**2
    np.testing.assert_allclose(post.cov, expected, rtol=0, atol=1e-12 * prior_var.max())
    assert not [w for w in recwarn if issubclass(w.category, vb.exceptions.ConvergenceWarning)]
    if not fit_intercept:
        general = vb.VBLogisticRegression(fit_intercept=False, tol=1e-15)
        general._one_row_rule = lambda: None
        general.partial_fit(row, label, classes=[0, 1], sample_weight=[weight])
        other = _posterior(general)
        np.testing.assert_allclose(post.mean, other.mean, rtol=0, atol=1e-7)
        np.testing.assert_allclose(post.cov, other.cov, rtol=0, atol=1e-7)
        assert post.log_Z == pytest.approx(other.log_Z, abs=1e-10)


@pytest.mark.parametrize(
    "cls, weight, scale, routes, tolerance",
    [
        # Cavities narrower than the VS fits need: EP's tilted moments, on the cavity alone
        # (row 0), then (row 1, which the factor narrows much) on its mixture with the
        # posterior's marginal, a fixed point of the passes.
        (vb.EPLogisticRegression, 1.0, 1.0, {"moments", "mixed"}, 1e-7),
        (vb.VSLogisticRegression, 0.5, 1.0, {"moments"}, 1e-7),
        # Wide cavities (largest variance above 16): the VS site fits.
        (vb.EPLogisticRegression, 1.0, 4.0, {"fits"}, 1e-7),
        (vb.VSLogisticRegression, 0.5, 4.0, {"fits"}, 1e-7),
        (vb.LaplaceLogisticRegression, 1.5, 4.0, set(), 1e-8),
    ],
)
def test_one_multinomial_row_is_the_general_fit(
    cls, weight, scale, routes, tolerance, iris, monkeypatch
):
    """One multinomial row by a rank-(K − 1) update (EP, VS: the multinomial EP's site of
    the row, tilted moments or VS fit, at EP's fixed point; Laplace: Newton in the row's
    contrasts) and the general fit of that row (EP's damped sweeps on its one site; VS
    asked for its sites; Laplace's Newton in θ): the same posterior, to EP's tolerance on
    the sites (1e-8, amplified by the inverses a site is made of: measured ~1e-9), or
    Laplace's."""
    X, y = iris
    # buffer_size=0: each row's own update (a stream's window also revisits earlier rows).
    direct, general = cls(buffer_size=0), cls(buffer_size=0)
    if cls is vb.VSLogisticRegression:
        general.set_params(strategy="sites")
    general._one_row_rule = lambda: None
    module = vb.estimators._site_window
    ep_module = sys.modules["vsbayes.approximations.softmax_ep"]
    sites_module = sys.modules["vsbayes.approximations.softmax_sites"]
    calls, taken = [], set()

    def spy(*args, _f=sites_module._sites, **kwargs):
        out = _f(*args, **kwargs)
        if calls and calls[-1] == "open":  # inside the direct update
            state = args[-2]
            taken.add("fits" if state.rules else "mixed" if state.direct[0] else "moments")
        return out

    # The one-row update calls _sites itself and through _new_sites: both modules' names.
    for site_module in (ep_module, sites_module):
        monkeypatch.setattr(site_module, "_sites", spy)
    for name in ("assumed_density_softmax_row", "softmax_row_laplace"):
        original = getattr(module, name)

        def direct_update(*a, _f=original, **k):
            calls.append("open")
            try:
                return _f(*a, **k)
            finally:
                calls[-1] = "done"

        monkeypatch.setattr(module, name, direct_update)
    mean, cov = _correlated_prior(15, seed=4)
    for model in (direct, general):
        model.set_params(prior=(mean, scale * cov))
    for k, classes in ((0, [0, 1, 2]), (1, None)):  # the given prior, then carried
        for model in (direct, general):
            model.partial_fit(X[k : k + 1], y[k : k + 1], classes=classes, sample_weight=[weight])
        a, b = _posterior(direct), _posterior(general)
        sd = np.sqrt(np.diag(b.cov))
        np.testing.assert_allclose(a.mean, b.mean, rtol=0, atol=tolerance * sd.max())
        np.testing.assert_allclose(a.cov, b.cov, rtol=0, atol=tolerance * sd.max() ** 2)
        assert direct.log_marginal_likelihood_value_ == pytest.approx(
            general.log_marginal_likelihood_value_, abs=tolerance
        )
    assert len(calls) == 2  # each row took the direct update
    assert taken == routes
    if cls is vb.VSLogisticRegression:
        assert direct.strategy_reason_[0] == module.ONE_SOFTMAX_ROW_REASON
    if cls is vb.EPLogisticRegression:  # a weight above 1 (power EP's copies): the sweeps
        direct.partial_fit(X[2:3], y[2:3], sample_weight=[2.0])
        assert len(calls) == 2


def test_one_multinomial_row_projects_its_site_as_ep(monkeypatch):
    """A VS fit of the softmax factor can come out slightly indefinite over its cavity:
    EP's sweeps project the site on the PSD cone, which moves the fixed point; the
    one-row update projects it too, and lands on EP's."""
    X, y = make_classification(
        200,
        3,
        n_informative=3,
        n_redundant=0,
        n_classes=4,
        n_clusters_per_class=1,
        random_state=0,
    )
    earlier = vb.LaplaceLogisticRegression().fit(X[:40], y[:40])
    # The sweeps (softmax_sites) and the one-row update (softmax_ep) look both names up.
    modules = [sys.modules[f"vsbayes.approximations.softmax_{name}"] for name in ("ep", "sites")]
    projected = []
    original = modules[1]._psd
    for module in modules:
        monkeypatch.setattr(
            module,
            "_psd",
            lambda lam: (lambda out: projected.append(out is not lam) or out)(original(lam)),
        )
        # This row's cavity is narrow, where EP takes the tilted moments: both fits are
        # asked for the VS site fits, which wide cavities take.
        monkeypatch.setattr(module, "_wide_rows", lambda widest: True)
    direct, general = (vb.EPLogisticRegression(prior=earlier, buffer_size=0) for _ in range(2))
    general._one_row_rule = lambda: None
    direct.partial_fit(X[69:70], y[69:70], classes=[0, 1, 2, 3])
    assert any(projected)  # the row's site was indefinite before its projection
    general.partial_fit(X[69:70], y[69:70], classes=[0, 1, 2, 3])
    a, b = _posterior(direct), _posterior(general)
    sd = np.sqrt(np.diag(b.cov))
    np.testing.assert_allclose(a.mean, b.mean, rtol=0, atol=1e-7 * sd.max())
    np.testing.assert_allclose(a.cov, b.cov, rtol=0, atol=1e-7 * sd.max() ** 2)


def test_partial_fit_multinomial_and_one_vs_rest(iris):
    X, y = iris
    for cls, shape in (
        (vb.LaplaceLogisticRegression, (15, 15)),
        (vb.EPProbitRegression, (3, 5, 5)),
    ):
        stream = cls()
        for start in range(0, len(y), 10):
            stream.partial_fit(X[start : start + 10], y[start : start + 10], classes=[0, 1, 2])
        assert stream.sigma_.shape == shape
        assert stream.score(X, y) > 0.9


def test_partial_fit_bad_input_is_refused_and_keeps_the_posterior(cancer):
    X, y = cancer
    model = vb.LaplaceLogisticRegression()
    with pytest.raises(ValueError, match="classes must be passed on the first call"):
        model.partial_fit(X[:10], y[:10])
    # As SGDClassifier's: a NaN class (it became a third class), a set (no order).
    for classes, message in (([0, 1, np.nan], "NaN"), ({0, 1}, "array-like")):
        with pytest.raises(ValueError, match=message):
            model.partial_fit(X[:10], y[:10], classes=classes)
    model.partial_fit(X[:50], y[:50], classes=[0, 1])
    kept = [np.array(g.mean) for g in model.posteriors_], model.sigma_.copy()
    buffer = model._stream_buffer  # 50 rows, short of buffer_size
    with pytest.raises(ValueError, match=r"classes=\[0, 1, 2\] is not the same"):
        model.partial_fit(X[50:60], y[50:60], classes=[0, 1, 2])
    with pytest.raises(ValueError, match=r"label\(s\) \[2\] outside classes"):
        model.partial_fit(X[50:52], np.array([0, 2]))
    with pytest.raises(ValueError, match="features"):
        model.partial_fit(X[50:60, :4], y[50:60])
    model.set_params(decay=1.5)
    with pytest.raises(ValueError, match="decay"):
        model.partial_fit(X[50:60], y[50:60])
    np.testing.assert_array_equal(model.posteriors_[0].mean, kept[0][0])
    np.testing.assert_array_equal(model.sigma_, kept[1])
    model.set_params(decay=1.0, class_weight={0: -1.0, 1: 1.0})
    with pytest.raises(ValueError, match="class_weight must give every class"):
        model.partial_fit(X[50:60], y[50:60])
    model.set_params(class_weight=None)
    row = X[50:51].copy()
    row[0, 2] = np.nan
    with pytest.raises(ValueError, match="NaN"):  # the one-row update validates as any batch
        model.partial_fit(row, y[50:51])
    np.testing.assert_array_equal(model.sigma_, kept[1])
    assert model._stream_buffer is buffer and buffer.n_rows == 50  # nothing lost
    model.partial_fit(X[50:51], y[50:51])  # one row, one class: fine under the prior


def test_partial_fit_refuses_dates_and_missing_labels_as_fit_does(cancer):
    # Its batches take their own validation: a datetime64 X fitted its nanosecond counts,
    # and text labels with a None failed in a sort ("'<' not supported").
    X, y = cancer
    dates = (np.datetime64("2020-01-01") + np.arange(10).astype("timedelta64[D]"))[:, None]
    with pytest.raises(ValueError, match="X holds dates or times"):
        vb.LaplaceLogisticRegression().partial_fit(dates, y[:10], classes=[0, 1])
    labels = np.array(["a", "b"] * 5, dtype=object)
    labels[3] = None
    with pytest.raises(ValueError, match="1 missing label"):
        vb.LaplaceLogisticRegression().partial_fit(X[:10], labels, classes=["a", "b"])


def _bad_batches():
    """Later batches that scikit-learn's validate_data refuses, by name: ``(X, y)`` from a
    valid one-row batch ``(row, label)`` of 4 features."""
    row, label = np.array([[0.5, -1.0, 2.0, 0.1]]), np.array([1])
    nan, inf = row.copy(), row.copy()
    nan[0, 1], inf[0, 2] = np.nan, np.inf
    return {
        "NaN": (nan, label),
        "inf": (inf, label),
        "NaN float32": (nan.astype(np.float32), label),
        "too few features": (row[:, :3], label),
        "too many features": (np.hstack([row, row]), label),
        "1-D X": (row[0], label),
        "3-D X": (row[None], label),
        "complex": (row.astype(complex), label),
        "strings": (np.array([["a", "b", "c", "d"]], dtype=object), label),
        "sparse NaN": (sp.csr_matrix(nan), label),
        "sparse too few features": (sp.csr_matrix(row[:, :3]), label),
        "NaN label": (row, np.array([np.nan])),
        "2-D labels": (np.vstack([row, row]), np.array([[1, 0], [0, 1]])),
        "labels of another length": (np.vstack([row, row]), label),
        "no rows": (row[:0], label[:0]),
    }


@pytest.fixture(scope="module")
def three_class_stream():
    """A 3-class stream of 4 features after a 5-row batch and a one-row call."""
    X, y = make_classification(20, 4, n_informative=3, n_redundant=0, n_classes=3, random_state=0)
    model = vb.EPLogisticRegression().partial_fit(X[:5], y[:5], classes=[0, 1, 2])
    return model.partial_fit(X[5:6], y[5:6])  # a one-row call on the fast path


@pytest.mark.parametrize("case", list(_bad_batches()))
def test_the_later_batches_fast_validation_refuses_what_validate_data_refuses(
    case, three_class_stream
):
    """A later call's ``(X, y)`` skip scikit-learn's validate_data where they are plain
    arrays it would pass as they are (its checks were a fifth of a one-row call): whatever
    it refuses — NaN or infinite values, a changed width, other dimensions, complex or
    string entries, a bad sparse row, bad labels — the call refuses with its error, and
    the posterior is kept."""
    from sklearn.utils.validation import validate_data

    model = three_class_stream
    sigma = model.sigma_.copy()
    bad_x, bad_y = _bad_batches()[case]
    with pytest.raises(Exception) as general:
        validate_data(
            model, bad_x, bad_y, accept_sparse="csr", dtype=[np.float64, np.float32], reset=False
        )
    with pytest.raises(type(general.value)) as ours:
        model.partial_fit(bad_x, bad_y)
    assert str(ours.value) == str(general.value)
    np.testing.assert_array_equal(model.sigma_, sigma)


def test_a_prior_changed_mid_stream_is_refused_where_it_would_be_ignored():
    """After the first batch, partial_fit continues from the posterior and reads prior only
    as what forgetting nears: a prior set (or an invalid one) mid-stream under decay=1
    would be ignored, so it is refused; set back, the stream continues."""
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(6, 3)), np.array([0, 1, 0, 1, 1, 0])
    given = (np.zeros(4), np.full(4, 2.0))
    model = vb.EPLogisticRegression(prior=given)
    for i in range(3):
        model.partial_fit(X[i : i + 1], y[i : i + 1], classes=[0, 1])
    for prior in ("nonsense", (np.zeros(7), np.ones(7)), None):
        model.set_params(prior=prior)
        with pytest.raises(ValueError, match=r"prior was changed .* would be ignored"):
            model.partial_fit(X[3:4], y[3:4])
    model.set_params(prior=tuple(np.array(a) for a in given))  # the same values: fine
    model.partial_fit(X[3:4], y[3:4])
    model.set_params(prior=(np.zeros(7), np.ones(7)), decay=0.9)  # read: checked
    with pytest.raises(ValueError, match="prior has 7 parameters"):
        model.partial_fit(X[4:5], y[4:5])


def test_c_changed_mid_stream_is_refused_where_it_would_be_ignored():
    """C (and liblinear's intercept_scaling) set the default prior, which a stream reads
    at its first batch only under decay=1: a change is refused as prior's is; under decay
    < 1 it is what forgetting nears, and is taken; with prior= given, C is unused."""
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(6, 3)), np.array([0, 1, 0, 1, 1, 0])
    model = vb.EPLogisticRegression().partial_fit(X[:2], y[:2], classes=[0, 1])
    for changed in ({"C": 1e-3}, {"penalty": None}):
        model.set_params(**changed)
        with pytest.raises(ValueError, match=r"(C|penalty)=.* after the stream's first batch"):
            model.partial_fit(X[2:3], y[2:3])
        model.set_params(C=1.0, penalty="l2")
    model.partial_fit(X[2:3], y[2:3])
    model.set_params(C=1e-3, decay=0.5)
    assert np.abs(model.partial_fit(X[3:4], y[3:4]).coef_).max() < 0.05
    given = vb.EPLogisticRegression(prior=(np.zeros(4), np.ones(4)))
    given.partial_fit(X[:2], y[:2], classes=[0, 1]).set_params(C=5.0)
    given.partial_fit(X[2:3], y[2:3])


@pytest.mark.parametrize("cls", [vb.LaplaceLogisticRegression, vb.VBLogisticRegression])
def test_fit_intercept_changed_mid_stream_is_refused(cls):
    """The carried posterior's parameter vector has the intercept it was fitted with: a
    later set_params(fit_intercept=...) failed inside a one-row update (a shape mismatch
    in matmul) or, on larger batches, was taken silently; it is refused, naming it."""
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(6, 3)), np.array([0, 1, 0, 1, 1, 0])
    model = cls().partial_fit(X[:2], y[:2], classes=[0, 1])
    model.set_params(fit_intercept=False)
    for rows in (slice(2, 3), slice(2, 5)):
        with pytest.raises(ValueError, match="fit_intercept was changed to False"):
            model.partial_fit(X[rows], y[rows])
    model.set_params(fit_intercept=True).partial_fit(X[2:3], y[2:3])  # set back: fine


@pytest.mark.parametrize("buffer_size", [0, 100])
@pytest.mark.parametrize("n_classes", [2, 3])
@pytest.mark.parametrize(
    "cls",
    [
        vb.VBLogisticRegression,
        vb.LaplaceLogisticRegression,
        vb.EPLogisticRegression,
        vb.VSLogisticRegression,
    ],
)
def test_an_all_zero_row_without_intercept_streams(cls, n_classes, buffer_size, recwarn):
    """An all-zero row without the intercept has a constant factor F(0)^s: its latent
    variance is zero, which the one-row updates divided by (VB raised a ValueError,
    Laplace a ZeroDivisionError, the window's revisit warned; the multinomial window
    raised a LinAlgError) and so did the general fit's EP, which such a row is handed to
    (RuntimeWarnings, a Laplace fallback). VB's row leaves the posterior as it was, its
    bound exact at ξ = 0 (log evidence − s log 2)."""
    rng = np.random.default_rng(2)
    X, y = rng.normal(size=(6, 3)), np.array([0, 1, 0, 1, 1, 0])
    if n_classes == 3:
        y = np.array([0, 1, 2, 1, 2, 0])
    X[[0, 3]] = 0.0
    model = cls(fit_intercept=False, buffer_size=buffer_size)
    for i in range(6):
        before = None if i == 0 else (model.coef_.copy(), model.log_marginal_likelihood_value_)
        model.partial_fit(
            X[i : i + 1], y[i : i + 1], classes=np.arange(n_classes), sample_weight=[1.5]
        )
        if i == 3 and buffer_size == 0 and n_classes == 2 and cls is vb.VBLogisticRegression:
            np.testing.assert_array_equal(model.coef_, before[0])
            evidence = model.log_marginal_likelihood_value_
            assert evidence == pytest.approx(before[1] - 1.5 * np.log(2.0), rel=1e-12)
    assert np.isfinite(model.coef_).all() and np.isfinite(model.sigma_).all()
    caught = (RuntimeWarning, vb.exceptions.UnreliableFitWarning)
    assert not [w for w in recwarn if issubclass(w.category, caught)]


@pytest.mark.parametrize("cls", [vb.EPLogisticRegression, vb.LaplaceLogisticRegression])
def test_a_batch_of_zero_weight_leaves_the_stream_as_it_was(cls):
    """A batch whose weights (sample_weight × class_weight) are all zero has likelihood 1:
    the posterior, window and evidence stay as they were (a one-row EP call failed inside
    its site update before); a stream cannot start with one."""
    rng = np.random.default_rng(1)
    X, y = rng.normal(size=(6, 3)), np.array([0, 1, 0, 1, 1, 0])
    with pytest.raises(ValueError, match=r"first batch's weights .* all zero"):
        cls().partial_fit(X[:2], y[:2], classes=[0, 1], sample_weight=[0.0, 0.0])
    model = cls(class_weight={0: 0.0, 1: 1.0})
    for i in (1, 0, 3):  # (a first row of class 1: of weight 1)
        model.partial_fit(X[i : i + 1], y[i : i + 1], classes=[0, 1])
    kept = model.posteriors_[0], model._stream_buffer, model.log_marginal_likelihood_value_
    model.partial_fit(X[5:6], y[5:6])  # class 0: weight 0
    model.partial_fit(X[2:5], y[2:5], sample_weight=[0.0, 0.0, 0.0])
    assert (model.posteriors_[0], model._stream_buffer) == kept[:2]
    assert model.log_marginal_likelihood_value_ == kept[2]


def test_a_forced_structure_that_a_fit_does_not_take_is_refused():
    """vsbayes.config_context(covariance=...) forcing a structured covariance on a fit that
    keeps the dense one (multinomial under a prior or streamed) is refused, naming the
    one-vs-rest estimator that takes it; a one-vs-rest fit of more than two classes takes
    it (D-200)."""
    rng = np.random.default_rng(2)
    X, y = rng.normal(size=(12, 3)), np.arange(12) % 3
    refused = r"asks for a structured covariance, which .* does not take"
    with vb.config_context(covariance="lowrank"):
        with pytest.raises(ValueError, match=refused + r".*OneVsRestClassifier"):
            vb.EPLogisticRegression().partial_fit(X[:1], y[:1], classes=[0, 1, 2])
        with pytest.raises(ValueError, match=refused + r".*OneVsRestClassifier"):
            vb.LaplaceLogisticRegression(prior=(np.zeros(12), np.ones(12))).fit(X, y)
        assert list(vb.LaplaceProbitRegression().fit(X, y).covariance_structure_) == ["lowrank"] * 3
        assert vb.LaplaceLogisticRegression().fit(X, y).covariance_structure_ == "lowrank"


def test_decay_forgets_a_drifted_past(cancer):
    """After the labels flip, a forgetting stream follows the new relation."""
    X, y = cancer
    flipped, cut = 1 - y, 470
    scores = {}
    for decay in (1.0, 0.99):
        model = vb.LaplaceLogisticRegression(decay=decay)
        for start in range(0, cut, 10):
            stop = min(start + 10, cut)
            model.partial_fit(X[start:stop], y[start:stop], classes=[0, 1])
        for start in range(cut, len(y), 10):
            model.partial_fit(X[start : start + 10], flipped[start : start + 10])
        scores[decay] = model.score(X[:400], flipped[:400])
    # Measured 0.90 with a memory of 100 rows, 0.63 without forgetting (the last refit of
    # the buffer, at row 500, weighs 70 old rows and 30 flipped ones alike).
    assert scores[0.99] > 0.85 > 0.75 > scores[1.0]


@pytest.mark.parametrize(
    "cls, data, decay, sparse",
    [
        (vb.EPLogisticRegression, "cancer", 0.9, False),
        (vb.LaplaceLogisticRegression, "iris", 1.0, True),  # multinomial, a sparse batch
        (vb.VSLogisticRegression, "cancer", 1.0, True),  # the default estimator
    ],
)
def test_a_refit_is_the_fit_of_the_buffer_under_the_anchor(cls, data, decay, sparse, request):
    """When the buffer reaches buffer_size rows, the posterior is the method's fit of its
    rows under the posterior from before them, forgotten by decay**(rows), each row
    weighing decay**(rows after its batch); the running evidence goes on from there."""
    X, y = request.getfixturevalue(data)
    classes = np.unique(y)
    model = cls(buffer_size=6, decay=decay).partial_fit(X[:30], y[:30], classes=classes)
    assert model._stream_buffer is None  # a batch of buffer_size rows or more: no buffer
    anchor, anchor_evidence = model.posteriors_, model.log_marginal_likelihood_value_
    for start, stop in ((30, 32), (32, 33)):
        rows = sp.csr_matrix(X[start:stop]) if sparse else X[start:stop]
        model.partial_fit(rows, y[start:stop])
    assert model._stream_buffer.n_rows == 3 and model._stream_buffer.sparse == sparse
    model.partial_fit(X[33:36], y[33:36])  # 6 rows: the refit (a dense batch joins)
    assert model._stream_buffer is None
    original = model._default_prior(
        X.shape[1], len(classes) if len(classes) > 2 else None, model._priors(X, None, False)
    )
    prior = GaussianPrior.from_gaussian(anchor[0]).forgotten(decay**6, original)
    weights = decay ** np.array([4.0, 4.0, 3.0, 0.0, 0.0, 0.0])
    expected = cls(prior={"mean": prior.mean, "precision": prior.precision}).fit(
        X[30:36], y[30:36], sample_weight=weights
    )
    a, b = model.posteriors_[0], expected.posteriors_[0]
    scale = np.abs(b.cov).max()
    np.testing.assert_allclose(a.mean, b.mean, rtol=0, atol=1e-8 * np.sqrt(scale))
    np.testing.assert_allclose(a.cov, b.cov, rtol=0, atol=1e-8 * scale)
    assert model.log_marginal_likelihood_value_ == pytest.approx(
        anchor_evidence + expected.log_marginal_likelihood_value_, abs=1e-8
    )


def test_the_buffer_is_bounded_pickled_and_reset_by_fit(cancer):
    X, y = cancer
    model = vb.EPLogisticRegression(buffer_size=5)
    held = []
    for i in range(0, 14, 2):  # batches of two rows: the buffer refitted at 5 rows or more
        model.partial_fit(X[i : i + 2], y[i : i + 2], classes=[0, 1])
        held.append(0 if model._stream_buffer is None else model._stream_buffer.n_rows)
    assert held == [2, 4, 0] * 2 + [2]  # fewer than buffer_size rows, always
    copy = pickle.loads(pickle.dumps(model))
    for stream in (model, copy):  # two more: a refit of the pickled buffer's rows
        stream.partial_fit(X[14:18], y[14:18])
    np.testing.assert_array_equal(copy.sigma_, model.sigma_)
    assert model.log_marginal_likelihood_value_ == copy.log_marginal_likelihood_value_
    model.fit(X[:20], y[:20])
    assert not hasattr(model, "_stream_buffer")  # partial_fit goes on from the fit
    fitted = model.posteriors_[0]
    model.partial_fit(X[20:22], y[20:22])
    assert model._stream_buffer.n_rows == 2
    np.testing.assert_array_equal(model._stream_buffer.anchor[0].mean, fitted.mean)
    pure = vb.EPLogisticRegression(buffer_size=0)
    for i in range(3):
        pure.partial_fit(X[i : i + 1], y[i : i + 1], classes=[0, 1])
    assert pure._stream_buffer is None  # no buffer: each batch on its own


def test_the_window_of_one_row_calls_is_bounded_pickled_and_frozen(cancer):
    """One-row calls keep the last buffer_size rows' sites (never refitting them all at
    once); a pickled stream goes on alike; a larger batch freezes the window (its sites
    stay in the posterior) and starts the buffer of batches."""
    X, y = cancer
    model = vb.VSLogisticRegression(buffer_size=4)
    held = []
    for i in range(7):
        model.partial_fit(X[i : i + 1], y[i : i + 1], classes=[0, 1])
        held.append(model._stream_buffer.n_rows)
    assert held == [1, 2, 3, 4, 4, 4, 4]
    assert model.strategy_reason_[0] == vb.estimators._site_window.WINDOW_ROW_REASON
    copy = pickle.loads(pickle.dumps(model))
    for stream in (model, copy):
        stream.partial_fit(X[7:8], y[7:8])
    np.testing.assert_array_equal(copy.sigma_, model.sigma_)
    assert model.log_marginal_likelihood_value_ == copy.log_marginal_likelihood_value_
    before = _posterior(model)
    model.partial_fit(X[8:10], y[8:10])  # two rows: the window frozen, a buffer of batches
    assert model._stream_buffer.n_rows == 2
    np.testing.assert_array_equal(model._stream_buffer.anchor[0].mean, before.mean)


@pytest.mark.parametrize(
    "cls, decay",
    [
        (vb.EPLogisticRegression, 0.95),
        (vb.LaplaceProbitRegression, 1.0),
        (vb.VBLogisticRegression, 0.95),
    ],
)
def test_the_window_holds_the_sites_the_posterior_is_made_of(cls, decay, cancer):
    """After one-row calls from a prior, the posterior's natural parameters are the
    prior's plus the window's sites (forgetting toward that prior scales both alike)."""
    X, y = cancer
    mean, cov = _correlated_prior(7, seed=1)
    model = cls(prior=(mean, cov), decay=decay, buffer_size=50)
    for i in range(30):
        model.partial_fit(X[i : i + 1], y[i : i + 1], classes=[0, 1])
    window = model._stream_buffer
    rows = window.labels[0, :, None] * window.rows
    precision = np.linalg.inv(cov) + (rows.T * window.tau[0]) @ rows
    shift = np.linalg.solve(cov, mean) + rows.T @ window.nu[0]
    posterior = _posterior(model)
    np.testing.assert_allclose(np.linalg.inv(posterior.cov), precision, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(np.linalg.solve(posterior.cov, posterior.mean), shift, atol=1e-7)
    assert window.visited.min() > 1  # every row's site revisited since it came


@pytest.mark.parametrize(
    "cls, tolerance",
    [
        # The direct update's Newton stops at its tolerance (there 5e-7 from the mode in
        # the latent); the window's mode is the tilted density's to 1e-13 (checked below).
        (vb.LaplaceLogisticRegression, 3e-6),
        (vb.EPProbitRegression, 1e-8),  # the closed form
        (vb.VSLogisticRegression, 3e-7),  # the narrow rule, or the mixture of probits
        (vb.VBLogisticRegression, 1e-12),  # the same root of the bound's equation in ξ
    ],
)
def test_a_stream_first_row_is_the_direct_update(cls, tolerance, cancer):
    """A window's first row (nothing to revisit) is the one-row update of its prior, its
    evidence and (Laplace) its mode's diagnostics too."""
    X, y = cancer
    mean, cov = _correlated_prior(7, seed=2)
    window, alone = cls(prior=(mean, cov)), cls(prior=(mean, cov), buffer_size=0)
    for model in (window, alone):
        model.partial_fit(X[:1], y[:1], classes=[0, 1], sample_weight=[0.7])
    assert window._stream_buffer.n_rows == 1 and alone._stream_buffer is None
    a, b = _posterior(window), _posterior(alone)
    scale = np.abs(b.cov).max()
    np.testing.assert_allclose(a.mean, b.mean, rtol=0, atol=tolerance * np.sqrt(scale))
    np.testing.assert_allclose(a.cov, b.cov, rtol=0, atol=tolerance * scale)
    assert a.log_Z == pytest.approx(b.log_Z, abs=tolerance)
    if isinstance(b, vb.engine.LaplaceResult):
        assert a.log_density_at_mode == pytest.approx(b.log_density_at_mode, abs=tolerance)
        # The mode of 0.7 log σ(t) + log N(t; m, v) in the row's latent, and its curvature.
        row = (2 * y[0] - 1) * np.append(X[0], 1.0)
        m, v = row @ mean, row @ cov @ row
        t = m
        for _ in range(30):
            curvature = 0.7 * expit(t) * expit(-t)
            t -= (0.7 * expit(-t) - (t - m) / v) / (-curvature - 1.0 / v)
        assert row @ a.mean == pytest.approx(t, abs=1e-12)
        assert row @ a.cov @ row == pytest.approx(1.0 / (curvature + 1.0 / v), rel=1e-12)
        assert a.grad_norm < 1e-10


@pytest.mark.parametrize(
    "cls", [vb.EPLogisticRegression, vb.LaplaceLogisticRegression, vb.VBLogisticRegression]
)
def test_revisiting_every_site_reaches_the_batch_fit(cls, cancer, monkeypatch):
    """Revisits are EP's updates (Laplace: Laplace propagation's, whose fixed point is the
    joint mode; VB: each row's ξ at the bound's optimum given the others, coordinate ascent
    on the joint bound): revisiting every row at each call takes the stream to the batch
    fit, where assumed-density filtering stays an order-dependent distance away."""
    X, y = cancer
    monkeypatch.setattr(vb.estimators._site_window, "REVISITS", 60)
    # VB's updates, the batch fit's and the revisits alike, near the optimum linearly.
    calls, options = (30, {"tol": 1e-15}) if cls is vb.VBLogisticRegression else (10, {})
    streams = {}
    for size in (0, 60):
        streams[size] = stream = cls(buffer_size=size)
        for i in range(40):
            stream.partial_fit(X[i : i + 1], y[i : i + 1], classes=[0, 1])
        for _ in range(calls):  # revisits only: the same row again, at weight ~0
            stream.partial_fit(X[39:40], y[39:40], sample_weight=[1e-12])
    batch = _posterior(cls(**options).fit(X[:40], y[:40]))
    # Measured 9e-12 (EP), 4e-9 (Laplace), 1.3e-9 (VB).
    assert kl_divergence(batch, _posterior(streams[60])) < 1e-6
    assert kl_divergence(batch, _posterior(streams[0])) > 1e-2


@pytest.mark.parametrize(
    "cls, decay, sparse",
    [(vb.LaplaceLogisticRegression, 1.0, False), (vb.LaplaceProbitRegression, 0.9, True)],
)
def test_laplace_batches_within_the_window_are_the_batch_fit(cls, decay, sparse, cancer):
    """A Laplace batch is fitted jointly with the window's rows (one-row calls' too) under
    the posterior without their sites: while every row is in the window, the stream is
    the batch fit of its rows, each weighing decay**(rows after its batch), and (decay 1)
    its running evidence the batch fit's, to Newton's stop (tol=1e-12: the batch fit's
    gradient is left at ~1e-6)."""
    X, y = cancer
    model = cls(tol=1e-12, decay=decay)
    for i in range(3):  # one-row calls, then batches: one window
        model.partial_fit(X[i : i + 1], y[i : i + 1], classes=[0, 1])
    for start in range(3, 45, 7):
        rows = sp.csr_matrix(X[start : start + 7]) if sparse else X[start : start + 7]
        model.partial_fit(rows, y[start : start + 7])
    assert model._stream_buffer.n_rows == 45
    after = np.r_[[44.0, 43.0, 42.0], 42.0 - 7.0 * (np.arange(42) // 7 + 1)]
    batch = cls(tol=1e-12).fit(X[:45], y[:45], sample_weight=decay**after)
    a, b = _posterior(model), _posterior(batch)
    scale = np.abs(b.cov).max()
    np.testing.assert_allclose(a.mean, b.mean, rtol=0, atol=1e-5 * np.sqrt(scale))
    np.testing.assert_allclose(a.cov, b.cov, rtol=0, atol=1e-5 * scale)
    if decay == 1.0:
        assert a.log_Z == pytest.approx(b.log_Z, abs=1e-5)


@pytest.mark.parametrize("n_rows", [3, 20])
@pytest.mark.parametrize("cls", [vb.LaplaceLogisticRegression, vb.LaplaceProbitRegression])
def test_a_laplace_batch_after_one_row_calls_has_the_batch_fits_evidence(n_rows, cls, cancer):
    """One-row calls credit the running evidence with each row's evidence given the
    posterior before it (ADF); a batch call that then refits every row of the window
    under the prior is the batch fit, and so is its running evidence: the one-row
    calls' terms are replaced, not kept beside the joint fit's (they were: 0.13 nats off
    after 3 rows, +150 after 20). Both sides are Laplace evidences at modes found to
    tol=1e-12 (each fit's gradient ~1e-6, as above): 1e-5 nats."""
    X, y = cancer
    model = cls(tol=1e-12)
    for i in range(n_rows):
        model.partial_fit(X[i : i + 1], y[i : i + 1], classes=[0, 1])
    model.partial_fit(X[n_rows:45], y[n_rows:45])
    batch = cls(tol=1e-12).fit(X[:45], y[:45])
    np.testing.assert_allclose(model.coef_, batch.coef_, rtol=0, atol=1e-5)
    assert model.log_marginal_likelihood_value_ == pytest.approx(
        batch.log_marginal_likelihood_value_, abs=1e-5
    )
    # A later batch while every row is still in the window: the batch fit again.
    model.partial_fit(X[45:60], y[45:60])
    batch = cls(tol=1e-12).fit(X[:60], y[:60])
    assert model.log_marginal_likelihood_value_ == pytest.approx(
        batch.log_marginal_likelihood_value_, abs=1e-5
    )


def test_a_laplace_stream_does_not_accumulate_newtons_stopping_gradient(cancer):
    """Newton stops where its decrement is within tol, at an iterate m whose gradient g is
    not zero; the window's next call divides the rows' sites (expansions at m) out of
    N(m, H⁻¹), so g stayed in the frozen part, one more each call: 2-row batches at the
    default tol=1e-4 ended 0.3 in the posterior's own norm (‖·‖_H) from the same stream
    at round-off. One fit is within √(2 tol) = 0.014 of its mode in that norm, and so must
    the stream be of its round-off self, however many calls (measured 2e-4 with the
    window's posterior the product of its sites)."""
    X, y = cancer
    streams = [vb.LaplaceLogisticRegression(tol=tol) for tol in (1e-4, 1e-12)]
    for model in streams:
        for start in range(0, 200, 2):
            model.partial_fit(X[start : start + 2], y[start : start + 2], classes=[0, 1])
    a, b = map(_posterior, streams)
    gap = a.mean - b.mean
    assert np.sqrt(gap @ b.precision @ gap) < np.sqrt(2 * 1e-4)


@pytest.mark.parametrize("batch", [1, 10])
def test_a_laplace_stream_keeps_the_rows_whose_sites_fit_worst(batch, cancer):
    """Rows leave a Laplace window by how far their sites (expansions at a mode) are from
    their likelihood over the posterior, not by age: the rows whose curvature the later
    modes would change stay to be refitted. 120 rows through a window of 30: KL(batch ‖
    stream) measured 0.022 (rows) and 0.011 (batches of 10), against 0.106 and 0.199
    when the oldest row left and batches were filtered under the buffer's anchor."""
    X, y = cancer
    model = vb.LaplaceLogisticRegression(buffer_size=30)
    for start in range(0, 120, batch):
        model.partial_fit(X[start : start + batch], y[start : start + batch], classes=[0, 1])
    assert model._stream_buffer.n_rows == 30
    batch_fit = vb.LaplaceLogisticRegression().fit(X[:120], y[:120])
    assert kl_divergence(_posterior(batch_fit), _posterior(model)) < 0.05


def test_a_laplace_batch_whose_frozen_part_fails_is_filtered_alone(cancer, monkeypatch):
    """Where round-off leaves the posterior without the window's sites indefinite, the
    window's sites stay in the posterior and the batch is fitted under it alone (ADF).
    (Both to round-off: the window's posterior is one Newton step beyond the fit's
    stopping point, at most √(2 × its decrement) in the posterior's norm, the decrement
    there a few ulps of log p: measured 1.7e-9.)"""
    X, y = cancer
    model = vb.LaplaceLogisticRegression(tol=1e-14)
    model.partial_fit(X[:20], y[:20], classes=[0, 1])
    before, evidence = _posterior(model), model.log_marginal_likelihood_value_

    def indefinite(*args):
        raise ValueError("The frozen part's precision is not positive definite.")

    monkeypatch.setattr(vb.estimators._site_window, "frozen_part", indefinite)
    model.partial_fit(X[20:30], y[20:30])
    assert model._stream_buffer.n_rows == 10  # the batch's rows only
    expected = vb.LaplaceLogisticRegression(prior=before, tol=1e-14).fit(X[20:30], y[20:30])
    a, b = _posterior(model), _posterior(expected)
    np.testing.assert_allclose(a.mean, b.mean, rtol=0, atol=1e-7)
    np.testing.assert_allclose(a.cov, b.cov, rtol=0, atol=1e-10)
    assert model.log_marginal_likelihood_value_ == pytest.approx(
        evidence + expected.log_marginal_likelihood_value_, abs=1e-10
    )


@pytest.mark.parametrize(
    "mean, var, power", [(0.3, 4.0, 1.0), (2.0, 1.0, 0.5), (8.0, 0.5, 1.0), (-1.0, 9.0, 1.0)]
)
def test_taylor_errors_are_the_quadratic_sites_mean_error(mean, var, power):
    """E|s log σ(t) − q(t)| over t ~ N(m, v), q the Taylor expansion at m: the adaptive
    quadrature's, within the 16-point rule's error on the kink of |·| at m (≤ 1 %)."""
    g, h = expit(-mean), expit(mean) * expit(-mean)

    def integrand(t):
        error = log_expit(t) - log_expit(mean) - g * (t - mean) + 0.5 * h * (t - mean) ** 2
        return power * abs(error) * np.exp(-0.5 * (t - mean) ** 2 / var) / np.sqrt(2 * np.pi * var)

    expected = sum(
        quad(integrand, *ends, epsabs=1e-14)[0] for ends in ((-np.inf, mean), (mean, np.inf))
    )
    got = vb.approximations.window_sites.taylor_errors(
        np.array([[1.0, 0.0]]),
        np.array([power]),
        np.array([mean, 0.0]),
        np.diag([var, 1.0]),
        get_link("logistic"),
    )
    assert got[0] == pytest.approx(expected, rel=1e-2)


@pytest.mark.parametrize("decay, sparse", [(1.0, False), (0.9, True)])
def test_vb_batches_within_the_window_are_the_batch_fit(decay, sparse, cancer):
    """A VB batch is fitted jointly with the window's rows (one-row calls' too) under the
    posterior without their sites, each site the bound at its row's ξ of the joint fit:
    while every row is in the window, the stream is the batch VB fit of its rows, each
    weighing decay**(rows after its batch) times its sample weight, and (decay 1) its
    running evidence the batch fit's bound. Assumed-density filtering froze each batch's
    ξ where the earlier batches' posterior put its rows: its means were 0.32 (decay 1)
    and 0.22 (decay 0.9) from the batch fit's in the posterior's scale, its evidence 111
    nats off. Both fits stop their updates where the bound rises by under tol = 1e-14 of
    it; the bound is quadratic about its optimum, so the parameters are within ~√tol
    (1e-7) of it in the posterior's scale (measured 4.6e-8), the bound to round-off of
    its terms (measured 5e-10 nats)."""
    X, y = cancer
    weights = np.random.default_rng(3).uniform(0.5, 2.0, 45)
    model = vb.VBLogisticRegression(tol=1e-14, decay=decay)
    for i in range(3):  # one-row calls, then batches: one window
        model.partial_fit(
            X[i : i + 1], y[i : i + 1], classes=[0, 1], sample_weight=weights[i : i + 1]
        )
    for start in range(3, 45, 7):
        rows = sp.csr_matrix(X[start : start + 7]) if sparse else X[start : start + 7]
        model.partial_fit(rows, y[start : start + 7], sample_weight=weights[start : start + 7])
    assert model._stream_buffer.n_rows == 45
    after = np.r_[[44.0, 43.0, 42.0], 42.0 - 7.0 * (np.arange(42) // 7 + 1)]
    batch = vb.VBLogisticRegression(tol=1e-14).fit(
        X[:45], y[:45], sample_weight=weights * decay**after
    )
    a, b = _posterior(model), _posterior(batch)
    scale = np.abs(b.cov).max()
    np.testing.assert_allclose(a.mean, b.mean, rtol=0, atol=1e-6 * np.sqrt(scale))
    np.testing.assert_allclose(a.cov, b.cov, rtol=0, atol=1e-6 * scale)
    if decay == 1.0:
        assert model.log_marginal_likelihood_value_ == pytest.approx(
            batch.log_marginal_likelihood_value_, abs=1e-8
        )


def test_a_one_vs_rest_vb_stream_within_the_window_is_the_batch_fit(iris):
    """The same for each one-vs-rest problem (three classes; filtering's means were up to
    1.2 from the batch fit's in the posterior's scale, measured now 1.4e-7), and a
    stream's one batch is the batch fit of its rows exactly (the same updates under the
    same prior)."""
    X, y = iris
    model = vb.VBLogisticRegression(tol=1e-14)
    for start in range(0, 90, 30):
        model.partial_fit(X[start : start + 30], y[start : start + 30], classes=[0, 1, 2])
    batch = vb.VBLogisticRegression(tol=1e-14).fit(X[:90], y[:90])
    for a, b in zip(model.posteriors_, batch.posteriors_, strict=True):
        scale = np.abs(b.cov).max()  # (√tol, as above)
        np.testing.assert_allclose(a.mean, b.mean, rtol=0, atol=1e-6 * np.sqrt(scale))
        np.testing.assert_allclose(a.cov, b.cov, rtol=0, atol=1e-6 * scale)
    np.testing.assert_allclose(
        model.log_marginal_likelihood_value_, batch.log_marginal_likelihood_value_, atol=1e-8
    )
    one = vb.VBLogisticRegression().partial_fit(X, y, classes=[0, 1, 2])
    fit = vb.VBLogisticRegression().fit(X, y)
    np.testing.assert_array_equal(one.coef_, fit.coef_)
    np.testing.assert_array_equal(one.sigma_, fit.sigma_)


def test_a_vb_stream_keeps_the_rows_whose_bounds_fit_worst(cancer):
    """Beyond the window, rows leave a VB window by the bound's gap to their likelihood
    over the posterior (bound_gaps), and their sites keep the ξ of the last joint fit:
    nearer the batch fit than assumed-density filtering, whose sites keep the ξ of their
    own batch. The batch fit is the optimum of the bound over every ξ, and a stream of
    frozen ξ only approaches it (240 rows in batches of 40 through a window of 40:
    KL(batch ‖ stream) measured 0.45, against filtering's 6.9; the bound's floor:
    docs/decisions.md, D-238)."""
    X, y = cancer
    weights = np.random.default_rng(4).uniform(0.5, 2.0, 240)
    batch = vb.VBLogisticRegression().fit(X[:240], y[:240], sample_weight=weights)
    gaps = {}
    for size in (0, 40):
        model = vb.VBLogisticRegression(buffer_size=size)
        for start in range(0, 240, 40):
            rows = slice(start, start + 40)
            model.partial_fit(X[rows], y[rows], classes=[0, 1], sample_weight=weights[rows])
        gaps[size] = kl_divergence(_posterior(batch), _posterior(model))
    assert gaps[40] < 0.5 * gaps[0]


@pytest.mark.parametrize(
    "mean, var, power", [(0.3, 4.0, 1.0), (2.0, 1.0, 0.5), (8.0, 0.5, 1.0), (-1.0, 9.0, 1.0)]
)
def test_bound_gaps_are_the_bounds_mean_gap(mean, var, power):
    """E[s log σ(t) − s b_ξ(t)] over t ~ N(m, v), b_ξ the Jaakkola–Jordan bound at ξ² =
    m² + v: the adaptive quadrature's, within the 16-point rule's error on a smooth
    integrand (measured below 1e-4 relative); and λ's inverse is λ's."""
    xi = np.sqrt(mean**2 + var)
    lam = np.tanh(xi / 2) / (4 * xi)

    def integrand(t):
        bound = log_expit(xi) + (t - xi) / 2 - lam * (t * t - xi * xi)
        density = np.exp(-0.5 * (t - mean) ** 2 / var) / np.sqrt(2 * np.pi * var)
        return power * (log_expit(t) - bound) * density

    expected = quad(integrand, -np.inf, np.inf, epsabs=1e-14)[0]
    got = vb.approximations.window_sites.bound_gaps(
        np.array([[1.0, 0.0]]), np.array([power]), np.array([mean, 0.0]), np.diag([var, 1.0])
    )
    assert got[0] == pytest.approx(expected, rel=1e-3)
    found = vb.approximations.variational_bayes.bound_xi(np.array([lam, 0.125]))
    np.testing.assert_allclose(found, [xi, 0.0], rtol=1e-12, atol=1e-7)


def _softmax_site_precision(window, n_classes: int, fit_intercept: bool = True):
    """Σ Aᵢᵀ Λᵢ Aᵢ and Σ Aᵢᵀ ηᵢ of a multinomial window's sites (A: a row's contrasts)."""
    design = vb.approximations.window_sites.softmax_design(
        window.rows, vb.models.softmax_predictive_rules.centred_basis(n_classes), fit_intercept
    )
    precision = np.einsum("iap,iab,ibq->pq", design, window.tau[0], design)
    return precision, np.einsum("iap,ia->p", design, window.nu[0])


@pytest.mark.parametrize(
    "cls, decay", [(vb.VSLogisticRegression, 0.95), (vb.LaplaceLogisticRegression, 1.0)]
)
def test_a_multinomial_window_holds_its_sites_and_is_bounded(cls, decay, iris):
    """A multinomial stream of one-row calls keeps the last buffer_size rows' (K − 1)-
    dimensional sites, each call a rank-(K − 1) update of the carried posterior: its
    natural parameters are the prior's plus the window's sites (forgetting toward that
    prior scales both alike) while every row is in the window; the window then holds
    buffer_size rows, whatever the stream's length."""
    X, y = iris
    mean, cov = _correlated_prior(15, seed=5)
    model = cls(prior=(mean, 0.3 * cov), decay=decay, buffer_size=20)
    held = []
    for i in range(26):
        model.partial_fit(X[i : i + 1], y[i : i + 1], classes=[0, 1, 2])
        held.append(model._stream_buffer.n_rows)
        if i == 19:
            window = model._stream_buffer
            assert window.tau.shape == (1, 20, 2, 2) and window.visited.min() > 1
            sites, shift = _softmax_site_precision(window, 3)
            precision = np.linalg.inv(0.3 * cov)
            posterior = _posterior(model)
            np.testing.assert_allclose(
                np.linalg.inv(posterior.cov), precision + sites, rtol=1e-7, atol=1e-8
            )
            np.testing.assert_allclose(
                np.linalg.solve(posterior.cov, posterior.mean),
                precision @ mean + shift,
                atol=1e-7,
            )
    assert held == list(range(1, 21)) + [20] * 6
    if cls is vb.VSLogisticRegression:
        assert model.strategy_reason_[0] == vb.estimators._site_window.WINDOW_ROW_REASON
    assert model._stream_buffer.tau.nbytes == window.tau.nbytes


def test_a_multinomial_window_on_its_rule_is_near_the_converged_quadrature(monkeypatch):
    """The window's few rows take rule levels up to ``_FEW_ROWS_FINEST`` (2 × 512 nodes
    on a direct row's mixture, 3 classes): a stream from its first row under the default
    prior (wide cavities for ~150 rows) ends within the quadrature's error of the same
    stream on 2 × 8192 nodes (measured 5e-3 nats after these 150 rows; 9e-4 to 1.5e-2 on
    four other such streams; on the sweeps' finest level, 2 × 2048, 1.8 nats here: the
    first rows' sites under cavities of variance ~10³ are chaotic at any node count, and
    the revisits under narrower cavities settle them), against the streams' own KL of
    ~0.7 to the batch fit."""
    sites = sys.modules["vsbayes.approximations._softmax_tilted_moments"]
    X, y = make_classification(150, 20, n_informative=10, n_classes=3, random_state=2)

    def stream():
        model = vb.EPLogisticRegression()
        for i in range(len(y)):
            model.partial_fit(X[i : i + 1], y[i : i + 1], classes=[0, 1, 2])
        return _posterior(model)

    window = stream()
    monkeypatch.setattr(sites, "_FEW_ROWS_FINEST", 3)
    assert 1e-12 < kl_divergence(stream(), window) < 2e-2


@pytest.mark.parametrize("cls", [vb.EPLogisticRegression, vb.LaplaceLogisticRegression])
def test_a_multinomial_stream_first_row_is_the_direct_update(cls, iris):
    """A multinomial window's first row (nothing to revisit) is the row's own update of its
    prior (the multinomial EP's site at its fixed point, or Newton in the contrasts), its
    evidence and (Laplace) its mode's diagnostics too: to round-off (measured 2e-16) on
    narrow cavities (the site update's short route) and wider ones (its general pass);
    within the quadrature's error where the factor narrows the cavity much (one pass of
    the nodes' own moments on a kernel near the tilted density, on the window's finest
    rule of 2 × 512 nodes, against the own update's fixed point: KL 2e-4) and, EP, on a
    wide one (the tilted moments against the own update's VS fits: KL 8e-4). Every case
    starts the window."""
    X, y = iris
    mean, cov = _correlated_prior(15, seed=2)
    # Bounds on the KL and on log Z's difference (measured 2.1e-4, 2.1e-3; 7.8e-4, 4.1e-3;
    # on 2 × 2048 nodes with a Laplace kernel the first was 9e-6, 1.4e-4).
    cases = ((0.3, 0, None), (1.0, 1, None), (3.0, 0, (1e-3, 3e-3)), (3.0, 1, (3e-3, 5e-3)))
    for scale, k, bound in cases:
        prior = (mean, scale * cov)
        window, alone = cls(prior=prior), cls(prior=prior, buffer_size=0)
        for model in (window, alone):
            model.partial_fit(X[k : k + 1], y[k : k + 1], classes=[0, 1, 2], sample_weight=[0.7])
        assert type(window._stream_buffer).__name__ == "SiteWindow"
        a, b = _posterior(window), _posterior(alone)
        if bound and cls is vb.EPLogisticRegression:
            assert 1e-12 < kl_divergence(b, a) < bound[0]
            assert a.log_Z == pytest.approx(b.log_Z, abs=bound[1])
            continue
        largest = np.abs(b.cov).max()
        np.testing.assert_allclose(a.mean, b.mean, rtol=0, atol=1e-12 * np.sqrt(largest))
        np.testing.assert_allclose(a.cov, b.cov, rtol=0, atol=1e-12 * largest)
        assert a.log_Z == pytest.approx(b.log_Z, abs=1e-12)
        if isinstance(b, vb.engine.LaplaceResult):
            assert a.log_density_at_mode == pytest.approx(b.log_density_at_mode, abs=1e-12)
            assert a.grad_norm == pytest.approx(b.grad_norm, rel=0.2, abs=1e-14)


@pytest.mark.parametrize(
    "cls, bound", [(vb.EPLogisticRegression, 1e-6), (vb.LaplaceLogisticRegression, 1e-10)]
)
def test_revisiting_every_multinomial_site_reaches_the_batch_fit(cls, bound, iris, monkeypatch):
    """The multinomial window's revisits are the multinomial EP's site updates (Laplace:
    Laplace propagation's in the contrasts): revisiting every row at each call takes the
    stream to the batch fit of its rows under the same prior (measured KL 6e-8 for EP:
    the rule's error, and 0), where the rows' own updates stay ~4e-3 nats away."""
    X, y = iris
    monkeypatch.setattr(vb.estimators._site_window, "REVISITS", 40)
    earlier = cls().fit(X[:30], y[:30])
    streams = {}
    for size in (0, 40):
        streams[size] = stream = cls(prior=earlier, buffer_size=size)
        for i in range(30, 60):
            stream.partial_fit(X[i : i + 1], y[i : i + 1], classes=[0, 1, 2])
        for _ in range(8):  # revisits only: the same row again, at weight ~0
            stream.partial_fit(X[59:60], y[59:60], sample_weight=[1e-12])
    assert isinstance(streams[40]._stream_buffer, vb.estimators._site_window.SiteWindow)
    batch = _posterior(cls(prior=earlier).fit(X[30:60], y[30:60]))
    assert kl_divergence(batch, _posterior(streams[40])) < bound
    assert kl_divergence(batch, _posterior(streams[0])) > 1e-3


# --- Thompson sampling ------------------------------------------------------------------


def test_thompson_draws_score_the_candidates_in_one_call(cancer, iris):
    binary = vb.LaplaceLogisticRegression().fit(*cancer)
    draws = binary.thompson_sample(cancer[0][:7], n_draws=4000, random_state=0)
    assert draws.scores.shape == (4000, 7) and draws.coef.shape == (4000, 1, 6)
    mean, var = binary.latent_mean_and_variance(cancer[0][:7])
    np.testing.assert_allclose(draws.scores.mean(axis=0), mean, atol=5 * np.sqrt(var.max() / 4000))
    multinomial = vb.LaplaceLogisticRegression().fit(*iris)
    draws = multinomial.thompson_sample(iris[0][:5], n_draws=np.int64(3), random_state=0)
    assert draws.scores.shape == (3, 5, 3)
    expected = np.einsum("nd,skd->snk", iris[0][:5], draws.coef) + draws.intercept[:, None]
    np.testing.assert_allclose(draws.scores, expected, rtol=1e-12, atol=1e-12)


def test_one_vs_rest_and_dask_multinomial_take_an_earlier_posterior(iris):
    da = pytest.importorskip("dask.array")
    X, y = iris
    first = vb.LaplaceProbitRegression().fit(X[:75], y[:75])
    second = vb.LaplaceProbitRegression(prior=first).fit(X[75:], y[75:])
    assert second.sigma_.shape == (3, 5, 5) and second.score(X, y) > 0.9
    earlier = vb.LaplaceLogisticRegression().fit(X[:75], y[:75])
    in_memory = vb.LaplaceLogisticRegression(prior=earlier).fit(X[75:], y[75:])
    chunked = vb.LaplaceLogisticRegression(prior=earlier).fit(
        da.from_array(X[75:], chunks=(25, -1)), da.from_array(y[75:], chunks=25)
    )
    np.testing.assert_allclose(chunked.coef_, in_memory.coef_, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(chunked.sigma_, in_memory.sigma_, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize(
    "cls, options, bound",
    [
        # Bounds: 2.5× the largest KL to EP each method shows on these rows without a
        # prior (three seeds: VS global 0.012, IS 0.12, BMC 0.081; under the prior 3e-4,
        # 0.046, 0.079): the prior adds no error of its own.
        (vb.VSLogisticRegression, {"strategy": "global"}, 0.03),
        (vb.ISLogisticRegression, {}, 0.3),
        (vb.BMCLogisticRegression, {}, 0.2),
    ],
)
def test_sampling_fits_under_a_full_prior_agree_with_ep(cls, options, bound, cancer):
    X, y = cancer
    half = len(y) // 2
    first = vb.EPLogisticRegression().fit(X[:half], y[:half])
    ep = vb.EPLogisticRegression(prior=first).fit(X[half:], y[half:])
    fit = cls(prior=first, random_state=0, **options).fit(X[half:], y[half:])
    assert kl_divergence(_posterior(ep), _posterior(fit)) < bound


@pytest.mark.parametrize("n_rows", [40, 200])  # wide (dual forms) and tall (primal)
def test_a_diagonal_prior_with_a_mean_is_its_whitened_self(n_rows):
    """The two binary routes, the model's own prior with a mean and the whitened design, on
    one prior: its covariance made non-diagonal by 1e-13 sends it down the second."""
    rng = np.random.default_rng(3)
    X = rng.normal(size=(n_rows, 60))
    y = (X[:, :3].sum(axis=1) + rng.normal(size=n_rows) > 0).astype(int)
    mean, variances = 0.3 * rng.normal(size=61), rng.uniform(0.5, 2.0, size=61)
    nearly = np.diag(variances)
    nearly[0, 1] = nearly[1, 0] = 1e-13
    for cls in (vb.LaplaceLogisticRegression, vb.EPLogisticRegression, vb.VBLogisticRegression):
        diagonal = cls(prior=(mean, variances)).fit(X, y)
        whitened = cls(prior=(mean, nearly)).fit(X, y)
        np.testing.assert_allclose(whitened.coef_, diagonal.coef_, rtol=1e-7, atol=1e-8)
        np.testing.assert_allclose(whitened.sigma_, diagonal.sigma_, rtol=1e-6, atol=1e-9)
        assert whitened.log_marginal_likelihood_value_ == pytest.approx(
            diagonal.log_marginal_likelihood_value_, abs=1e-6
        )


def test_a_multinomial_stream_from_the_default_prior_never_refits(iris):
    """A multinomial stream of one-row calls from the default prior (the intercepts' 10⁶
    variance: wide cavities, rows deep in their tails) keeps a window of sites from its
    first row and never buffers rows to refit; revisiting its sites (calls of weight ~0)
    takes it to the batch EP fit of its rows (measured KL 2e-7 after 20 such calls, where
    the rows' own updates, the old buffer's, stayed 1.6 nats away)."""
    X, y = iris
    stream = vb.EPLogisticRegression(buffer_size=30)
    for i in range(20):
        stream.partial_fit(X[i : i + 1], y[i : i + 1], classes=[0, 1, 2])
        assert isinstance(stream._stream_buffer, vb.estimators._site_window.SiteWindow)
    for _ in range(20):
        stream.partial_fit(X[19:20], y[19:20], sample_weight=[1e-12])
    assert stream._stream_buffer.n_rows == 30
    batch = vb.EPLogisticRegression().fit(X[:20], y[:20])
    assert kl_divergence(_posterior(batch), _posterior(stream)) < 1e-5


# --- structured posteriors: a diagonal carried between batches ------------------------


@pytest.fixture
def one_thread():
    # Small matrices: BLAS's idle threads would spin (as in the fits themselves).
    from vsbayes._blas import single_blas_thread

    with single_blas_thread():
        yield


@pytest.fixture(scope="module")
def text_like():
    """A sparse design with many more features than the rows of a batch (text-like), and
    its held-out rows."""
    rng = np.random.default_rng(0)
    X = sp.random(400, 3000, density=0.01, format="csr", random_state=1)
    X.data = rng.exponential(1.0, X.nnz)
    truth = np.zeros(3000)
    truth[:40] = rng.normal(0.0, 3.0, 40)
    y = (rng.random(400) < expit(X @ truth)).astype(int)
    return X[:300], y[:300], X[300:]


def _carried(posterior) -> GaussianPrior:
    """A structured binary posterior's projection (mean, marginal variances and the
    intercept's covariances), as partial_fit carries it."""
    unit = np.zeros(posterior.dim)
    unit[-1] = 1.0
    hub = posterior.covariance.dot(unit)[:-1]
    return GaussianPrior.arrowhead(posterior.mean, posterior.covariance.diagonal(), hub)


@pytest.mark.parametrize("structure", ["lowrank", "dual"])
@pytest.mark.usefixtures("one_thread")
def test_a_structured_stream_carries_its_projection(text_like, structure):
    """Each batch is the structured fit under the projection of the posterior before it
    (coefficients independent given the intercept), to round-off; two batches are close
    to the fit of both (the projection drops the first batch's correlations between
    coefficients: measured 0.018 in probability, marginal sds 0.974-1.035 of the batch
    fit's, the intercept's 1.02)."""
    X, y, new_rows = text_like
    with vb.config_context(covariance=structure):
        stream = vb.VSLogisticRegression().partial_fit(X[:150], y[:150], classes=[0, 1])
        first = vb.VSLogisticRegression().fit(X[:150], y[:150])
        np.testing.assert_array_equal(stream.coef_, first.coef_)
        np.testing.assert_array_equal(stream.sigma_.diagonal(), first.sigma_.diagonal())
        assert stream.log_marginal_likelihood_value_ == first.log_marginal_likelihood_value_
        assert stream.covariance_structure_ == structure
        assert "independent given the intercept" in stream.covariance_reason_
        stream.partial_fit(X[150:], y[150:])
        carried = _carried(first.posteriors_[0])
        second = vb.VSLogisticRegression(prior=carried).fit(X[150:], y[150:])
        np.testing.assert_array_equal(stream.coef_, second.coef_)
        np.testing.assert_array_equal(stream.sigma_.diagonal(), second.sigma_.diagonal())
        both = vb.VSLogisticRegression().fit(X, y)
    gap = np.abs(stream.predict_proba(new_rows) - both.predict_proba(new_rows)).max()
    assert gap < 0.05
    ratio = np.sqrt(stream.sigma_.diagonal() / both.sigma_.diagonal())
    assert ratio.min() > 0.9 and ratio.max() < 1.1


@pytest.mark.usefixtures("one_thread")
def test_an_arrowhead_prior_is_the_dense_one(text_like):
    """The structured fit under an arrowhead prior, in the coordinates where it is
    diagonal and mapped back, is the dense fit under its dense covariance (whitened), to
    Newton's tolerance; its forgetting is the dense formula's."""
    X, y, _ = text_like
    X, y = X[:120, :250], y[:120]
    with vb.config_context(covariance="dual"):
        first = vb.LaplaceLogisticRegression(tol=1e-12).fit(X[:60], y[:60])
        carried = _carried(first.posteriors_[0])
        structured = vb.LaplaceLogisticRegression(prior=carried, tol=1e-12).fit(X[60:], y[60:])
    dense = vb.LaplaceLogisticRegression(prior=(carried.mean, carried.cov), tol=1e-12)
    dense.fit(X[60:], y[60:])
    assert structured.covariance_structure_ == "dual" and dense.covariance_structure_ == "dense"
    np.testing.assert_allclose(structured.coef_, dense.coef_, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(np.asarray(structured.sigma_), dense.sigma_, rtol=1e-6, atol=1e-9)
    assert structured.log_marginal_likelihood_value_ == pytest.approx(
        dense.log_marginal_likelihood_value_, abs=1e-6
    )
    # Its log density in O(p), the dense prior's (a diagonal one's too), up to round-off.
    rows = np.random.default_rng(0).normal(carried.mean, 1.0, (3, carried.dim))
    full = GaussianPrior(carried.mean, carried.cov)
    np.testing.assert_allclose(carried.log_density(rows), full.log_density(rows), rtol=1e-9)
    diagonal = GaussianPrior(carried.mean, carried.variances)
    expected = -0.5 * ((rows - carried.mean) ** 2 / carried.variances).sum(axis=1)
    np.testing.assert_allclose(diagonal.log_density(rows), expected, rtol=1e-12)
    original = GaussianPrior(np.zeros(carried.dim), np.full(carried.dim, 2.0))
    forgotten = carried.forgotten(0.7, original)
    reference = GaussianPrior(carried.mean, carried.cov).forgotten(0.7, original)
    assert forgotten.hub is not None
    np.testing.assert_allclose(forgotten.mean, reference.mean, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(forgotten.cov, reference.cov, rtol=1e-10, atol=1e-12)


@pytest.mark.usefixtures("one_thread")
def test_a_structured_stream_forgets_buffers_and_refits_without_dense_sites(text_like):
    """Forgetting mixes the carried projection's natural parameters with the original
    prior's; one-row calls join the buffer (no window of dense sites) and its refit is the
    structured fit of its rows under the anchor's projection, forgotten, to round-off."""
    X, y, _ = text_like
    with vb.config_context(covariance="dual"):
        stream = vb.VSLogisticRegression(decay=0.99, buffer_size=4)
        stream.partial_fit(X[:100], y[:100], classes=[0, 1])
        anchor = _carried(stream.posteriors_[0])
        for i in range(100, 103):
            stream.partial_fit(X[i : i + 1], y[i : i + 1])
            assert isinstance(stream._stream_buffer, vb.estimators._updating._StreamBuffer)
            assert stream.covariance_structure_ == "dual"
        stream.partial_fit(X[103:104], y[103:104])  # the fourth row: the refit
        assert stream._stream_buffer is None
        # The anchor forgotten over the four rows; the rows' weights decay**(rows after).
        original = stream._default_prior(X.shape[1], None, stream._priors(X, None, False))
        refit = vb.VSLogisticRegression(prior=anchor.forgotten(0.99**4, original))
        refit.fit(X[100:104], y[100:104], sample_weight=0.99 ** np.arange(3, -1, -1))
    np.testing.assert_allclose(stream.coef_, refit.coef_, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(
        stream.sigma_.diagonal(), refit.sigma_.diagonal(), rtol=1e-12, atol=1e-14
    )


@pytest.mark.usefixtures("one_thread")
def test_a_structured_stream_checks_its_batches_and_keeps_its_posterior(text_like):
    X, y, _ = text_like
    with vb.config_context(covariance="lowrank"):
        stream = vb.VSLogisticRegression().partial_fit(X[:100], y[:100], classes=[0, 1])
        kept = stream.coef_.copy(), stream.sigma_.diagonal().copy()
        with pytest.raises(ValueError, match="features"):
            stream.partial_fit(X[100:110, :-1], y[100:110])
        with pytest.raises(ValueError, match=r"outside classes"):
            stream.partial_fit(X[100:110], np.full(10, 2))
        with (
            vb.config_context(memory_limit=1000.0),
            pytest.raises(vb.exceptions.MemoryLimitError, match="smaller batches"),
        ):
            stream.partial_fit(X[100:200], y[100:200])
    np.testing.assert_array_equal(stream.coef_, kept[0])
    np.testing.assert_array_equal(stream.sigma_.diagonal(), kept[1])


def test_a_wide_multinomial_stream_names_the_one_vs_rest_stream(monkeypatch):
    """The multinomial fit under a prior has the dense covariance: beyond its size it
    refuses, naming the one-vs-rest stream, whose binary posteriors are structured."""
    from sklearn.multiclass import OneVsRestClassifier

    # (The module, not the package's function of the same name.)
    softmax_laplace = sys.modules["vsbayes.approximations.softmax_laplace"]
    monkeypatch.setattr(softmax_laplace, "MAX_SOFTMAX_PARAMS", 60)
    rng = np.random.default_rng(2)
    X = sp.random(30, 40, density=0.2, format="csr", random_state=3)
    y = rng.integers(0, 3, 30)
    with pytest.raises(ValueError, match=r"OneVsRestClassifier\(\.\.\.\)\.partial_fit"):
        vb.VSLogisticRegression().partial_fit(X, y, classes=[0, 1, 2])
    with vb.config_context(covariance="dual"):
        ovr = OneVsRestClassifier(vb.VSLogisticRegression()).partial_fit(X, y, classes=[0, 1, 2])
    assert [e.covariance_structure_ for e in ovr.estimators_] == ["dual"] * 3


def test_a_declared_class_without_rows_is_warned_about(cancer):
    """A class declared to partial_fit and absent from the rows: only those rows bound its
    intercept, from above, against the vague N(0, 10⁶): a one-sided posterior, which the
    Laplace Gaussian read, silently, as a class of probability ~½ in every row (0.48 on a
    2-class make_classification stream declared with 3 classes, where VS's global fit gave
    0.06). A batch after which a declared class has no row warns; one-row calls (a
    bandit's first rows show one class) and a stream whose classes have all had rows do
    not."""
    X, y = cancer
    with pytest.warns(vb.exceptions.UnreliableFitWarning, match=r"class\(es\) \[2\]"):
        model = vb.LaplaceLogisticRegression().partial_fit(X[:60], y[:60], classes=[0, 1, 2])
    assert model.predict_proba(X[:60])[:, 2].min() > 0.3  # (what the warning is about)
    with warnings.catch_warnings():
        warnings.simplefilter("error", vb.exceptions.UnreliableFitWarning)
        stream = vb.LaplaceLogisticRegression().partial_fit(X[:1], y[:1], classes=[0, 1])
        stream.partial_fit(X[1:40], y[1:40])  # both classes now
    order = np.argsort(y[:40], kind="stable")
    first = vb.LaplaceLogisticRegression()
    with pytest.warns(vb.exceptions.UnreliableFitWarning, match=r"class\(es\) \[1\]"):
        first.partial_fit(X[order][:10], y[order][:10], classes=[0, 1])  # one class
    with warnings.catch_warnings():
        warnings.simplefilter("error", vb.exceptions.UnreliableFitWarning)
        first.partial_fit(X[order][10:], y[order][10:])


def test_the_unseen_class_warning_says_later_rows_do_not_undo_it(cancer):
    """After a batch of one class, a binary EP stream's carried Gaussian keeps little of
    what those rows say about the coefficients; the other class's rows arriving later do
    not restore it (assumed-density filtering), so the warning advises shuffling, not
    reading the predictions once every class has had rows, as it did."""
    X, y = cancer
    order = np.argsort(y, kind="stable")
    Xs, ys = X[order], y[order]
    split = int(np.sum(y == 0))
    stream = vb.EPLogisticRegression()
    with pytest.warns(vb.exceptions.UnreliableFitWarning, match="shuffle such a stream"):
        stream.partial_fit(Xs[:split], ys[:split], classes=[0, 1])  # class 0 only
    stream.partial_fit(Xs[split:], ys[split:])  # class 1 only
    fit = vb.EPLogisticRegression().fit(X, y)
    # (what the warning says: far from the fit of the same rows, every class seen)
    loss = metrics.log_loss
    assert loss(y, stream.predict_proba(X)) > 2 * loss(y, fit.predict_proba(X))


@pytest.mark.parametrize("flat", [{"penalty": None}, {"C": np.inf}])
def test_partial_fit_after_a_flat_prior_fit_names_a_remedy_that_works(cancer, flat):
    """After fit under the flat prior, partial_fit refused saying the flat prior "was set
    after the stream's first batch" (it was not) and to "set it back" (after C=inf, setting
    C back to inf is the refusal again). The remedy it names now runs."""
    X, y = cancer
    model = vb.EPLogisticRegression(**flat).fit(X[:300], y[:300])
    with pytest.raises(ValueError, match="start a stream from it") as error:
        model.partial_fit(X[300:], y[300:])
    assert "was set after" not in str(error.value)
    stream = vb.EPLogisticRegression(prior=model).partial_fit(X[300:], y[300:], classes=[0, 1])
    assert stream.score(X, y) > 0.9


def _sorted_batches(y, mixed: int, size: int) -> list[np.ndarray]:
    """Row indices of a stream sorted by class in batches of ``size``, each batch with
    ``mixed`` rows of the other classes (taken in turn from the ends of their rows)."""
    pools = [list(np.flatnonzero(y == c)) for c in np.unique(y)]
    batches = []
    for c, pool in enumerate(pools):
        others = [d for d in range(len(pools)) if d != c]
        taken = [pools[others[i % len(others)]].pop() for i in range(mixed)]
        batches.append(np.array(pool[: size - mixed] + taken))
        del pool[: size - mixed]
    return batches


@pytest.fixture(scope="module")
def sorted_stream():
    X, y = make_classification(1000, random_state=0)
    return X, y, _sorted_batches(y, 9, 500)


def test_an_ordered_stream_whose_batch_moves_the_posterior_far_warns(sorted_stream):
    """A stream sorted by class whose first batch holds 9 rows of the other class (of 500):
    its posterior is skewed, and the second batch moves it into the tail of the Gaussian
    that carries it, where the earlier rows are its extrapolation (the exact moments of the
    first batch's posterior carried give the same collapse, D-215). The second call
    warns; the stream's log loss is twice the fit's (what the warning is about)."""
    X, y, batches = sorted_stream
    ordered = r"class shares .* are not the earlier rows'"
    stream = vb.EPLogisticRegression()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", ordered, vb.exceptions.UnreliableFitWarning)
        stream.partial_fit(X[batches[0]], y[batches[0]], classes=[0, 1])
    with pytest.warns(vb.exceptions.UnreliableFitWarning, match=ordered):
        stream.partial_fit(X[batches[1]], y[batches[1]])
    fit = vb.EPLogisticRegression().fit(X, y)
    loss = metrics.log_loss
    assert loss(y, stream.predict_proba(X)) > 1.5 * loss(y, fit.predict_proba(X))
    # A stream after a fit: the fit's rows are the earlier ones.
    after = vb.EPLogisticRegression().fit(X[batches[0]], y[batches[0]])
    with pytest.warns(vb.exceptions.UnreliableFitWarning, match=ordered):
        after.partial_fit(X[batches[1]], y[batches[1]])


def test_a_posterior_move_beyond_its_bound_is_rare_where_the_posterior_is_exact(rng):
    """The move test's premise: under an exchangeable stream the posterior mean is a
    martingale whose step has covariance Σ₀ − Σ₁. In the conjugate linear-Gaussian model
    the posteriors are exact: over data drawn from the prior predictive, the Chernoff
    bound of the move falls below α in at most a fraction α of the streams (within Monte
    Carlo error), and the statistic's mean is the Σλ it is compared with."""
    from vsbayes.estimators._stream_order import move_bound

    d, n0, n1, trials, alpha = 4, 20, 30, 2000, 0.05
    noise = 0.5

    def posterior(X, y, precision, shift):  # N(0, I) prior, Gaussian rows of sd noise
        precision = precision + X.T @ X / noise**2
        shift = shift + X.T @ y / noise**2
        cov = np.linalg.inv(precision)
        return cov @ shift, cov, precision, shift

    below, stats, expected = 0, [], []
    for _ in range(trials):
        theta = rng.standard_normal(d)
        X = rng.standard_normal((n0 + n1, d))
        y = X @ theta + noise * rng.standard_normal(n0 + n1)
        mean0, cov0, precision, shift = posterior(X[:n0], y[:n0], np.eye(d), np.zeros(d))
        mean1, cov1, _, _ = posterior(X[n0:], y[n0:], precision, shift)
        stat, mean, bound = move_bound(mean0, np.linalg.cholesky(cov0), mean1, cov1)
        below += bound < np.log(alpha)
        stats.append(stat)
        expected.append(mean)
    assert below / trials <= alpha + 3 * np.sqrt(alpha * (1 - alpha) / trials)
    # (the statistic is what the bound assumes: its mean within 4 standard errors)
    assert abs(np.mean(stats) - np.mean(expected)) < 4 * np.std(stats) / np.sqrt(trials)


def test_an_ordered_multinomial_stream_warns():
    """Three classes sorted, 300 rows a batch with 9 of the other classes: the multinomial
    posterior collapses as the binary one (log loss 2.2× the fit's with EP)."""
    X, y = make_classification(900, n_features=6, n_informative=4, n_classes=3, random_state=0)
    batches = _sorted_batches(y, 9, 300)
    stream = vb.EPLogisticRegression()
    with pytest.warns(vb.exceptions.UnreliableFitWarning, match="class shares"):
        for batch in batches:
            stream.partial_fit(X[batch], y[batch], classes=[0, 1, 2])


@pytest.mark.parametrize(("share", "decay"), [(0.5, 1.0), (0.9, 0.99)])
def test_shuffled_streams_do_not_warn_of_their_order(share, decay):
    """Rows in random order, batches of 5 to 150 rows, balanced and 9:1 classes, with and
    without forgetting: the class-share test's bound holds for any size (the smallest of
    2.4·10⁶ shuffled batches' was 5·10⁻⁵, against 10⁻⁹), so no call warns of order."""
    X, y = make_classification(300, n_features=5, weights=[share], random_state=1)
    rng = np.random.default_rng(0)
    with warnings.catch_warnings():
        # (a 9:1 stream's first small batch may lack the rare class: D-172's warning)
        warnings.filterwarnings("ignore", ".*no row of positive weight yet")
        warnings.filterwarnings("error", "class shares", vb.exceptions.UnreliableFitWarning)
        for size in (5, 50, 150):
            for cls in (vb.LaplaceLogisticRegression, vb.EPProbitRegression):
                stream, order = cls(decay=decay), rng.permutation(len(y))
                for start in range(0, len(y), size):
                    rows = order[start : start + size]
                    stream.partial_fit(X[rows], y[rows], classes=[0, 1])


def test_the_class_order_bound_holds_against_the_exact_hypergeometric_tail():
    """Under rows in random order a batch's count of a class is hypergeometric: the bound
    on the probability of counts at least as far from the pooled share (in KL, seen from
    the batch's rows or the earlier ones) is never below the exact tail."""
    from scipy.stats import hypergeom

    from vsbayes.estimators._stream_order import class_order_bound

    for n_earlier, n_batch, ones in [(10, 5, 6), (40, 40, 20), (200, 30, 12), (30, 200, 190)]:
        draws = np.arange(max(0, ones - n_earlier), min(ones, n_batch) + 1)
        pmf = hypergeom(n_earlier + n_batch, ones, n_batch).pmf(draws)
        bounds = np.array(
            [
                class_order_bound(
                    np.array([n_earlier - (ones - b), ones - b], float),
                    np.array([n_batch - b, b], float),
                )
                for b in draws
            ]
        )
        for bound in bounds:
            tail = pmf[bounds <= bound].sum()  # counts at least as far (a smaller bound)
            assert tail <= np.exp(bound) * (1 + 1e-12)
        assert bounds.min() < np.log(pmf.max())  # (not the trivial bound 0)
