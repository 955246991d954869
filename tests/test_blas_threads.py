"""BLAS's thread limit around fits started in threads (vsbayes/_blas.py, D-154).

NumPy's and SciPy's OpenBLAS 0.3.30/0.3.31 ignore ``openblas_set_num_threads`` from a thread
other than the main one once the main thread has called it. Each test therefore sets the
limit from the main thread first (``threadpool_limits``), the state every program that has
fitted once, or used threadpoolctl, is in.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
from joblib import Parallel, delayed
from threadpoolctl import threadpool_limits

import vsbayes
from vsbayes import _blas


def _limits() -> list[int]:
    return [int(lib.get_num_threads()) for lib in _blas._libraries()]


@pytest.fixture
def two_threads():
    """BLAS at two threads, set from the main thread (restored after the test)."""
    with threadpool_limits(2, user_api="blas"):
        if min(_limits(), default=1) < 2:
            pytest.skip("BLAS runs one thread here")
        yield _limits()


def _run_in_thread(func, *args):
    out, errors = [], []

    def target():
        try:
            out.append(func(*args))
        except BaseException as error:  # re-raised in the test's thread
            errors.append(error)

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return out[0]


def test_single_blas_thread_entered_in_a_thread_sets_and_restores_the_limit(two_threads):
    def inside():
        with _blas.single_blas_thread():
            return _limits(), _blas.worker_threads()

    limits, workers = _run_in_thread(inside)
    assert limits == [1] * len(two_threads)
    assert workers == max(two_threads)
    assert _limits() == two_threads


def _data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(80, 3))
    y = (X @ [1.0, -0.5, 0.25] + rng.logistic(size=80) > 0).astype(int)
    return X, y


@pytest.mark.parametrize("how", ["main", "thread", "two threads at once"])
def test_fits_run_blas_on_one_thread_wherever_they_start(two_threads, monkeypatch, how):
    # The limits a fit's passes see (read where they ask for their worker threads), the
    # limits after it, and the same bits wherever it ran.
    X, y = _data()
    seen = []
    worker_threads = _blas.worker_threads

    def spy():
        seen.append(tuple(_limits()))
        return worker_threads()

    def fit():
        return vsbayes.VSLogisticRegression(random_state=0).fit(X, y).coef_

    reference = fit()
    monkeypatch.setattr(_blas, "worker_threads", spy)
    if how == "main":
        coefs = [fit()]
    elif how == "thread":
        coefs = [_run_in_thread(fit)]
    else:
        coefs = Parallel(n_jobs=2, backend="threading")(delayed(fit)() for _ in range(2))
    assert seen and set(seen) == {(1,) * len(two_threads)}
    assert _limits() == two_threads
    for coef in coefs:
        np.testing.assert_array_equal(coef, reference)


def test_overlapping_fits_in_threads_keep_one_thread_until_the_last_ends(two_threads):
    # A enters, B enters, A leaves while B still runs (the limit stays 1 for B), B leaves
    # (the user's limit comes back).
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def fit_a():
        with _blas.single_blas_thread():
            a_in.set()
            b_in.wait(10)
        a_out.set()

    def fit_b():
        a_in.wait(10)
        with _blas.single_blas_thread():
            b_in.set()
            a_out.wait(10)
            seen["b after a left"] = _limits()

    threads = [threading.Thread(target=fit_a), threading.Thread(target=fit_b)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert a_out.is_set() and seen["b after a left"] == [1] * len(two_threads)
    assert _limits() == two_threads


def test_a_limit_set_during_a_fit_in_a_thread_is_kept(two_threads):
    # A limit changed for good while a fit runs elsewhere is its owner's: the fit's end
    # does not put back the one it found.
    entered, changed = threading.Event(), threading.Event()

    def fit():
        with _blas.single_blas_thread():
            entered.set()
            changed.wait(10)

    thread = threading.Thread(target=fit)
    thread.start()
    entered.wait(10)
    for lib in _blas._libraries():
        lib.set_num_threads(3)  # from the main thread, as threadpoolctl's own calls
    changed.set()
    thread.join()
    assert _limits() == [3] * len(two_threads)


def test_loo_runs_on_one_blas_thread(two_threads, monkeypatch):
    # Its draws' and cavities' products are a block of rows' at a time; on two BLAS threads
    # under load they stalled (loo took twice the CPU time; D-166).
    from vsbayes.estimators import _leave_one_out

    rng = np.random.default_rng(0)
    X = rng.standard_normal((40, 3))
    y = (X[:, 0] + rng.standard_normal(40) > 0).astype(int)
    fitted = vsbayes.EPLogisticRegression().fit(X, y)
    seen = []
    cavity_terms = _leave_one_out._ep_cavity_terms

    def recording(*args):
        seen.extend(_limits())
        return cavity_terms(*args)

    monkeypatch.setattr(_leave_one_out, "_ep_cavity_terms", recording)
    fitted.loo(X, y)
    assert seen and set(seen) == {1}
    assert _limits() == two_threads  # restored after


def test_a_large_reads_covariance_factor_runs_on_one_blas_thread(two_threads, monkeypatch):
    # predict_proba above SMALL_WORK runs at BLAS's threads (its row blocks each take one);
    # its covariance's Cholesky on two OpenBLAS threads took 1.65 s at 805 × 805 under
    # another process's load, 35 ms on one.
    import scipy.linalg

    from vsbayes.models import latent

    rng = np.random.default_rng(0)
    X = rng.standard_normal((60, 200))
    y = (X[:, 0] + rng.standard_normal(60) > 0).astype(int)
    fitted = vsbayes.LaplaceLogisticRegression().fit(X, y)
    seen, cholesky = [], scipy.linalg.cholesky

    def recording(*args, **kwargs):
        seen.extend(_limits())
        return cholesky(*args, **kwargs)

    monkeypatch.setattr(latent.scipy.linalg, "cholesky", recording)
    monkeypatch.setattr(_blas, "SMALL_WORK", 1.0)  # (the read's own policy: default threads)
    fitted.predict_proba(X)
    assert seen and set(seen) == {1}
    assert _limits() == two_threads


def test_the_multinomial_reads_blocks_run_on_one_blas_thread(two_threads, monkeypatch):
    # The multinomial predictive's set-up (the centred covariance's blocks, two GEMMs of
    # K·w² · K·w) as the binary factor: under another process's load, two OpenBLAS threads
    # took 6 times as long on digits' 650 parameters (D-260).
    from sklearn.datasets import make_classification

    from vsbayes.models import latent

    X, y = make_classification(
        n_samples=90, n_features=5, n_informative=4, n_redundant=0, n_classes=3, random_state=0
    )
    fitted = vsbayes.LaplaceLogisticRegression().fit(X, y)
    seen, congruence = [], latent.class_congruence

    def recording(*args, **kwargs):
        seen.extend(_limits())
        return congruence(*args, **kwargs)

    monkeypatch.setattr(latent, "class_congruence", recording)
    monkeypatch.setattr(_blas, "SMALL_WORK", 1.0)  # (the read's own policy: default threads)
    fitted.predict_proba(X)
    assert seen and set(seen) == {1}
    assert _limits() == two_threads
