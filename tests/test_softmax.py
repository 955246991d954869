"""The multinomial (softmax) posterior (layer 4), its Laplace approximation (layer 5) and its
predictive rule."""

import warnings

import joblib
import numpy as np
import pytest
import scipy.sparse as sp
from _helpers import count_replicate_rows
from scipy.special import log_softmax
from sklearn.datasets import load_digits, load_iris, load_wine
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import StandardScaler

import vsbayes
from vsbayes.approximations import softmax_laplace
from vsbayes.exceptions import MemoryLimitError
from vsbayes.models import SoftmaxGLMPosterior, softmax_predictive_log_proba
from vsbayes.models.softmax_predictive import TOLERANCE
from vsbayes.models.softmax_predictive_rules import centred_basis
from vsbayes.sampling.rules import symmetric_sobol_nodes


def make_problem(rng, m=40, d=3, k=3, intercept=True, sparse=False, **options):
    X = rng.standard_normal((m, d))
    X[rng.random((m, d)) < 0.3] = 0.0
    y = rng.integers(0, k, m)
    s = rng.uniform(0.5, 2.0, m)
    s[0] = 0.0  # dropped
    model = SoftmaxGLMPosterior(
        sp.csr_matrix(X) if sparse else X,
        y,
        s,
        k,
        prior_var=2.0,
        intercept_prior_var=5.0 if intercept else None,
        **options,
    )
    return X, y, s, model


def direct_log_density(X, y, s, theta, k, intercept):
    """Reference: Σ_i s_i log softmax(W x_i + b)[y_i] + log N(θ; 0, diag(prior))."""
    d = X.shape[1]
    W = theta[: k * d].reshape(k, d)
    b = theta[k * d :] if intercept else np.zeros(k)
    log_p = log_softmax(X @ W.T + b, axis=1)[np.arange(len(y)), y]
    prior = np.full(len(theta), 2.0)
    prior[k * d :] = 5.0
    return s @ log_p - 0.5 * np.sum(theta**2 / prior + np.log(2 * np.pi * prior))


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("intercept", [True, False])
# Latent differences beyond exp's range (scale 10³) take the max-shifted form.
@pytest.mark.parametrize("scale", [1.0, 1e3])
def test_log_density_matches_the_definition_in_any_blocks(rng, sparse, intercept, scale):
    X, y, s, model = make_problem(rng, intercept=intercept, sparse=sparse)
    theta = scale * rng.standard_normal((9, model.dim))
    expected = [direct_log_density(X, y, s, t, 3, intercept) for t in theta]
    np.testing.assert_allclose(model.log_density(theta), expected, rtol=1e-12)
    value, _, _ = model.value_gradient_hessian(theta[0])
    assert value == pytest.approx(expected[0], rel=1e-12)


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("scale", [1.0, 1e3])
def test_single_likelihood_is_float32_rounding_of_the_double(rng, sparse, scale):
    """single=True (VS's global fit): each row's term from float32 latent differences,
    exponentials and logarithms, within the rounding of those steps; blocks whose sums
    overflow float32 (differences of ~10³) are the float64 pass itself."""
    X, y, s, model = make_problem(rng, m=60, d=4, k=3, sparse=sparse)
    theta = scale * rng.standard_normal((50, model.dim))
    double, single = model.log_likelihood(theta), model.log_likelihood(theta, single=True)
    if scale > 100:
        np.testing.assert_array_equal(single, double)
        return
    W, b = model.split(theta)
    rows = np.hstack([X, np.ones((len(y), 1))])  # (X: the dense rows)
    relative = np.concatenate([W - W[:, -1:], (b - b[:, -1:])[..., None]], axis=2)
    # |h| ≤ Σ_c |x̃_c| |w_jc − w_Kc|: each GEMM output and its exponential rounded within
    # (d + 3) units of float32's rounding of that size, the log total within as much.
    size = np.einsum("ic,njc->nij", np.abs(rows), np.abs(relative)).max(axis=2)
    bound = 4 * (rows.shape[1] + 2) * 2.0**-24 * ((1.0 + size) @ s)
    assert np.all(np.abs(single - double) <= bound)
    assert not np.array_equal(single, double)  # float32 was taken


