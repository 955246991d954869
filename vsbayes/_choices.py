"""The names the estimators and the command line both offer: links, methods, VS strategies.

Standard library only, so that the ``vsbayes`` command builds its parser from them, and
answers ``--help``, ``--version`` and usage errors, before it imports numpy, SciPy and
scikit-learn (over a second). The estimators' registry orders its methods by
:data:`METHODS`; tests/test_registry.py checks that the registry's methods, links and
sampling methods, and VS's strategies, are these.
"""

__all__ = ["LINKS", "METHODS", "SAMPLING_METHODS", "VS_STRATEGIES"]

#: The link functions, each with its estimator classes.
LINKS = ("logistic", "probit")
#: Every method by short name (its estimator classes' ``_method``), in the order the
#: command line lists and compares them.
METHODS = ("vs", "laplace", "is", "bmc", "ep", "vb")
#: The methods that evaluate the posterior at random points: their cost is set by
#: ``n_samples`` and their result by ``random_state``.
SAMPLING_METHODS = ("vs", "is", "bmc")
#: ``strategy`` of the VS estimators: "global", one VS fit of the whole posterior;
#: "sites", expectation propagation whose site fits are VS fits; "auto", chosen per problem.
VS_STRATEGIES = ("auto", "global", "sites")
