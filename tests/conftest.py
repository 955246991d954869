"""Fixtures of the test suite (helpers to import are in ``_helpers.py``)."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest
import scipy.linalg  # noqa: F401 (loads SciPy's BLAS, for the limit below)
from _helpers import (
    C_SMALL,
    EARLY_SUBPROCESSES,
    SKLEARN_CHECKS,
    offloaded,
    quadrature_posterior,
)
from hypothesis import settings
from threadpoolctl import ThreadpoolController

# SciPy's BLAS on one thread for the session. vsbayes' fits run BLAS on one thread (see
# vsbayes/_blas.py), but the references the tests compute are not fits: scikit-learn's
# LogisticRegression (L-BFGS-B calls SciPy's BLAS on tiny vectors) fitted 500 digits in
# 2.6 s on two threads with the machine busy, 0.1 s on one. NumPy's BLAS keeps its threads,
# whose count sets how many blocks vsbayes' fits run side by side.
for _library in ThreadpoolController().lib_controllers:
    if _library.user_api == "blas" and os.path.basename(os.path.dirname(_library.filepath)) == (
        "scipy.libs"
    ):
        _library.set_num_threads(1)

# Hypothesis profiles, chosen by HYPOTHESIS_PROFILE. "ci" (the default) runs the same few
# examples every time (derandomized), a few seconds in all; "thorough" draws 5000 new ones
# per run (a few minutes), printing what reproduces a failure. A test's own @settings
# holds only what is true of it (deadline, health checks), never the number of examples.
settings.register_profile("ci", max_examples=120, derandomize=True)
settings.register_profile(
    "thorough", max_examples=5000, derandomize=False, database=None, print_blob=True
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def _global_seeds() -> list[int]:
    """Seeds of ``global_random_seed``: ``VSBAYES_TESTS_GLOBAL_RANDOM_SEED`` is an int, a
    range ``a-b`` (inclusive) or ``all`` (0-99); unset, one seed (42) keeps the suite fast."""
    spec = os.environ.get("VSBAYES_TESTS_GLOBAL_RANDOM_SEED", "42")
    if spec == "all":
        return list(range(100))
    if "-" in spec:
        low, high = (int(s) for s in spec.split("-"))
        return list(range(low, high + 1))
    return [int(spec)]


@pytest.fixture(params=_global_seeds())
def global_random_seed(request):
    """A seed for tests whose assertion must hold for any seed (scikit-learn's practice):
    run them over many with ``VSBAYES_TESTS_GLOBAL_RANDOM_SEED=all``."""
    return request.param


@pytest.fixture
def rng():
    return np.random.default_rng(20131007)


@pytest.fixture(scope="session")
def small_data():
    """30 observations, one feature: a skewed posterior over (slope, intercept)."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal(30)
    y = (rng.random(30) < 1 / (1 + np.exp(-(2.5 * x + 1)))).astype(int)
    return x[:, None], y


@pytest.fixture(scope="session")
def small_data_posteriors(small_data):
    """``posteriors(link)``: Laplace's posterior of ``small_data`` under ``C_SMALL`` and the
    quadrature posterior around it, computed once a link for the files that compare with
    them (the 601 x 601 grid is 0.1-0.2 s)."""
    from vsbayes import LaplaceLogisticRegression, LaplaceProbitRegression

    X, y = small_data
    laplace_classes = {"logistic": LaplaceLogisticRegression, "probit": LaplaceProbitRegression}
    cache: dict[str, tuple] = {}

    def posteriors(link: str):
        if link not in cache:
            laplace = laplace_classes[link](C=C_SMALL).fit(X, y).posteriors_[0]
            cache[link] = laplace, quadrature_posterior(X, y, link, C_SMALL, laplace)
        return cache[link]

    return posteriors


def pytest_collection_modifyitems(items):
    """scikit-learn's check suites last: their own process (started after the others) runs
    them beside the suite's other tests, whose outcomes it then only reports (D-135)."""
    checks = [item for item in items if offloaded(item)]
    if checks:
        items[:] = [item for item in items if not offloaded(item)] + checks


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    if offloaded(pyfuncitem):
        SKLEARN_CHECKS.replay(pyfuncitem)
        return True
    return None


def pytest_collection_finish(session):
    """Start the subprocesses of the selected tests that run one (the CLI's launch, the docs
    build, the examples, the memory fuzz: ~25 s of CPU; scikit-learn's checks, ~45 s), and
    the dask tests' cluster, in the order their tests come, one at a time, to run on the
    other core while the tests before theirs run here."""
    if session.config.option.collectonly:
        return
    wanted: dict[str, list] = {}  # in the order of each one's first test
    for item in session.items:
        for name in getattr(item, "fixturenames", ()):
            if name in EARLY_SUBPROCESSES:
                wanted.setdefault(name, []).append(item)
        if offloaded(item):
            wanted.setdefault(SKLEARN_CHECKS.process.name, []).append(item)
    for name, items in wanted.items():
        EARLY_SUBPROCESSES[name].items = items
    early = [EARLY_SUBPROCESSES[name] for name in wanted]
    # A daemon: a session that ends first does not wait for it (pytest_sessionfinish stops
    # the subprocesses).
    threading.Thread(target=_run_in_turn, args=(early,), daemon=True).start()


def _run_in_turn(early) -> None:
    for each in early:
        each.start()
        each.wait()


def pytest_sessionfinish(session):
    for early in EARLY_SUBPROCESSES.values():
        early.stop()