def test_blocks_and_workers_give_the_same_bits(rng):
    X, y, s, model = make_problem(rng, m=300)
    theta = rng.standard_normal((600, model.dim))
    small = SoftmaxGLMPosterior(X, y, s, 3, prior_var=2.0, intercept_prior_var=5.0, max_bytes=4000)
    reference = model.log_density(theta)
    np.testing.assert_allclose(small.log_density(theta), reference, rtol=1e-12)
    parallel = SoftmaxGLMPosterior(
        X, y, s, 3, prior_var=2.0, intercept_prior_var=5.0, max_bytes=4000, n_jobs=2
    )
    np.testing.assert_array_equal(parallel.log_density(theta), small.log_density(theta))
    with joblib.parallel_config(n_jobs=2):
        np.testing.assert_array_equal(small.log_density(theta), parallel.log_density(theta))


@pytest.mark.parametrize("sparse", [False, True])
def test_gradient_and_hessian_match_finite_differences(rng, sparse):
    _, _, _, model = make_problem(rng, k=4, sparse=sparse)
    theta = 0.5 * rng.standard_normal(model.dim)
    _, grad, hess = model.value_gradient_hessian(theta)
    eps = 1e-5
    basis = np.eye(model.dim)
    numeric_grad = [
        (model.log_density(theta + eps * e)[0] - model.log_density(theta - eps * e)[0]) / (2 * eps)
        for e in basis
    ]
    np.testing.assert_allclose(grad, numeric_grad, atol=1e-6)
    numeric_hess = np.array(
        [
            model.value_gradient_hessian(theta + eps * e)[1]
            - model.value_gradient_hessian(theta - eps * e)[1]
            for e in basis
        ]
    ) / (2 * eps)
    np.testing.assert_allclose(hess, -numeric_hess, atol=1e-6)
    np.testing.assert_array_equal(hess, hess.T)


def test_rejects_labels_out_of_range(rng):
    with pytest.raises(ValueError, match="class indices"):
        SoftmaxGLMPosterior(np.ones((3, 2)), [0, 1, 3], np.ones(3), 3, prior_var=1.0,
                            intercept_prior_var=None)  # fmt: skip


@pytest.mark.parametrize("general", [False, True])
def test_sampled_fit_in_the_contrasts_is_exact_on_a_gaussian_likelihood(rng, general):
    """The sampled fits draw only the contrasts (ContrastPosterior) and add the shift
    directions' prior conditional: with a likelihood Gaussian in the contrasts the posterior
    over θ and the evidence are Gaussian in closed form, and variational sampling is exact
    on them (to round-off), under the default prior and a general one (a full precision and
    a mean, as partial_fit's), where the shifts are correlated with the contrasts."""
    from vsbayes.estimators._strategy import VSMethod
    from vsbayes.models.softmax_contrasts import ContrastPosterior

    options = {}
    if general:
        root = rng.standard_normal((8, 8)) / 3.0
        options = {
            "prior_mean": rng.standard_normal(8),
            "prior_precision": root @ root.T + np.eye(8),
        }
    _, _, _, model = make_problem(rng, m=12, d=1, k=4, **options)
    basis = ContrastPosterior(model).basis  # (8, 6)
    root = rng.standard_normal((6, 6))
    H, a = root @ root.T + np.eye(6), rng.standard_normal(6)

    def log_likelihood(theta, single=False):  # Gaussian in the contrasts, flat along the shifts
        r = theta @ basis - a
        return -0.5 * np.einsum("ij,jk,ik->i", r, H, r)

    model.log_likelihood = log_likelihood
    prior_precision = model.prior_precision if general else np.diag(1.0 / model.prior_var)
    precision = prior_precision + basis @ H @ basis.T
    cov = np.linalg.inv(precision)
    mean = cov @ (prior_precision @ model.prior_mean + basis @ H @ a)
    # log ∫ exp(log L) N(θ; m, Σ₀) dθ, completing the square.
    log_Z = 0.5 * (
        mean @ precision @ mean
        - model.prior_mean @ prior_precision @ model.prior_mean
        - a @ H @ a
        + np.linalg.slogdet(prior_precision)[1]
        - np.linalg.slogdet(precision)[1]
    )
    method = VSMethod(
        n_samples=200,
        kernel="laplace",
        rule="mc",
        tol=1e-2,
        strategy="global",
        rounds=1,
        kernel_scale=1.5,
        target_kl=None,
        time_budget=None,
        max_iter=100,
    )
    kernel = vsbayes.Gaussian(mean + 0.3, 2.0 * cov)
    fit = method.draw(model, kernel, np.random.default_rng(0), 200)
    assert fit.dim == 8 and fit.n_samples == 200
    np.testing.assert_allclose(fit.mean, mean, rtol=1e-8, atol=1e-8 * np.abs(mean).max())
    np.testing.assert_allclose(fit.cov, cov, rtol=1e-8, atol=1e-8 * np.abs(cov).max())
    assert fit.log_Z == pytest.approx(log_Z, abs=1e-8)
    if not general:  # the default prior's representative: coefficients summing to zero
        assert np.abs(fit.mean[:4].sum()) < 1e-12 * np.abs(fit.mean).max()


