"""Helpers shared by the tests (importable in any import mode: ``pythonpath`` in
pyproject.toml puts this directory on ``sys.path``; fixtures live in conftest.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from xml.etree import ElementTree

import numpy as np
from scipy.special import logsumexp

from vsbayes import Gaussian
from vsbayes.estimators import ESTIMATORS, INTERCEPT_PRIOR_VAR, METHODS
from vsbayes.models import BinaryGLMPosterior

# From the estimators' registry: a new estimator is tested without editing this file.
DETERMINISTIC = [c for m in METHODS.values() if not m.sampling for c in m.classes.values()]
SAMPLING = [c for m in METHODS.values() if m.sampling for c in m.classes.values()]
ALL = list(ESTIMATORS)


def make(cls, **params):
    if cls in SAMPLING:
        params.setdefault("random_state", 0)
    return cls(**params)


def assert_valid_fit(estimator, X) -> None:
    """What every successful fit guarantees: finite attributes, a symmetric positive-definite
    posterior covariance per problem, and predictive probabilities that are distributions."""
    for name in ("coef_", "intercept_", "sigma_", "log_marginal_likelihood_value_"):
        assert np.all(np.isfinite(getattr(estimator, name))), name
    covs = estimator.sigma_ if estimator.sigma_.ndim == 3 else estimator.sigma_[None]
    for cov in covs:
        np.testing.assert_array_equal(cov, cov.T)
        np.linalg.cholesky(cov)  # raises unless positive definite
    proba = estimator.predict_proba(X)
    assert np.all((proba >= 0) & (proba <= 1))
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-12)


#: Prior variance of the small 2-D GLM problem (vague enough for a skewed posterior).
C_SMALL = 10.0


def count_replicate_rows(monkeypatch) -> list[int]:
    """The rows each level of the multinomial predictive's replicate QMC rule averages, one
    entry per call, appended as the rule runs (``_replicate_averages`` wrapped)."""
    from vsbayes.models import softmax_predictive_qmc

    rows_per_level: list[int] = []
    replicate_averages = softmax_predictive_qmc._replicate_averages

    def counted(factor, *args):
        rows_per_level.append(len(factor))
        return replicate_averages(factor, *args)

    monkeypatch.setattr(softmax_predictive_qmc, "_replicate_averages", counted)
    return rows_per_level


def random_spd(rng, d, low=0.5, high=2.0):
    """Random symmetric positive-definite matrix with eigenvalues in [low, high]."""
    q, _ = np.linalg.qr(rng.standard_normal((d, d)))
    return (q * rng.uniform(low, high, d)) @ q.T


def random_gaussian(rng, d, log_Z=0.0, diagonal=False):
    cov = np.diag(rng.uniform(0.5, 2.0, d)) if diagonal else random_spd(rng, d)
    return Gaussian(rng.standard_normal(d), cov, log_Z)


def nearby_kernel(rng, target, offset=0.5, low=0.6, high=1.6):
    """A kernel whose mean is ``offset`` target sds away and whose covariance is the
    target's, distorted by factors in [low, high]: 'arbitrary but non-degenerate'."""
    d = target.dim
    half = target.chol @ random_spd(rng, d, np.sqrt(low), np.sqrt(high))
    direction = rng.standard_normal(d)
    direction /= np.linalg.norm(direction)
    return Gaussian(target.mean + offset * target.chol @ direction, half @ half.T)


class Recorder:
    """Wraps a log-density and keeps every batch of points it was called with."""

    def __init__(self, log_target):
        self.log_target = log_target
        self.calls = []

    def __call__(self, x):
        self.calls.append(np.array(x, copy=True))
        return self.log_target(x)

    @property
    def points(self):
        return np.concatenate(self.calls)


def quadrature_posterior(X, y, link, C, around: Gaussian) -> Gaussian:
    """Evidence, mean and covariance of a 2-parameter GLM posterior by the trapezoid rule
    on ±12 sd of ``around``; the integrand is smooth and decays like a Gaussian, so the
    rule's error is far below the Monte Carlo errors it is compared with."""
    model = BinaryGLMPosterior(
        X, 2.0 * y - 1, np.ones(len(y)), link, prior_var=C, intercept_prior_var=INTERCEPT_PRIOR_VAR
    )
    grid = np.linspace(-12, 12, 601)
    sd = np.sqrt(np.diag(around.cov))
    a, b = np.meshgrid(around.mean[0] + grid * sd[0], around.mean[1] + grid * sd[1])
    points = np.column_stack([a.ravel(), b.ravel()])
    log_p = model.log_density(points)
    cell = (grid[1] - grid[0]) ** 2 * sd[0] * sd[1]
    weights = np.exp(log_p - logsumexp(log_p))
    mean = weights @ points
    centered = points - mean
    cov = (centered * weights[:, None]).T @ centered
    return Gaussian(mean, cov, logsumexp(log_p) + np.log(cell))


