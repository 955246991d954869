"""
Selecting features by the evidence: automatic relevance determination
=====================================================================

200 features, 10 of them relevant, 500 rows. ``EmpiricalBayesClassifier(scales="ard")``
gives each feature its own prior variance and chooses them all by the evidence (type-II
maximum likelihood, as ``ARDRegression`` does for linear regression); a feature whose
posterior probability of being in the model (``relevance_``) falls below ½ is pruned, and
the estimator is fitted on the features kept, under the chosen variances.

The L1-penalized ``LogisticRegression`` with ``C`` by cross-validation, the usual
alternative, keeps dozens of irrelevant features: the held-out log loss that picks its
``C`` favours weak shrinkage over a sparse support. The left panel shows each feature's
relevance; the right one the posterior means and 95 % intervals of the kept features next
to the true coefficients. ``summary()`` marks the pruned rows.
"""

import matplotlib.pyplot as plt
import numpy as np
from sklearn.linear_model import LogisticRegressionCV
from sklearn.metrics import f1_score, log_loss

import vsbayes

rng = np.random.default_rng(0)
n_train, n_test, d = 500, 5000, 200
X = rng.standard_normal((n_train + n_test, d))
true_coef = np.zeros(d)
relevant = rng.choice(d, 10, replace=False)
true_coef[relevant] = rng.choice([-1.0, 1.0], 10) * rng.uniform(0.5, 2.0, 10)
y = (X @ true_coef + rng.logistic(size=n_train + n_test) > 0).astype(int)
X_train, y_train, X_test, y_test = X[:n_train], y[:n_train], X[n_train:], y[n_train:]

ard = vsbayes.EmpiricalBayesClassifier(vsbayes.EPLogisticRegression(), scales="ard")
ard.fit(X_train, y_train)
lasso = LogisticRegressionCV(
    Cs=np.logspace(-3, 2, 12),
    l1_ratios=(1.0,),
    solver="liblinear",
    scoring="neg_log_loss",
    use_legacy_attributes=False,
).fit(X_train, y_train)

truth = true_coef != 0
for name, support, model in (
    ("ARD by the evidence", ard.get_support(), ard),
    ("L1, C by 5-fold CV", lasso.coef_[0] != 0, lasso),
):
    print(
        f"{name}: {support.sum()} features kept, F1 of the true ones "
        f"{f1_score(truth, support):.2f}, held-out log loss "
        f"{log_loss(y_test, model.predict_proba(X_test)):.3f}"
    )

table = ard.summary()
print(table[table["selected"]].drop(columns=["P(sign)"]).round(3))
print(f"pruned: {len(table.attrs['pruned'])} features")

fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
left.stem(np.arange(d), ard.relevance_, markerfmt=".", basefmt=" ")
left.plot(relevant, np.ones(10) * 1.04, "v", color="C3", label="relevant (truth)")
left.axhline(0.5, color="grey", lw=0.8, ls="--")
left.set_xlabel("feature")
left.set_ylabel("posterior inclusion probability (relevance_)")
left.legend(loc="center right", fontsize=8)
kept = ard.get_support(indices=True)
mean = table["mean"].to_numpy()[kept]
low, high = table["2.5%"].to_numpy()[kept], table["97.5%"].to_numpy()[kept]
x = np.arange(kept.size)
right.errorbar(x, mean, yerr=[mean - low, high - mean], fmt="o", label="ARD posterior (95 %)")
right.plot(x, true_coef[kept], "x", color="C3", label="true coefficient")
right.plot(x, lasso.coef_[0][kept], "+", color="C2", label="L1 (CV)")
right.set_xticks(x)
right.set_xticklabels([f"x{j}" for j in kept], rotation=60, fontsize=8)
right.set_ylabel("coefficient")
right.legend(fontsize=8)
fig.tight_layout()
plt.show()
