"""The registry of the estimators: each method, its traits and its class per link.

It is derived from the classes ``vsbayes.estimators`` exports (each declares ``_method``,
``_title`` and ``_link``), so that the package's namespace, the command line, the tests and
the benchmarks read one list: an estimator exported there is offered by ``vsbayes fit
--method`` and run through scikit-learn's checks.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .._choices import LINKS, METHODS
from ._base import BayesianGLMClassifier
from ._sampling import SamplingMethod

__all__ = ["LINKS", "Method", "methods_of"]


@dataclass(frozen=True)
class Method:
    """One inference method and its estimator classes.

    Attributes
    ----------
    key : str
        Short name (``vsbayes fit --method``).
    title : str
        Long name.
    sampling : bool
        Whether the method evaluates the posterior at random points: its cost is set by
        ``n_samples`` and its result by ``random_state``.
    classes : mapping of str to class
        The estimator class per link (``"logistic"``, ``"probit"``).
    """

    key: str
    title: str
    sampling: bool
    classes: Mapping[str, type[BayesianGLMClassifier]]

    def estimator_class(self, link: str) -> type[BayesianGLMClassifier]:
        """The class of this method with ``link``.

        Raises
        ------
        ValueError
            For an unknown link, or one this method does not have (VB is logistic only).
        """
        if link not in LINKS:
            raise ValueError(f"unknown link {link!r}; choose from {', '.join(LINKS)}.")
        if link not in self.classes:
            raise ValueError(
                f"{self.title} has no {link} estimator (links: {', '.join(self.classes)}); "
                f"use another link or method."
            )
        return self.classes[link]


def methods_of(classes: Iterable[type]) -> dict[str, Method]:
    """The methods of the estimator classes among ``classes``."""
    methods: dict[str, Method] = {}
    for cls in classes:
        if not (isinstance(cls, type) and issubclass(cls, BayesianGLMClassifier) and cls._method):
            continue
        known = methods.get(cls._method)
        sampling = issubclass(cls._posterior_method, SamplingMethod)
        links = {**(known.classes if known else {}), cls._link: cls}
        methods[cls._method] = Method(cls._method, cls._title, sampling, links)
    # In the order the command line lists and compares them (others follow).
    rank = {key: i for i, key in enumerate(METHODS)}
    return dict(sorted(methods.items(), key=lambda item: rank.get(item[0], len(rank))))
