"""Parameter and attribute sections shared by the estimators' numpy-style docstrings."""

import re
from textwrap import dedent, fill

COMMON_PARAMETERS = dedent("""\
    C : float, default=1.0
        Prior variance of each coefficient: the prior is N(0, C·I), so the posterior mode
        equals the solution of scikit-learn's ``LogisticRegression(C=C)`` (logistic link).
        Smaller values mean stronger regularization.
    fit_intercept : bool, default=True
        Whether to fit an intercept ``b``; its prior is N(0, 10⁶) (vague but proper, so the
        evidence is finite).
    class_weight : dict, "balanced" or None, default=None
        Weights of the classes, multiplied into ``sample_weight`` (likelihood exponents).
    max_iter : int, default=100
        Maximum iterations of Newton's method for the mode{max_iter_extra}.
    tol : float, default=1e-8
        Newton's method for the mode stops when half the squared Newton decrement (the gain
        in log-posterior one more step would bring) is at most ``tol``.{tol_extra}
    random_state : int, RandomState instance, Generator or None, default=None
        {random_state}
    verbose : int, default=0
        Print a summary of each fit when ≥ 1, and Newton's iterations when ≥ 2.
""")


def continued(text: str) -> str:
    """``text`` as a further paragraph line of a parameter entry of ``COMMON_PARAMETERS``:
    a leading newline, then the text indented and filled, never breaking a ``literal``."""
    protected = re.sub(r"``[^`]*``", lambda m: m.group().replace(" ", "\0"), text)
    filled = fill(
        protected, width=88, initial_indent="    ", subsequent_indent="    ",
        break_on_hyphens=False,
    )  # fmt: skip
    return "\n" + filled.replace("\0", " ")


def ep_tol_note(what: str, more: str = "") -> str:
    """``tol_extra`` of an estimator that runs expectation propagation (for ``what``) with
    its ``tol`` through ``ep_posterior`` (``_base.py``), but not its ``max_iter``."""
    return continued(
        f"Expectation propagation ({what}) stops when no site parameter moves by more than "
        f"``tol / 100`` (relative) in a sweep, within 200 sweeps (``max_iter`` does not "
        f"bound them).{more}"
    )


#: ``tol_extra`` of the variational-sampling estimators: what bounds their solver.
VS_TOL_NOTE = ep_tol_note(
    "the sampling kernel, and the posterior of the site fits",
    " ``tol`` does not govern the variational-sampling solver, whose tolerance is fixed: "
    "it stops once its optimization error (half the squared Newton decrement per unit "
    "mass) is below 1e-2 times its predicted sampling error ``kl_error`` (0.1 times in "
    "the intermediate rounds, whose fits only serve as kernels), as with "
    ":func:`vsbayes.variational_sampling`'s default ``tol=1e-2``, or after ``max_iter`` "
    "iterations.",
)