# --- Laplace: the mode is scikit-learn's -------------------------------------------------


def _standardized(load):
    X, y = load(return_X_y=True)
    return StandardScaler().fit_transform(X), y


def load_500_digits(return_X_y):
    # 500 of the 1797 digits (about 50 per class) keep the case of many coefficients (10 × 65)
    # in a fraction of the time (scikit-learn's lbfgs to tol=1e-10 took most of it, 10×
    # less here); the relative errors below stay ~4× under the test's 1e-5 (5e-7 and 3e-6).
    X, y = load_digits(return_X_y=return_X_y)
    return X[:500], y[:500]


@pytest.mark.parametrize(
    ("load", "C"),
    [
        (load_iris, 0.1),
        (load_iris, 1.0),
        (load_wine, 0.1),
        (load_wine, 1.0),
        (load_500_digits, 1.0),
    ],
)
def test_laplace_mode_is_logistic_regression(load, C):
    X, y = _standardized(load)
    k = len(np.unique(y))
    model = SoftmaxGLMPosterior(X, y, np.ones(len(y)), k, prior_var=C, intercept_prior_var=1e6)
    laplace = softmax_laplace(model)
    W, b = model.split(laplace.mean)
    reference = LogisticRegression(C=C, tol=1e-10, max_iter=10_000).fit(X, y)
    assert np.abs(W - reference.coef_).max() <= 1e-5 * np.abs(reference.coef_).max()
    assert np.abs(b - reference.intercept_).max() <= 1e-5 * np.abs(reference.intercept_).max()
    # The symmetric representative: centred coefficients and intercepts.
    assert np.abs(W.sum(axis=0)).max() < 1e-10
    assert abs(b.sum()) < 1e-6
    assert laplace.converged


