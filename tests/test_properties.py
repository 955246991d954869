"""Property-based tests: random small problems never crash or return garbage.

Hypothesis draws the data (size, dimension, class balance, feature scales, weights) and the
estimator (link × method) and its prior. Every fit either raises a ValueError that names
the problem and its remedy, or returns a valid posterior (``assert_valid_fit``) with at most
the documented warnings. How many examples, and whether they are the same each run, is the
Hypothesis profile's choice (tests/conftest.py; HYPOTHESIS_PROFILE=thorough for many).
"""

import warnings

import numpy as np
from _helpers import ALL, SAMPLING, assert_valid_fit
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from sklearn.exceptions import ConvergenceWarning

from vsbayes.exceptions import UnreliableFitWarning

# What each known ValueError must say: every other error is a bug.
KNOWN_ERRORS = (
    "class",  # a single class (or a single class with positive weight)
    "weight",  # all weights zero
    "Standardize the features",  # a posterior too elongated for float64
)


@st.composite
def problems(draw):
    n_obs = draw(st.integers(2, 60))
    n_features = draw(st.integers(1, 6))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    scales = 10.0 ** draw(st.integers(-8, 8))  # one scale for all columns ...
    if draw(st.booleans()):  # ... or one per column
        scales = 10.0 ** rng.integers(-8, 9, n_features)
    X = rng.standard_normal((n_obs, n_features)) * scales
    share = draw(st.floats(0.02, 0.98))
    y = (rng.random(n_obs) < share).astype(int)
    if draw(st.integers(0, 9)) < 9:  # mostly two classes (else: the one-class error)
        y[:2] = [0, 1]
    weights = None
    if draw(st.booleans()):
        weights = rng.exponential(size=n_obs) * (rng.random(n_obs) > 0.2)
    return X, y, weights


# A fit takes milliseconds to a second: no deadline, and slow data generation is expected.
@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    problem=problems(),
    cls=st.sampled_from(ALL),
    log10_C=st.integers(-2, 5),
    fit_intercept=st.booleans(),
)
def test_a_fit_is_valid_or_a_clear_value_error(problem, cls, log10_C, fit_intercept):
    X, y, weights = problem
    params = {"C": 10.0**log10_C, "fit_intercept": fit_intercept}
    if cls in SAMPLING:
        params["random_state"] = 0
    estimator = cls(**params)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            estimator.fit(X, y, sample_weight=weights)
        except ValueError as error:
            assert any(known in str(error) for known in KNOWN_ERRORS), str(error)
            event(str(error)[:60])
            return
    event("fitted")
    unexpected = [
        str(w.message)
        for w in caught
        if not issubclass(w.category, (UnreliableFitWarning, ConvergenceWarning))
    ]
    assert not unexpected
    assert_valid_fit(estimator, X)
