"""Asking the VS estimators for an accuracy (target_kl) or a time budget instead of N."""

import math

import numpy as np
import pytest

import vsbayes
from vsbayes import n_family_params


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(3)
    X = rng.standard_normal((150, 3))
    y = (X @ [1.0, -0.5, 0.3] + rng.logistic(size=150) > 0).astype(int)
    return X, y


def test_target_kl_is_met_by_the_global_fit(data):
    X, y = data
    target = 2e-3
    est = vsbayes.VSLogisticRegression(strategy="global", target_kl=target, random_state=0)
    est.fit(X, y)
    n = n_family_params(X.shape[1] + 1)
    assert est.stop_reason_.tolist() == ["target_kl"]
    # kl_error times its 90 % quantile factor (a χ² with n degrees of freedom).
    assert est.kl_error_[0] * (1 + 1.2816 * math.sqrt(2 / n)) <= target
    plain = vsbayes.VSLogisticRegression(strategy="global", random_state=0).fit(X, y)
    assert plain.stop_reason_.tolist() == ["n_samples"]
    assert est.posteriors_[0].n_samples >= plain.posteriors_[0].n_samples


def test_a_spent_time_budget_keeps_the_planned_points(data):
    X, y = data
    est = vsbayes.VSLogisticRegression(strategy="global", time_budget=1e-9, random_state=0)
    plain = vsbayes.VSLogisticRegression(strategy="global", random_state=0)
    est.fit(X, y)
    plain.fit(X, y)
    assert est.stop_reason_.tolist() == ["time_budget"]
    np.testing.assert_array_equal(est.coef_, plain.coef_)


def test_site_fits_report_no_sampling_error(data):
    X, y = data
    est = vsbayes.VSLogisticRegression(strategy="sites", target_kl=1e-3).fit(X, y)
    assert np.isnan(est.kl_error_).all() and est.stop_reason_.tolist() == [None]


@pytest.mark.parametrize("name", ["target_kl", "time_budget"])
@pytest.mark.parametrize("value", [0.0, -1.0, "fast"])
def test_accuracy_and_budget_are_validated(data, name, value):
    X, y = data
    with pytest.raises((ValueError, TypeError), match=name):
        vsbayes.VSLogisticRegression(**{name: value}).fit(X, y)


def test_the_default_target_drives_the_data_rich_global_fit_only(data):
    # Data-rich (M ≥ 50n): "auto" takes the global fit by itself, and asks it for 0.01 nats.
    rng = np.random.default_rng(4)
    X = rng.standard_normal((20_000, 3))
    y = (X @ [1.0, -0.5, 0.3] + rng.logistic(size=20_000) > 0).astype(int)
    rich = vsbayes.VSLogisticRegression(random_state=0).fit(X, y)
    n = n_family_params(X.shape[1] + 1)
    assert rich.strategy_.tolist() == ["global"] and rich.stop_reason_.tolist() == ["target_kl"]
    assert rich.kl_error_[0] * (1 + 1.2816 * math.sqrt(2 / n)) <= 0.01
    # Elsewhere "auto" asks nothing: the same fit as without a target.
    X, y = data
    for strategy in ("auto", "global"):
        default = vsbayes.VSLogisticRegression(strategy=strategy, random_state=0).fit(X, y)
        none = vsbayes.VSLogisticRegression(strategy=strategy, target_kl=None, random_state=0)
        np.testing.assert_array_equal(default.coef_, none.fit(X, y).coef_)
    assert default.stop_reason_.tolist() == ["n_samples"]


def test_a_time_budget_alone_lets_the_points_grow_to_what_fits_in_memory():
    # With a target, added rounds stop at 64 × n_samples; a budget alone is the user's own
    # limit, so only memory caps the points (a 64× cap stopped 2 s fits at 0.8 of it).
    import time

    from vsbayes._memory import memory_limit

    budget_only = vsbayes.VSLogisticRegression(time_budget=10.0, target_kl=None)
    with_target = vsbayes.VSLogisticRegression(time_budget=10.0, target_kl=1e-3)
    for estimator in (budget_only, with_target):
        estimator._started = time.perf_counter()
    affordable = int(memory_limit() // budget_only._planned_bytes(5, 1))
    assert affordable > 64 * 100
    assert budget_only._engine_options(5, 100)["max_samples"] == affordable
    assert with_target._engine_options(5, 100)["max_samples"] == 64 * 100


def test_a_time_budget_plans_its_last_round_to_fill_it():
    # The rule is given the rounds' timings: at 1 s a point to draw and 1 s a point to fit,
    # a round of s points on a pool of N costs s + (N + s).
    from vsbayes.engine.results import RoundInfo
    from vsbayes.engine.variational_sampling import _MARGIN, _extension

    kernel = vsbayes.Gaussian(np.zeros(2), np.eye(2))
    extend = _extension(10, 6, None, 10_000, 300.0)
    infos = [RoundInfo(kernel, 10, 1, True, 10.0, 10.0)]  # 20 s spent on a pool of 10
    # Doubling (10 + 20 s) leaves room for more rounds: double.
    assert extend(None, infos, 20.0) == (10, None)
    # 120 s left: doubling (30 s) would leave 90 s, and the smallest round after it (2 points,
    # 24 s) fits with the margin; with 50 s left it does not, so the round fills the rest.
    assert extend(None, infos, 180.0) == (10, None)
    size, reason = extend(None, infos, 250.0)
    assert reason is None
    assert size == math.floor((50.0 / _MARGIN - 10.0) / 2.0)
    # Not even an eighth of the pool fits: stop.
    assert extend(None, infos, 290.0) == (0, "time_budget")