def test_laplace_with_weights_equals_duplicated_rows(rng):
    X, y, _, _ = make_problem(rng, m=30)
    counts = rng.integers(0, 3, len(y))
    counts[:3] = 1
    kwargs = {"prior_var": 1.0, "intercept_prior_var": 1e6}
    weighted = softmax_laplace(SoftmaxGLMPosterior(X, y, counts, 3, **kwargs))
    repeated = np.repeat(np.arange(len(y)), counts)
    duplicated = softmax_laplace(
        SoftmaxGLMPosterior(X[repeated], y[repeated], np.ones(len(repeated)), 3, **kwargs)
    )
    np.testing.assert_allclose(weighted.mean, duplicated.mean, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(weighted.cov, duplicated.cov, rtol=1e-7)
    assert weighted.log_Z == pytest.approx(duplicated.log_Z, rel=1e-10)


def test_laplace_covariance_is_the_inverse_negative_hessian(rng):
    _, _, _, model = make_problem(rng)
    laplace = softmax_laplace(model)
    _, grad, hess = model.value_gradient_hessian(laplace.mean)
    assert np.abs(grad).max() < 1e-8
    np.testing.assert_allclose(laplace.cov @ hess, np.eye(model.dim), atol=1e-8)


def test_laplace_refuses_matrices_beyond_memory(rng, monkeypatch):
    _, _, _, model = make_problem(rng)
    monkeypatch.setattr("vsbayes._memory.memory_limit", lambda: 1000.0)
    with pytest.raises(MemoryLimitError, match="OneVsRestClassifier"):
        softmax_laplace(model)


@pytest.mark.parametrize(
    "estimator", [vsbayes.LaplaceLogisticRegression(), vsbayes.VSLogisticRegression()]
)
def test_a_multinomial_posterior_too_large_to_factorize_is_refused_up_front(rng, estimator):
    # 3 classes × 3,334 columns = 10,002 parameters: each 10,002² factorization would take
    # 3.3e11 multiply-adds, tens of them per fit. The dense covariance asked for is refused
    # before any p × p matrix exists; by default the posterior takes a structured one.
    X = rng.standard_normal((6, 3333))
    with (
        vsbayes.config_context(covariance="dense"),
        pytest.raises(ValueError, match=r"10002 parameters.*covariance='lowrank'"),
    ):
        estimator.fit(X, [0, 1, 2, 0, 1, 2])
    # Its evidence's log-determinant is estimated: a structure chosen for the size records
    # the bounds and does not warn (one forced by config_context does, D-178).
    with warnings.catch_warnings():
        warnings.filterwarnings("error", r".*evidence \(log_marginal_likelihood_value_\) is an")
        fitted = estimator.fit(X, [0, 1, 2, 0, 1, 2])
    assert fitted.covariance_structure_ == "lowrank"
    low, high = fitted.posteriors_[0].evidence_bounds
    assert low <= float(fitted.log_marginal_likelihood_value_) <= high


# --- the predictive rule ------------------------------------------------------------------


def test_rule_is_exact_to_degree_three():
    z = symmetric_sobol_nodes(4)
    np.testing.assert_allclose(z.mean(axis=0), 0.0, atol=1e-15)
    np.testing.assert_allclose(z.T @ z / len(z), np.eye(4), atol=1e-12)
    q = centred_basis(5)
    np.testing.assert_allclose(q.T @ q, np.eye(4), atol=1e-14)
    np.testing.assert_allclose(q.sum(axis=0), 0.0, atol=1e-14)


def _trapezoid_reference(mean, cov, points, half_width=9.0):
    """A tensor trapezoid rule over the centred subspace, far finer than the estimators'."""
    k = mean.shape[1]
    q = centred_basis(k)
    t = np.linspace(-half_width, half_width, points)
    w1 = np.exp(-0.5 * t * t)
    w1 /= w1.sum()
    z = np.stack([g.ravel() for g in np.meshgrid(*([t] * (k - 1)), indexing="ij")], axis=1)
    w = np.prod(np.meshgrid(*([w1] * (k - 1)), indexing="ij"), axis=0).ravel()
    out = []
    for m, c in zip(mean, cov, strict=True):
        f = m + z @ (q @ np.linalg.cholesky(q.T @ c @ q)).T
        out.append(w @ np.exp(log_softmax(f, axis=1)))
    return np.array(out)


@pytest.mark.parametrize(
    ("k", "scale", "tolerance", "points"),
    [
        (3, 2.0, 1e-10, 201),
        # Some rows wider than the trapezoid's range (λ > 40): the adaptive rule's accuracy.
        (3, 5.0, TOLERANCE, 201),
        (4, 1.0, TOLERANCE, 71),
        (4, 5.0, TOLERANCE, 71),
    ],
)
def test_predictive_matches_a_reference_integral(k, scale, tolerance, points):
    rng = np.random.default_rng(k)
    mean = 2.0 * rng.standard_normal((5, k))
    roots = scale * rng.standard_normal((5, k, k)) / np.sqrt(k)
    cov = roots @ np.swapaxes(roots, 1, 2)  # centred variances up to ~10 (scale 2), ~70 (5)
    # A large common shift (the prior-only direction) changes nothing.
    log_p = softmax_predictive_log_proba(mean + 7.0, cov + 1e6 * np.ones((k, k)))
    np.testing.assert_allclose(np.exp(log_p).sum(axis=1), 1.0, rtol=1e-13)
    reference = _trapezoid_reference(mean, cov, points)
    np.testing.assert_allclose(np.exp(log_p), reference, atol=tolerance)


def test_predictive_keeps_tiny_probabilities_finite():
    # A class 200 nats below the others underflows float32's sums: its row is redone in
    # float64 log sums, so log p stays finite and near the plug-in value.
    k = 5
    mean = np.zeros((2, k))
    mean[0, -1] = -200.0
    cov = np.broadcast_to(0.01 * np.eye(k), (2, k, k))
    log_p = softmax_predictive_log_proba(mean, cov)
    assert np.isfinite(log_p).all()
    assert log_p[0, -1] == pytest.approx(-200.0 - np.log(k - 1), abs=0.05)
    np.testing.assert_allclose(np.exp(log_p[1]), 1.0 / k, atol=1e-6)


@pytest.mark.parametrize("r", [2, 6])  # Gram matrices from weighted copies, from outer products
def test_latent_gram_is_the_weighted_sum_of_outer_products(rng, r):
    _, _, _, model = make_problem(rng, m=30, d=3, k=7)
    m = model.n_observations
    a = rng.standard_normal((m, r, r))
    weights = a @ np.swapaxes(a, 1, 2)
    x = np.hstack([model.X, np.ones((m, 1))])
    expected = np.einsum("iac,ij,il->acjl", weights, x, x)
    np.testing.assert_allclose(model.latent_gram(weights), expected, rtol=1e-12, atol=1e-12)
    distinct = model.latent_gram(weights, distinct=True)  # the outer products' triangles
    np.testing.assert_allclose(distinct, expected, rtol=1e-12, atol=1e-12)
    if r == 6:  # from the outer products' distinct entries: symmetric blocks
        np.testing.assert_array_equal(distinct, np.swapaxes(distinct, 2, 3))


@pytest.mark.parametrize(("k", "d", "distinct"), [(10, 64, True), (3, 100, False)])
def test_latent_gram_by_default_takes_the_hessians_product(rng, monkeypatch, k, d, distinct):
    """``distinct=None`` (the Laplace error's covariance term) takes the rows' distinct
    products where Newton's Hessian does (10 classes × 65 columns, digits' shape: a sixth
    of the weighted copies' time) and the copies where they are the cheaper (3 × 101)."""
    _, _, _, model = make_problem(rng, m=20, d=d, k=k)
    a = rng.standard_normal((model.n_observations, k, k))
    weights = a @ np.swapaxes(a, 1, 2)
    taken = []
    for name in ("_outer_gram", "_copies_gram"):
        product = getattr(model, name)
        monkeypatch.setattr(
            model, name, lambda *args, _f=product, _n=name: taken.append(_n) or _f(*args)
        )
    gram = model.latent_gram(weights, distinct=None)
    assert taken == ["_outer_gram" if distinct else "_copies_gram"]
    assert model._distinct_cheaper(k * (k + 1) // 2) is distinct  # the Hessian's choice
    # The same sums in another order: round-off of the largest entry.
    expected = model.latent_gram(weights)
    np.testing.assert_allclose(gram, expected, rtol=0, atol=1e-12 * np.abs(expected).max())


def test_log_density_of_many_classes_matches_the_definition(rng):
    X, y, s, model = make_problem(rng, k=7)
    theta = rng.standard_normal((5, model.dim))
    expected = [direct_log_density(X, y, s, t, 7, True) for t in theta]
    np.testing.assert_allclose(model.log_density(theta), expected, rtol=1e-12)


def test_pair_columns_are_the_gathered_products(rng):
    from vsbayes.models.latent import _pair_columns

    x = rng.standard_normal((7, 5))
    col_j, col_l = np.triu_indices(5)
    np.testing.assert_array_equal(_pair_columns(x), x[:, col_j] * x[:, col_l])


def test_hessian_on_distinct_pairs_is_the_copies_one(rng):
    """From 6 classes on, Newton's Hessian takes the rows' distinct products of pairs of
    columns (where cheaper): the same sums as the weighted copies' up to round-off."""
    _, _, _, model = make_problem(rng, m=60, d=4, k=6)
    assert model._distinct_cheaper(21)
    theta = 0.5 * rng.standard_normal(model.dim)
    _, P = model.probabilities(theta)
    hess = model.hessian(P)
    first, second = np.triu_indices(model.n_classes)
    pairs = -(P[:, first] * P[:, second]) * model.sample_weight[:, None]
    pairs[:, first == second] += model.sample_weight[:, None] * P
    copies = model.to_layout(model._pair_gram(pairs, model.n_classes, False))
    copies = 0.5 * (copies + copies.T)
    np.testing.assert_allclose(hess, copies, rtol=0, atol=1e-12 * np.abs(copies).max())
    np.testing.assert_array_equal(hess, hess.T)


def test_kept_pair_products_give_the_same_bits_and_are_counted(rng, monkeypatch):
    """The rows' pair products kept for the fit (up to half a block's bytes) are the ones
    the passes would form block by block: the same Hessian bits; the multinomial EP's
    memory estimate counts them."""
    import importlib

    softmax_module = importlib.import_module("vsbayes.models.softmax")
    ep_module = importlib.import_module("vsbayes.approximations.softmax_ep")

    X, y, s, _ = make_problem(rng, m=60, d=4, k=6)

    def fitted(share):
        monkeypatch.setattr(softmax_module, "_PRODUCTS_SHARE", share)
        model = SoftmaxGLMPosterior(X, y, s, 6, prior_var=2.0, intercept_prior_var=5.0)
        _, P = model.probabilities(np.full(model.dim, 0.1))
        return model, model.hessian(P), ep_module.softmax_ep_cost(model)[0]

    kept, hess, cost = fitted(0.5)
    products = kept.pair_products()
    assert products is not None and kept.kept_products_bytes() == products.nbytes
    formed, hess_formed, cost_formed = fitted(0.0)
    assert formed.pair_products() is None and formed.kept_products_bytes() == 0
    np.testing.assert_array_equal(hess, hess_formed)
    assert cost - cost_formed == products.nbytes


def test_predict_refines_only_unsettled_rows_and_is_the_predictive_argmax(monkeypatch):
    # Digits' posterior rows are wide in every direction (the adaptive rule on all of
    # them): predict stops a row once its leader is settled, and is predict_proba's argmax
    # wherever predict_proba's lead exceeds twice its error bound ε on the row.
    from vsbayes.models import softmax_predictive_qmc as qmc_module

    rows_per_level = count_replicate_rows(monkeypatch)
    X, y = load_digits(return_X_y=True)
    X = StandardScaler().fit_transform(X)
    model = vsbayes.LaplaceLogisticRegression().fit(X[:300], y[:300])
    X = X[300:360]
    rows_per_level.clear()
    proba = model.predict_proba(X)
    refined_by_proba = sum(rows_per_level) - len(X)
    rows_per_level.clear()
    predicted = model.predict(X)
    assert sum(rows_per_level) - len(X) < refined_by_proba  # fewer rows refined
    mean, reduced = model._predictive().latent(X).centred(slice(None))
    root = np.linalg.cholesky(reduced)
    q = centred_basis(mean.shape[1])
    centred = mean - mean.mean(axis=1, keepdims=True)
    bound = qmc_module._adaptive_average(q @ root, root, centred, TOLERANCE, 2**24)[1]
    ordered = np.sort(proba, axis=1)
    clear = ordered[:, -1] - ordered[:, -2] > 2 * bound
    assert clear.mean() > 0.5
    np.testing.assert_array_equal(predicted[clear], model.classes_[proba[clear].argmax(axis=1)])