#: The EarlySubprocess of each fixture name that runs one (tests/conftest.py starts them).
EARLY_SUBPROCESSES: dict[str, EarlySubprocess] = {}


class EarlySubprocess:
    """A test's command run in a process of its own, started before its test: by
    tests/conftest.py, once the tests are collected, when a selected test uses the fixture
    ``name``, in turn with the others (one at a time: with the suite's process, two busy
    cores), so that it runs on the machine's other core while the tests before its own run
    on this one. Its test then waits for it (:meth:`result`, which starts it at once if its
    turn has not come).

    ``args(scratch, items)`` is the command, given an empty scratch directory of its own,
    removed at the session's end, and the selected test items that use it (:attr:`items`;
    empty when none were said: all of them); ``env()`` its environment (None: this
    process's); ``when()`` whether it can run here at all (else its test skips or fails by
    itself, unstarted).
    """

    def __init__(
        self,
        name: str,
        args: Callable[[Path, Sequence], list[str]],
        env: Callable[[], dict[str, str]] | None = None,
        when: Callable[[], bool] = lambda: True,
        timeout: float = 600.0,
    ):
        self.name, self.args, self.env, self.when, self.timeout = name, args, env, when, timeout
        self.items: Sequence = ()
        self.scratch: Path | None = None
        self._process: subprocess.Popen | None = None
        self._started = 0.0
        self._stopped = False
        # The conftest's thread and the test's fixture may start it at the same time.
        self._lock = threading.Lock()
        EARLY_SUBPROCESSES[name] = self

    def start(self) -> None:
        with self._lock:
            if self._process is not None or self._stopped or not self.when():
                return
            self.scratch = Path(tempfile.mkdtemp(prefix=f"vsbayes-tests-{self.name}-"))
            # Files, not pipes: nothing reads the output before the test, and a full pipe
            # would stop the process.
            with (
                open(self.scratch / "stdout", "wb") as stdout,
                open(self.scratch / "stderr", "wb") as stderr,
            ):
                self._process = subprocess.Popen(
                    self.args(self.scratch, self.items),
                    stdout=stdout,
                    stderr=stderr,
                    env=None if self.env is None else self.env(),
                )
            self._started = time.monotonic()

    def wait(self) -> None:
        """Until the process ends (at once if it was not started)."""
        if self._process is not None:
            self._process.wait()

    def result(self) -> subprocess.CompletedProcess:
        """The finished process (started now if it was not), its output as text."""
        self.start()
        assert self._process is not None and self.scratch is not None
        try:
            waited = self.timeout - (time.monotonic() - self._started)
            returncode = self._process.wait(timeout=max(waited, 0.0))
        except subprocess.TimeoutExpired:
            self._process.kill()
            raise
        return subprocess.CompletedProcess(
            self._process.args,
            returncode,
            (self.scratch / "stdout").read_text(),
            (self.scratch / "stderr").read_text(),
        )

    def stop(self) -> None:
        """Never start; kill the process if it still runs (a session stopped early), remove
        the scratch directory."""
        with self._lock:
            self._stopped = True
            if self._process is not None and self._process.poll() is None:
                self._process.kill()
                self._process.wait()
            if self.scratch is not None:
                shutil.rmtree(self.scratch, ignore_errors=True)


def _import_vsbayes() -> None:
    import vsbayes  # noqa: F401


class EarlyCluster:
    """A ``distributed`` LocalCluster (two single-threaded worker processes) and a client of
    it (not the default one), started like an :class:`EarlySubprocess` for the fixture
    ``name`` (in turn with them, by tests/conftest.py), its workers then importing vsbayes
    (each ~1.5 s of CPU): on the other core while the tests before its own run. The module
    using it takes :meth:`client` (started now if its turn has not come) and, once done,
    :meth:`close_soon`: the workers stop in the background (~2 s) while later tests run;
    :meth:`stop`, at the session's end, waits for that."""

    def __init__(self, name: str, timeout: float = 300.0):
        self.name, self.timeout = name, timeout
        self.items: Sequence = ()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closing: threading.Thread | None = None
        self._ready = threading.Event()
        self._cluster = self._client = None
        self._error: BaseException | None = None
        self._stopped = False
        EARLY_SUBPROCESSES[name] = self  # conftest.py starts it with them

    def start(self) -> None:
        with self._lock:
            if self._thread is not None or self._stopped:
                return
            self._thread = threading.Thread(target=self._start, daemon=True)
            self._thread.start()

    def _start(self) -> None:
        try:
            import distributed

            # Worker processes: the chunks' objects and the tasks go through pickling, as
            # on a real cluster. (Spawned, not forked: forked from the suite's process,
            # whose other threads may hold locks, a worker hung at its start.)
            self._cluster = distributed.LocalCluster(
                n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
            )
            self._client = distributed.Client(self._cluster, set_as_default=False)
            self._client.run(_import_vsbayes)
        except BaseException as error:  # raised again in the test's process by client()
            self._error = error
        finally:
            self._ready.set()

    def wait(self) -> None:
        """Until the cluster is up and its workers have imported vsbayes (or failed)."""
        if self._thread is not None:
            self._ready.wait(self.timeout)

    def client(self):
        """The cluster's client (the cluster started now if it was not)."""
        self.start()
        if not self._ready.wait(self.timeout):
            raise TimeoutError(f"the LocalCluster did not start within {self.timeout} s")
        if self._error is not None:
            raise self._error
        return self._client

    def close_soon(self) -> None:
        """Close the client and the cluster in the background."""
        with self._lock:
            if self._closing is None and self._thread is not None:
                self._closing = threading.Thread(target=self._close, daemon=True)
                self._closing.start()

    def _close(self) -> None:
        self._ready.wait(self.timeout)
        for each in (self._client, self._cluster):
            if each is not None:
                each.close()

    def stop(self) -> None:
        """Never start; close the cluster if it is up, and wait until it is closed."""
        with self._lock:
            self._stopped = True
        self.close_soon()
        if self._closing is not None:
            self._closing.join(60.0)


