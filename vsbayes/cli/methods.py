"""The methods of the command line: which estimator each name and link means, and a timed fit."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

import numpy as np

from .._choices import METHODS, SAMPLING_METHODS
from .._warnings import catch
from ..estimators import LINKS, BayesianGLMClassifier, estimator_class
from ..estimators import METHODS as _REGISTRY
from ..estimators._base import CHOOSE_C
from ..exceptions import EstimationError, TooFewSamplesError

__all__ = [
    "DETERMINISTIC",
    "METHOD_TITLES",
    "SAMPLING",
    "TimedFit",
    "in_options",
    "make_estimator",
    "timed_fit",
]

# The names the parser offers (vsbayes._choices; tests/test_registry.py checks them against
# the estimators' registry, vsbayes.estimators.METHODS).
#: Methods whose cost is set by ``n_samples`` (posterior evaluations at random points).
SAMPLING = SAMPLING_METHODS
#: Methods without randomness or a sample size.
DETERMINISTIC = tuple(key for key in METHODS if key not in SAMPLING)
METHOD_TITLES = {key: method.title for key, method in _REGISTRY.items()}


def make_estimator(
    method: str,
    link: str,
    *,
    C: float = 1.0,
    n_samples: int | str = "auto",
    seed: int = 0,
    **options,
) -> BayesianGLMClassifier:
    """An unfitted estimator; ``n_samples`` only reaches the sampling methods.

    Parameters
    ----------
    method, link : str
        See :func:`estimator_class`.
    C : float, default=1.0
        Prior variance of the coefficients.
    n_samples : int or "auto", default="auto"
        Posterior evaluations of the sampling methods; ignored by the others.
    seed : int, default=0
        ``random_state`` of the estimator.
    **options
        Further estimator parameters (e.g. ``rounds`` for VS).

    Returns
    -------
    BayesianGLMClassifier
    """
    params = {"C": C, "random_state": seed, **options}
    if method in SAMPLING:
        params["n_samples"] = n_samples
    return estimator_class(method, link)(**params)


@dataclass
class TimedFit:
    """A fitted estimator, the wall time of its ``fit`` and the warnings it raised."""

    estimator: BayesianGLMClassifier
    seconds: float
    warnings: list[str] = field(default_factory=list)

    @property
    def fell_back(self) -> list[bool]:
        """Per problem, whether the method fell back to the Laplace approximation."""
        fallback = getattr(self.estimator, "laplace_fallback_", None)
        n_problems = len(self.estimator.posteriors_)
        return [False] * n_problems if fallback is None else [bool(f) for f in fallback]


def timed_fit(
    estimator: BayesianGLMClassifier, X: np.ndarray, y: np.ndarray, command: str = "fit"
) -> TimedFit:
    """Fit ``estimator``, timing the call and collecting its warnings as one-line texts in
    the terms of ``vsbayes {command}`` (:func:`in_options`), as its errors.

    Warnings are recorded rather than shown so that the command line can print each once,
    as a single line, whatever the process's warning filters (e.g. pytest's). ``compare``
    shows each under its row's method and N: the estimator's name that begins a warning is
    dropped there. An error whose text names the library's terms is raised as a ValueError
    in the command's.
    """
    with catch(("always", Warning), record=True) as caught:
        start = time.perf_counter()
        try:
            estimator.fit(X, y)
        except TooFewSamplesError:
            raise  # (vsbayes fit says what to do in its own words)
        except (ValueError, EstimationError) as error:
            # The library's remedies name its parameters: said as the command's options
            # (main prints either kind as one line, exit status 1).
            text = in_options(str(error), command)
            if text == str(error):
                raise
            raise ValueError(text) from None
        seconds = time.perf_counter() - start
    own = f"{type(estimator).__name__}: "
    messages: list[str] = []
    for warning in caught:
        message = " ".join(str(warning.message).split())
        if command == "compare" and message.startswith(own):
            message = message[len(own) :]
        text = f"{warning.category.__name__}: {in_options(message, command)}"
        if text not in messages:
            messages.append(text)
    return TimedFit(estimator, seconds, messages)


#: The estimators' parameters that ``vsbayes fit`` sets by an option, as their warnings'
#: and errors' remedies name them ("Use n_samples >= 30", "a larger target_kl",
#: "strategy='global'").
_OPTIONS = {"n_samples": "--n-samples", "target_kl": "--target-kl", "time_budget": "--budget"}


def _method_options() -> dict[str, str]:
    """Each estimator class the commands fit, by the options that choose it ("Use
    VSLogisticRegression or EPLogisticRegression" says ``--method vs``, ``--method ep``)."""
    names = {}
    for method in METHOD_TITLES:
        for link in LINKS:
            try:
                cls = estimator_class(method, link)
            except ValueError:  # no such link for the method (VB is logistic only)
                continue
            probit = "" if link == "logistic" else f" --link {link}"
            names[cls.__name__] = f"--method {method}{probit}"
    return names


_METHOD_OPTIONS = _method_options()
_PARAMETER = re.compile(
    rf"\b({'|'.join(_OPTIONS)})\b|\bstrategy='(\w+)'|\b({'|'.join(_METHOD_OPTIONS)})\b"
)


def _shared_phrases(fallback: str, evidence: str) -> list[tuple[str, str]]:
    """Both commands' phrases: where the fallback shows, the evidence's remedy, and C."""
    return [
        (r"\blaplace_fallback_\b", fallback),
        (
            re.escape(CHOOSE_C),
            f"the log evidence {evidence} compares fits at several values of --C",
        ),
        (r"\b(a smaller|a larger|a finite) C( or (a )?narrower prior)?\b", r"\1 --C"),
    ]


# The library's other names that the commands set or show otherwise, each with what the
# command offers in its place, per command. (A prior narrower than N(0, C I) is a smaller
# --C: the commands' only prior.)
_PHRASES = {
    "fit": [
        *_shared_phrases('the summary\'s "ran as" line', "this command prints"),
        (r"\bmore (points|samples) \((\d+n = \d+ is typical)", r"more \1 (--n-samples; \2"),
    ],
    "compare": [
        *_shared_phrases("the table's note", "vsbayes fit prints"),
        # compare's ladder sets each sampling fit's N: it doubles N while the next fit is
        # predicted within --budget.
        (r"\bmore (points|samples) \(n_samples\b", r"more \1 (a larger --budget"),
        (r"\bmore (points|samples) \((\d+n = \d+ is typical)", r"more \1 (a larger --budget; \2"),
        (r"\bfewer (points|samples) \(n_samples\b", r"fewer \1 (a smaller --budget"),
        (r"\bn_samples\b", "N (compare's ladder, within --budget)"),
    ],
}


def in_options(text: str, command: str = "fit") -> str:
    """A warning's or error's text with the parameters, attributes and classes of the
    library it names said as what ``vsbayes {command}`` offers: its options, its output,
    and the estimator classes by the ``--method`` that fits them (for ``compare``, which
    fits every method, as ``vsbayes fit``'s)."""
    for pattern, replacement in _PHRASES[command]:
        text = re.sub(pattern, replacement, text)
    prefix = "" if command == "fit" else "vsbayes fit "

    def option(match: re.Match) -> str:
        if match.group(1):
            return prefix + _OPTIONS[match.group(1)]
        if match.group(2):
            return f"{prefix}--strategy {match.group(2)}"
        return prefix + _METHOD_OPTIONS[match.group(3)]

    return _PARAMETER.sub(option, text)
