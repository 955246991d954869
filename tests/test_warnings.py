"""Every warning vsbayes raises during fit points at the caller's line."""

import re
import warnings
from pathlib import Path

import pytest
from sklearn.datasets import make_blobs

import vsbayes
from vsbayes._warnings import each_once, warn
from vsbayes.exceptions import ConvergenceWarning, UnreliableFitWarning


@pytest.fixture(scope="module")
def data():
    X, y = make_blobs(n_samples=60, centers=2, cluster_std=3.0, random_state=0)
    return X, y


CASES = {
    "Newton's max_iter": (vsbayes.LaplaceLogisticRegression(max_iter=1), ConvergenceWarning),
    "EP's max_iter": (vsbayes.EPLogisticRegression(max_iter=2), ConvergenceWarning),
    "VB's max_iter": (vsbayes.VBLogisticRegression(max_iter=1), ConvergenceWarning),
    # The probit link: the same stall as the logistic's, in closed-form sweeps (8x cheaper).
    "EP stalls: Laplace fallback": (
        vsbayes.EPProbitRegression(class_weight={0: 1e3, 1: 1e-4}),
        UnreliableFitWarning,
    ),
    "VS below 2n points": (
        vsbayes.VSLogisticRegression(n_samples=12, strategy="global", random_state=0),
        UnreliableFitWarning,
    ),
    "VS solver's max_iter": (
        vsbayes.VSLogisticRegression(
            max_iter=1, strategy="global", kernel="laplace", random_state=0
        ),
        ConvergenceWarning,
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_fit_warnings_point_at_the_calling_line(data, case):
    estimator, category = CASES[case]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        estimator.fit(*data)  # the line every warning must point at
    ours = [w for w in caught if issubclass(w.category, (ConvergenceWarning, UnreliableFitWarning))]
    assert any(issubclass(w.category, category) for w in ours), [str(w.message) for w in caught]
    for w in ours:
        assert (w.filename, w.lineno) == (__file__, _fit_line()), (w.category, w.filename)


def _fit_line() -> int:
    source = Path(__file__).read_text().splitlines()
    return 1 + next(i for i, line in enumerate(source) if "the line every warning must" in line)


def test_a_warning_through_a_third_party_callback_points_at_the_users_line(tmp_path, monkeypatch):
    """vsbayes → a third-party caller (SciPy's minimize_scalar in EmpiricalBayesClassifier)
    → vsbayes → warn: the warning points at the user's line, not the third party's."""
    import importlib.util

    from vsbayes import _warnings

    sources = {
        # stands for vsbayes: an entry point that hands its objective to a third party
        "fake_vsbayes": (
            "from vsbayes._warnings import warn\n"
            "import fake_third_party\n"
            "def objective():\n"
            "    warn('the inner fit is unreliable', UserWarning)\n"
            "def fit():\n"
            "    return fake_third_party.minimize(objective)\n"
        ),
        "fake_third_party": "def minimize(f):\n    return f()\n",
    }
    for name, source in sources.items():
        (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    package = str(tmp_path / "fake_vsbayes.py")
    monkeypatch.setattr(_warnings, "_in_package", lambda filename: filename == package)
    spec = importlib.util.spec_from_file_location("fake_vsbayes", package)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module.fit()  # the user's line
    (w,) = caught
    assert (w.filename, w.lineno) == (__file__, _line_of("module.fit()  # the user's line"))


def _line_of(text: str) -> int:
    source = Path(__file__).read_text().splitlines()
    return 1 + next(i for i, line in enumerate(source) if text in line)


@pytest.mark.parametrize(
    "estimator",
    [
        vsbayes.LaplaceLogisticRegression(penalty="l2", l1_ratio=0.5),
        vsbayes.EPLogisticRegression(penalty="l1"),
    ],
    ids=["l2 with l1_ratio (PSIS)", "l1 with l1_ratio=0 (EP)"],
)
def test_posterior_reads_do_not_repeat_the_fits_parameter_warnings(data, estimator):
    """fit warns about penalty/l1_ratio once, as LogisticRegression does; loo() and the
    ArviZ export read the fit's prior and stay silent (they repeated it on each call)."""
    X, y = data
    with pytest.warns(UserWarning, match="penalty"):
        estimator.fit(X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        estimator.loo(X, y)
        estimator.to_inference_data(X, y, n_draws=20)


def test_a_sibling_directory_named_like_the_package_is_the_users(data):
    """A user's file in "vsbayes_study/" beside the package is not the package's: the
    warning points at its line (the bare path prefix counted it as vsbayes's, and the
    warning went to the line that called it)."""
    from vsbayes import _warnings

    X, y = data
    user_file = _warnings._PACKAGE + "_study/run.py"
    namespace: dict = {}
    exec(
        compile("def run(estimator, X, y):\n    estimator.fit(X, y)\n", user_file, "exec"),
        namespace,
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        namespace["run"](vsbayes.LaplaceLogisticRegression(penalty="l2", l1_ratio=0.5), X, y)
    assert caught and {(w.filename, w.lineno) for w in caught} == {(user_file, 2)}


@pytest.mark.parametrize(
    "estimator, forced",
    [
        (vsbayes.VBLogisticRegression(), {"covariance": "diagonal"}),
        (vsbayes.LaplaceLogisticRegression(penalty="l2", l1_ratio=0.5), {}),
    ],
    ids=["forced covariance", "inconsistent l1_ratio"],
)
def test_evidence_search_shows_each_inner_warning_once(data, estimator, forced):
    """The grid's fits warn alike at every C; the search shows each warning once (the
    "default" filter cannot: each inner fit's catch_warnings resets what it has shown)."""
    X, y = data
    with warnings.catch_warnings(record=True) as caught, vsbayes.config_context(**forced):
        warnings.simplefilter("default")
        vsbayes.EmpiricalBayesClassifier(estimator).fit(X, y)
    shown = [(w.category, str(w.message)) for w in caught]
    assert shown and len(shown) == len(set(shown))
    assert {w.filename for w in caught} == {__file__}


def test_one_vs_rest_problems_share_their_warnings_once():
    """Each class's binary problem warns alike under a forced structure: one fit, one
    warning (it was shown once per class)."""
    X, y = make_blobs(n_samples=60, centers=3, cluster_std=3.0, random_state=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        with vsbayes.config_context(covariance="diagonal"):
            vsbayes.VBLogisticRegression().fit(X, y)
    shown = [(w.category, str(w.message)) for w in caught]
    assert len(shown) == 1 and "diagonal covariance" in str(caught[0].message)
    assert caught[0].filename == __file__


def test_one_vs_rest_problems_alike_but_for_their_figures_warn_once_naming_them():
    """Each class's Newton stops at max_iter=1 with its own predicted gain: the texts
    differ in their numbers only, and each was shown, K warnings that did not say which
    class each was about (D-248). One now, naming the classes alike."""
    X, y = make_blobs(n_samples=60, centers=3, cluster_std=3.0, random_state=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        vsbayes.LaplaceProbitRegression(max_iter=1).fit(X, y)
    assert [w.category for w in caught] == [ConvergenceWarning]
    text = str(caught[0].message)
    assert "max_iter=1" in text and text.endswith(
        "(Class 0's problem of the one-vs-rest fit; those of classes 1, 2 warned alike, "
        "with other figures.)"
    )
    assert caught[0].filename == __file__
    # And a batch of a one-vs-rest stream, whose problems partial_fit fits itself.
    stream = vsbayes.LaplaceProbitRegression(max_iter=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        stream.partial_fit(X, y, classes=[0, 1, 2])
    assert [w.category for w in caught] == [ConvergenceWarning]
    assert "warned alike" in str(caught[0].message)


def test_a_module_filter_applies_to_the_warnings_shown_once():
    """Re-emitted warnings match a user's filter by their module, as the first emission
    did (they were matched against the file's path, so a module filter missed them)."""
    X, y = make_blobs(n_samples=60, centers=3, cluster_std=3.0, random_state=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", module=re.escape(__name__) + r"\Z")
        with vsbayes.config_context(covariance="diagonal"):
            vsbayes.VBLogisticRegression().fit(X, y)
    assert not caught
    with warnings.catch_warnings(record=True) as caught:  # (and the fit does warn)
        warnings.simplefilter("always")
        with vsbayes.config_context(covariance="diagonal"):
            vsbayes.VBLogisticRegression().fit(X, y)
    assert caught


@pytest.mark.parametrize("filename", ["<string>", "<stdin>", "/tmp/ipykernel_0/cell.py"])
def test_warnings_reach_code_that_no_module_holds(filename):
    """A fit run from ``python -c``, the REPL or a notebook's cell (a file no imported
    module has): its re-emitted warnings are shown. ``warn_explicit`` drops a warning whose
    module is None, which the re-emission passed for such files: all were lost."""
    X, y = make_blobs(n_samples=60, centers=2, cluster_std=3.0, random_state=0)
    source = "vsbayes.LaplaceLogisticRegression(max_iter=1).fit(X, y)"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exec(compile(source, filename, "exec"), {"vsbayes": vsbayes, "X": X, "y": y})
    assert [w.category for w in caught] == [ConvergenceWarning]
    assert caught[0].filename == filename


@pytest.mark.parametrize("filename", ["<string>", "<stdin>", "/tmp/ipykernel_0/cell.py"])
def test_a_module_filter_meets_code_that_no_module_holds_by_its_name(filename):
    """Such code runs as ``__main__`` (a cell, ``python -c``): ``warnings.warn`` gives the
    fit's own warnings that module, and the re-emitted ones must match the same filter
    (by the path less ".py", ``filterwarnings(module="__main__")`` let them through)."""
    X, y = make_blobs(n_samples=60, centers=2, cluster_std=3.0, random_state=0)
    source = "vsbayes.LaplaceLogisticRegression(max_iter=1).fit(X, y)"
    scope = {"__name__": "__main__", "vsbayes": vsbayes, "X": X, "y": y}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exec(compile(source, filename, "exec"), dict(scope))
    assert [w.category for w in caught] == [ConvergenceWarning]  # (the fit does warn)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", module="__main__")
        exec(compile(source, filename, "exec"), dict(scope))
    assert caught == []


class _WarnsItsScale(vsbayes.LaplaceLogisticRegression):
    """A Laplace fit that warns with its prior's scale: each C a search tries warns its own
    text, as VS's predicted error does."""

    def fit(self, X, y, sample_weight=None):
        message = f"fitted at C={self.C:.6g}, prior={self.prior!r}"
        warnings.warn(message, UserWarning, stacklevel=1)  # (this file's line)
        return super().fit(X, y, sample_weight)


@pytest.mark.parametrize("prior", [None, vsbayes.LaplacePrior()], ids=["C", "prior's scale"])
def test_evidence_search_shows_the_kept_fits_warnings_only(data, prior):
    """The search's fits at the C values it drops are exploratory: their warnings are not
    shown, the kept fit's are (each C's, distinct in its numbers, all came through)."""
    X, y = data
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        search = vsbayes.EmpiricalBayesClassifier(_WarnsItsScale(prior=prior)).fit(X, y)
    assert len(search.refined_Cs_) > 1  # several fits of the estimator, at other scales
    kept = search.estimator_
    assert [str(w.message) for w in caught] == [f"fitted at C={kept.C:.6g}, prior={kept.prior!r}"]
    assert caught[0].filename == __file__


def test_a_warning_before_long_work_is_shown_before_the_fit_ends():
    # A fit's warnings are held to its end (each_once); one that says the work ahead is
    # long is worth nothing there, so it passes the block at once, through the user's
    # filters, and is not shown again at the end.
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with each_once():
            warn("held to the end", UserWarning)
            warn("shown at once", UserWarning, now=True)
            during = [str(w.message) for w in seen]
        after = [str(w.message) for w in seen]
        warnings.simplefilter("ignore")
        with each_once():
            warn("ignored by the user", UserWarning, now=True)
        ignored = len(seen) - len(after)
    assert during == ["shown at once"]
    assert after == ["shown at once", "held to the end"]
    assert ignored == 0