# --- scikit-learn's check suites in a process of their own ----------------------------------

#: Set (to anything), scikit-learn's check suites run in the suite's process like any test
#: (to debug a check, e.g. with --pdb); unset, a process of their own runs them (D-135).
CHECKS_IN_PROCESS = "VSBAYES_TESTS_CHECKS_IN_PROCESS"
#: The tests whose items that process runs: the ``parametrize_with_checks`` suites.
OFFLOADED_TESTS = frozenset({"test_sklearn_compatible", "test_sklearn_compatible_ard"})


def offloaded(item) -> bool:
    """Whether a test item's outcome is the one scikit-learn's checks' process reports."""
    return getattr(item, "originalname", None) in OFFLOADED_TESTS and not os.environ.get(
        CHECKS_IN_PROCESS
    )


def _checks_command(scratch: Path, items: Sequence) -> list[str]:
    if not items:  # no item ids would run every test
        raise ValueError("scikit-learn's checks' process needs the items it runs")
    return [
        sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
        f"--junitxml={scratch / 'checks.xml'}", *(f"{item.path}::{item.name}" for item in items),
    ]  # fmt: skip


# BLAS on one thread in the checks' process: its pool and the suite's process's would spin
# against each other on two cores (vsbayes' fits give the same bits on any number of threads).
_ONE_BLAS_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


class OffloadedChecks:
    """scikit-learn's check suites (40-50 s of CPU, a third of the suite) run by pytest in a
    process of their own, an :class:`EarlySubprocess` started after the suite's other
    processes, on the other core while the suite's process runs the other tests (conftest.py
    puts the checks' items last). Each item then reports what the process found for it: its
    failure's text, its skip's reason."""

    def __init__(self):
        self.process = EarlySubprocess(
            "sklearn_checks",
            _checks_command,
            env=lambda: {**os.environ, CHECKS_IN_PROCESS: "1", **_ONE_BLAS_THREAD},
            timeout=900.0,
        )
        self._outcomes: dict[str, tuple[str, str]] | None = None
        self._lock = threading.Lock()

    def outcomes(self) -> dict[str, tuple[str, str]]:
        """Node id -> (outcome, text) from the process's JUnit report (read once)."""
        with self._lock:
            if self._outcomes is None:
                done = self.process.result()
                report = self.process.scratch / "checks.xml"
                if not report.exists():
                    raise AssertionError(
                        f"scikit-learn's checks' process wrote no report (exit code "
                        f"{done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
                    )
                self._outcomes = {}
                for case in ElementTree.parse(report).iter("testcase"):
                    path = case.get("classname", "").replace(".", "/") + ".py"
                    outcome, text = "passed", ""
                    for child in case:
                        if child.tag in ("failure", "error", "skipped"):
                            outcome = "skipped" if child.tag == "skipped" else "failed"
                            text = child.get("message", "") + "\n" + (child.text or "")
                            break
                    self._outcomes[f"{path}::{case.get('name')}"] = outcome, text
            return self._outcomes

    def replay(self, item) -> None:
        """Pass, fail or skip ``item`` as it did in the process."""
        import pytest

        found = self.outcomes().get(item.nodeid)
        if found is None:
            pytest.fail(f"{item.nodeid} was not run by scikit-learn's checks' process")
        outcome, text = found
        if outcome == "failed":
            pytest.fail(f"(in scikit-learn's checks' process; {CHECKS_IN_PROCESS}=1 runs it "
                        f"here)\n{text}", pytrace=False)  # fmt: skip
        if outcome == "skipped":
            pytest.skip(text.strip().splitlines()[0] if text.strip() else "skipped")


SKLEARN_CHECKS = OffloadedChecks()
