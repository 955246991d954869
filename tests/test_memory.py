"""The memory guard (layer 0): a clear MemoryLimitError instead of numpy's MemoryError."""

import warnings

import numpy as np
import pytest
import sklearn

import vsbayes
from vsbayes import _memory
from vsbayes._memory import check_memory, format_bytes, memory_limit
from vsbayes.approximations import glm_laplace
from vsbayes.approximations._glm_gaussian import GLMGaussian
from vsbayes.exceptions import MemoryLimitError
from vsbayes.models import BinaryGLMPosterior


@pytest.mark.parametrize(
    ("nbytes", "text"),
    [
        (0, "0 bytes"),
        (100, "100 bytes"),
        (1023, "1023 bytes"),
        (1536, "1.5 KiB"),
        (120 * 2**30, "120 GiB"),
    ],
)
def test_format_bytes(nbytes, text):
    assert format_bytes(nbytes) == text


def test_memory_limit_is_a_fraction_of_physical_memory(monkeypatch):
    assert 2**20 < memory_limit() < 2**60

    def unavailable(name):
        raise ValueError(name)

    monkeypatch.setattr(_memory.os, "sysconf", unavailable)
    assert memory_limit() == 8 * 2**30


def test_check_memory_raises_with_the_estimate_limit_and_remedy(monkeypatch):
    monkeypatch.setattr(_memory, "memory_limit", lambda: 2.0**30)
    check_memory(2.0**29, "half the limit", "Nothing to do.")
    with pytest.raises(MemoryLimitError, match="the thing would allocate about 120 GiB") as info:
        check_memory(120 * 2.0**30, "the thing", "Use less.")
    assert "limit of 1 GiB" in str(info.value)
    assert str(info.value).endswith("Use less.")
    assert isinstance(info.value, ValueError)


def problem(rng, m, d, intercept=True):
    X = rng.standard_normal((m, d))
    y = np.where(rng.random(m) < 0.5, 1.0, -1.0)
    return (
        X,
        y,
        BinaryGLMPosterior(
            X,
            y,
            np.ones(m),
            "logistic",
            prior_var=1.0,
            intercept_prior_var=4.0 if intercept else None,
        ),
    )


def test_a_huge_covariance_raises_before_allocating(rng, monkeypatch):
    # 200,000 features, 3 observations: the dual Newton steps are cheap, the covariance is
    # 320 GB. The limit is lowered so that the test never depends on the machine.
    monkeypatch.setattr(_memory, "memory_limit", lambda: 16 * 2.0**30)
    _, _, model = problem(rng, m=3, d=200_000)
    laplace = glm_laplace(model)  # the mode needs no covariance: it is formed on first use
    with pytest.raises(MemoryLimitError, match=r"200001 × 200001 posterior covariance \(sigma_"):
        laplace.cov
    X = rng.standard_normal((4, 200_000))
    # The estimator keeps the exact dual (Woodbury) structure: dense only on request.
    fit = vsbayes.LaplaceLogisticRegression().fit(X, [0, 1, 0, 1])
    assert fit.covariance_structure_ == "dual"
    with pytest.raises(MemoryLimitError, match=r"sigma_\.diagonal\(\)"):
        np.asarray(fit.sigma_)
    with (
        vsbayes.config_context(covariance="dense"),
        pytest.raises(MemoryLimitError, match="'dual' structure would fit"),
    ):
        vsbayes.LaplaceLogisticRegression().fit(X, [0, 1, 0, 1])


def test_the_factorizations_are_guarded(rng, monkeypatch):
    monkeypatch.setattr(_memory, "memory_limit", lambda: 1000.0)
    _, _, tall = problem(rng, m=30, d=20)  # primal: three 21 × 21 matrices > 1000 bytes
    with pytest.raises(MemoryLimitError, match="21 × 21 posterior precision"):
        GLMGaussian(tall, np.ones(30))
    _, _, wide = problem(rng, m=12, d=40)  # dual: four 12 × 12 matrices > 1000 bytes
    with pytest.raises(MemoryLimitError, match="12 × 12 dual form"):
        GLMGaussian(wide, np.ones(12), form="dual")


def test_a_normal_fit_is_not_affected(rng):
    X, y, _ = problem(rng, m=200, d=5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fit = vsbayes.LaplaceLogisticRegression().fit(X, y > 0)
    assert fit.sigma_.shape == (6, 6)


def test_blocks_follow_scikit_learns_working_memory(rng):
    # One setting for every chunked pass: a smaller working_memory means smaller blocks,
    # and the same results up to the order of the sums.
    X, y, model = problem(rng, m=400, d=6)
    theta = rng.standard_normal((300, model.dim)) * 0.1
    assert _memory.block_bytes() == 2**30 // 4  # scikit-learn's default, 1024 MiB
    with sklearn.config_context(working_memory=1):
        assert _memory.block_bytes() == 2**18 and _memory.block_length(2**10) == 256
        small = BinaryGLMPosterior(
            X, y, np.ones(len(y)), "logistic", prior_var=1.0, intercept_prior_var=4.0
        )
        assert small.max_bytes == 2**18
        np.testing.assert_allclose(small.log_density(theta), model.log_density(theta), rtol=1e-12)
        fit = vsbayes.VSLogisticRegression(random_state=0).fit(X, y > 0)
    default = vsbayes.VSLogisticRegression(random_state=0).fit(X, y > 0)
    np.testing.assert_allclose(fit.coef_, default.coef_, rtol=1e-9)


def test_a_fit_is_sized_before_its_first_newton_step(rng, monkeypatch):
    # 50 rows × 400 features: the covariance held three times is ~3.9 MB against 1 MB.
    import vsbayes.estimators._base as base

    def no_newton(*args, **kwargs):
        raise AssertionError("Newton's method ran")

    monkeypatch.setattr(_memory, "memory_limit", lambda: 2.0**20)
    monkeypatch.setattr(base, "glm_laplace", no_newton)
    X = rng.standard_normal((50, 400))
    for cls in (vsbayes.VSLogisticRegression, vsbayes.EPProbitRegression):
        with (
            vsbayes.config_context(covariance="dense"),
            pytest.raises(MemoryLimitError, match=r"dense covariance.*'dual' structure"),
        ):
            cls().fit(X, X[:, 0] > 0)


def test_freed_pages_are_kept_for_the_next_arrays():
    # Ten arrays of 1 MiB made and freed 20 times: glibc's default thresholds return the
    # heap's top after each round, and the next round faults its 2560 pages in again
    # (~51,000 faults measured); kept, the rounds after the first take none. The bound
    # leaves room for what other threads of the process allocate meanwhile.
    if not _memory.keep_freed_pages():
        pytest.skip("not glibc, or the environment sets glibc's malloc itself")
    resource = pytest.importorskip("resource")

    def faults() -> int:
        start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(20):
            arrays = [np.ones(2**17) for _ in range(10)]
            del arrays
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start

    faults()
    assert faults() < 500


@pytest.mark.parametrize(
    "variable, value",
    [("MALLOC_TRIM_THRESHOLD_", "131072"), ("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=1")],
)
def test_the_users_malloc_settings_are_left_alone(monkeypatch, variable, value):
    monkeypatch.setenv(variable, value)
    assert not _memory._set_malloc_thresholds()