_SAMPLING_PARAMETERS = {
    "n_samples": """\
    n_samples : "auto" or int, default="auto"
        Number of posterior evaluations N in total. ``"auto"`` uses ``max(8n, 256)`` with
        n the number of parameters of a {family_note}Gaussian over the p coefficients (and
        intercept): ``(p+1)(p+2)/2``. With the same ``n_samples`` and ``random_state`` and
        one round, all sampling estimators evaluate the posterior at exactly the same
        points, so comparisons between them are paired.{limits_note}
""",
    "kernel": """\
    kernel : {"ep", "laplace"}, default="ep"
        The Gaussian the points are drawn through (the first round's, with ``rounds``):
        the expectation-propagation posterior (nearly exact for binary regression, Chopin
        and Ridgway 2017, so the importance weights are benign) or the Laplace
        approximation. If EP fails or does not converge, the Laplace one is used. For the
        multinomial posterior (more than two classes, logistic link), the multinomial EP
        (:func:`vsbayes.approximations.softmax_ep`).
""",
    "strategy": """\
    strategy : {"auto", "global", "sites"}, default="auto"
        ``"global"``: one variational-sampling fit of the whole posterior (n parameters,
        N points in the p-dimensional space), which corrects EP's residual bias when N is
        large enough. ``"sites"``: expectation propagation whose site fits are
        variational-sampling fits of the one-dimensional tilted densities (cost O(M p²)
        per sweep; the probit sites have a closed form that those fits reproduce to
        1e-7), for any p. ``"auto"`` runs the global fit from the EP kernel only if
        it can have at least 16n points (up to 32n when ``n_samples="auto"``) within
        2·10⁸ multiply-adds of likelihood pass and 8 times EP's own work (a deterministic
        count, so the choice is the same on every machine), and keeps it only if it is
        reliable (no warning) and departs from EP by more than 4 times its own predicted
        error ``kl_error``; otherwise EP's posterior is the more accurate one (at 8n the
        global fit is measured less accurate than EP on the paper's data sets).
        With many rows per parameter (M ≥ 50n: a nearly Gaussian posterior) where the
        global fit at ``n_samples`` costs less than EP's expected work, ``"auto"`` first
        runs that fit from the Laplace kernel and keeps it if reliable.
        ``strategy_`` and ``strategy_reason_`` record the choice. Beyond two classes
        (logistic link: the multinomial posterior), ``"sites"`` is expectation
        propagation whose sites are variational-sampling fits of the (K − 1)-dimensional
        tilted densities (:func:`vsbayes.approximations.softmax_ep`), and ``"auto"`` runs
        the global fit (from that EP's kernel) with 16n to 32n points within 5·10¹⁰
        multiply-adds, else takes those sites (``strategy_`` "sites").
""",
    "family": """\
    family : {"gaussian", "diagonal"}, default="gaussian"
        Full or diagonal posterior covariance ("diagonal": n = 2p+1 for "auto").
""",
    "rule": """\
    rule : {"mc", "qmc"}, default="mc"
        iid Monte Carlo or scrambled Sobol points.
""",
    "rounds": """\
    rounds : int, default={rounds}
        Rounds of kernel adaptation: round 1 draws from ``kernel``, round
        r+1 from the fit of round r with its covariance scaled by ``kernel_scale``, and the
        final fit pools all points.
    kernel_scale : float, default=1.5
        Covariance inflation of the adapted kernels.{defaults_note}
""",
    "target_kl": """\
    target_kl : float, "auto" or None, default="auto"
        Ask for an accuracy instead of a sample size: the global variational-sampling fit
        adds pooled rounds after its ``n_samples`` points until its predicted error
        ``kl_error`` (excess KL, nats), times its 90 % quantile factor, is at most
        ``target_kl``, up to 64 times ``n_samples`` points, or as many as fit in memory (see
        :func:`vsbayes.variational_sampling`; ``stop_reason_`` says why it stopped). Only
        the global fit samples: EP's site fits are unaffected. ``"auto"``: 0.01 nats for
        the global fits ``strategy="auto"`` takes by itself — data-rich problems (see
        ``strategy_reason_``) and dask input — and no target (``n_samples`` points) for
        the others: ``strategy="global"``, and the global fit "auto" compares with EP's,
        whose N its work limit sets. ``None``: never a target.
    time_budget : float, default=None
        Seconds for the whole ``fit``: the global fit adds rounds, as for ``target_kl``
        (without it, each doubling the points, up to as many as fit in memory, the last
        one filling the budget), only while one is predicted to end within what is left
        of it; each draws its points in chunks and stops where its fit is predicted to
        end nearest the budget.
""",
    "length_scale": """\
    length_scale : float, default=1.0
        Correlation length of the Gaussian-process prior on the likelihood ratio, in units
        of the kernel's standard deviations (see :func:`vsbayes.bayesian_monte_carlo`).
""",
    "n_jobs": """\
    n_jobs : int or None, default=None
        Parallel workers (joblib) evaluating the likelihood in chunks; ``None`` means 1
        unless in a :func:`joblib.parallel_config` context, so a Dask or Ray backend
        spreads the evaluations over a cluster. Results do not depend on it.
""",
}

