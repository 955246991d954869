"""
Every method on a UCI dataset: error against time
=================================================

The breast-cancer data (UCI's Wisconsin diagnostic set, bundled with scikit-learn; 569
rows, 30 features, standardized) with the logistic model. A long variational-sampling fit
(64n points, three rounds) is the reference; each method's error is the excess KL
divergence of its posterior Gaussian to the reference's. VS and IS use N = 2n … 16n
posterior evaluations (n = 528 parameters of a Gaussian in 31 dimensions); Laplace, EP and
VB are single points in time. (BMC is left out: with its default length scale its
interpolant is unreliable in 31 dimensions and it falls back to Laplace.) ``vsbayes
compare`` does the same from the command line.
"""

import time
import warnings

import matplotlib.pyplot as plt
from sklearn.datasets import load_breast_cancer
from sklearn.preprocessing import StandardScaler

import vsbayes

X, y = load_breast_cancer(return_X_y=True)
X = StandardScaler().fit_transform(X)
n = vsbayes.n_family_params(X.shape[1] + 1)

reference = vsbayes.VSLogisticRegression(n_samples=64 * n, rounds=3, random_state=2013)
reference = reference.fit(X, y).posteriors_[0]


def timed(estimator):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. a low effective sample size at 2n
        start = time.perf_counter()
        estimator.fit(X, y)
    return time.perf_counter() - start, vsbayes.excess_kl(reference, estimator.posteriors_[0])


fig, ax = plt.subplots(figsize=(7, 4.5))
for name, cls in [
    ("VS", vsbayes.VSLogisticRegression),
    ("IS", vsbayes.ISLogisticRegression),
]:
    points = [timed(cls(n_samples=k * n, random_state=0)) for k in (2, 4, 8, 16)]
    ax.loglog(*zip(*points, strict=True), "o-", label=name)
for name, estimator, marker in [
    ("Laplace", vsbayes.LaplaceLogisticRegression(), "s"),
    ("EP", vsbayes.EPLogisticRegression(), "^"),
    ("VB", vsbayes.VBLogisticRegression(), "v"),
]:
    ax.loglog(*timed(estimator), marker, color="k", ms=9, ls="none", label=name)
ax.set_xlabel("seconds per fit")
ax.set_ylabel("excess KL to the reference")
ax.grid(True, which="both", alpha=0.3)
ax.legend()
ax.set_title("Breast cancer, logistic regression")
fig.tight_layout()
plt.show()