# Indented as the continuation of the kernel_scale entry.
VS_DEFAULTS_NOTE = """

        The defaults of ``n_samples``, ``rounds`` and ``kernel_scale`` were chosen on
        ``benchmarks/estimator_defaults.py`` (breast cancer and a synthetic problem, both
        links): two rounds halve the error of one round in the same time; a third round
        gains no consistent accuracy per second; N = 32n is up to 1.7× more accurate per
        second than 8n but 2–4× slower per fit."""


def fallback_note(failures: str) -> str:
    """The Notes paragraph on the Laplace fallback, naming the method's ``failures``."""
    return (
        fill(
            f"If the method cannot return a valid Gaussian ({failures}), the Laplace "
            f"approximation is used for that problem, with an "
            f":class:`~vsbayes.exceptions.UnreliableFitWarning`; ``laplace_fallback_`` "
            f"records it.",
            width=88,
        )
        + "\n"
    )


def sampling_parameters(
    *names: str,
    rounds: int = 2,
    family_note: str = "",
    defaults_note: str = "",
    limits_note: str = "",
) -> str:
    """The numpy-doc entries of the named sampling parameters, in the given order."""
    text = "".join(_SAMPLING_PARAMETERS[name] for name in names)
    for key, value in [
        ("{rounds}", str(rounds)),
        ("{family_note}", family_note),
        ("{defaults_note}", defaults_note),
        ("{limits_note}", limits_note),
    ]:
        text = text.replace(key, value)
    return dedent(text)


ATTRIBUTES = (
    dedent("""\
    classes_ : ndarray of shape (n_classes,)
        Class labels.
    coef_ : ndarray of shape (1, n_features) or (n_classes, n_features)
        Posterior mean of the coefficients (beyond two classes, one row per class of the
        multinomial model, or per one-vs-rest problem).
    intercept_ : ndarray of shape (1,) or (n_classes,)
        Posterior mean of the intercept (zeros when ``fit_intercept=False``).
    sigma_ : ndarray of shape (p, p), (n_classes·p, n_classes·p) or (n_classes, p, p)
        Posterior covariance of the parameter vector ``[coef..., intercept]`` (p its
        length); of the multinomial model, of ``[coef_.ravel(), intercept_]`` (the rows of
        ``coef_`` one after the other, then the intercepts); one-vs-rest, one per class.
    log_marginal_likelihood_value_ : float or ndarray of shape (n_classes,)
        Estimated log evidence ``log ∫ Π_i F(y_i f_i)^{{s_i}} N(w; prior) dw`` (the
        multinomial model's: one float; one-vs-rest: one per class).
    n_iter_ : ndarray of shape (1,) or (n_classes,)
        {n_iter}
    posteriors_ : list of Gaussian
        The posterior of each binary problem, or the multinomial model's one joint
        posterior, with the method's diagnostics ({diagnostics}).
    n_features_in_ : int
        Number of features seen during fit.
    feature_names_in_ : ndarray of shape (`n_features_in_`,)
        Feature names, when X has string column names.
""")
    + "{extra}"
)

FALLBACK_ATTRIBUTE = dedent("""\
    laplace_fallback_ : ndarray of bool, shape (1,) or (n_classes,)
        True where the method failed and the Laplace approximation is used instead.
""")

_TEMPLATE = """{summary}

{description}

Parameters
----------
{params}
Attributes
----------
{attributes}
See Also
--------
{see_also}
{notes}
Examples
--------
>>> from sklearn.datasets import load_breast_cancer
>>> from sklearn.pipeline import make_pipeline
>>> from sklearn.preprocessing import StandardScaler
>>> from vsbayes import {name}
>>> X, y = load_breast_cancer(return_X_y=True)
{example_prep}>>> model = make_pipeline(StandardScaler(), {name}({example_args})).fit(X, y)
>>> model.predict_proba(X[:2]).shape
(2, 2)
"""


def estimator_docstring(*, notes: str = "", example_prep: str = "", **fields: str) -> str:
    """Fill the estimators' docstring template: summary, description, params, attributes,
    see_also, name, example_args, and optionally notes (a Notes section) and example_prep
    (doctest lines run before the fit)."""
    notes = f"\nNotes\n-----\n{notes}" if notes else ""
    return _TEMPLATE.format(notes=notes, example_prep=example_prep, **fields)
