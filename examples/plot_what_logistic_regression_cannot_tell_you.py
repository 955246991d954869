"""
What LogisticRegression cannot tell you
=======================================

scikit-learn's ``LogisticRegression`` returns one coefficient per feature and one
probability per row. On the breast-cancer data a Bayesian fit says, in the same few lines:

1. **how sure each coefficient is** — ``summary()``: mean, sd, a 95 % interval and the
   probability of the sign (left: the forest of intervals; many overlap zero);
2. **how sure each prediction is** — ``predict_proba_interval``: the credible interval of a
   row's probability (middle: the eight test rows nearest the decision boundary; rows
   with about the same point probability can carry very different uncertainty);
3. **which feature set predicts better** — ``loo``: the leave-one-out log predictive
   density with its standard error, free where expectation propagation ran (right: all 30
   features against the ten "mean" ones).
"""

import matplotlib.pyplot as plt
import numpy as np
from sklearn.datasets import load_breast_cancer
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler

import vsbayes

data = load_breast_cancer(as_frame=True)
X = StandardScaler().set_output(transform="pandas").fit_transform(data.data)
y = data.target
X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=40, random_state=0)

bayes = vsbayes.EPLogisticRegression().fit(X_train, y_train)
point = LogisticRegression().fit(X_train, y_train)

# 1. The coefficients, with their uncertainty (a DataFrame: its attrs say what ran).
table = bayes.summary()
print(table.head(8).round(3))
print("method:", table.attrs["method"], "| log evidence:", round(table.attrs["log_evidence"], 2))

# 2. The uncertainty of each prediction, on the test rows nearest the decision boundary.
nearest = np.argsort(np.abs(point.predict_proba(X_test)[:, 1] - 0.5))[:8]
lower, upper = bayes.predict_proba_interval(X_test.iloc[nearest], level=0.9)
middle = bayes.predict_proba(X_test.iloc[nearest])[:, 1]

# 3. Leave-one-out: all features against the ten "mean …" ones.
means = [c for c in X.columns if c.startswith("mean ")]
small = vsbayes.EPLogisticRegression().fit(X_train[means], y_train)
loo_all = bayes.loo(X_train, y_train, random_state=0)
loo_small = small.loo(X_train[means], y_train, random_state=0)
difference = loo_all.pointwise - loo_small.pointwise
se_difference = np.sqrt(len(difference) * difference.var())
print(loo_all)
print(loo_small)
print(f"all − mean features: {difference.sum():.2f} ± {se_difference:.2f}")

fig, axes = plt.subplots(1, 3, figsize=(13, 5.5), width_ratios=[1.3, 1.0, 0.8])
ax = axes[0]
rows = table.iloc[:-1].sort_values("mean")
ax.errorbar(
    rows["mean"],
    np.arange(len(rows)),
    xerr=[rows["mean"] - rows["2.5%"], rows["97.5%"] - rows["mean"]],
    fmt="o",
    ms=3,
    label="EP posterior, 95 %",
)
ax.plot(
    point.coef_[0][[X.columns.get_loc(c) for c in rows.index]],
    np.arange(len(rows)),
    "kx",
    ms=4,
    label="LogisticRegression",
)
ax.axvline(0, color="grey", lw=0.8)
ax.set_yticks(np.arange(len(rows)), rows.index, fontsize=6)
ax.set_title("1. Coefficients", fontsize=10)
ax.legend(fontsize=7)

ax = axes[1]
order = np.argsort(middle)
ax.errorbar(
    np.arange(8),
    middle[order],
    yerr=[middle[order] - lower[order, 1], upper[order, 1] - middle[order]],
    fmt="o",
    label="posterior predictive, 90 % interval",
)
ax.plot(np.arange(8), point.predict_proba(X_test.iloc[nearest])[order, 1], "kx", label="LR")
ax.set_xlabel("test row")
ax.set_ylabel("P(benign)")
ax.set_title("2. Predictions", fontsize=10)
ax.legend(fontsize=7)

ax = axes[2]
ax.errorbar(
    [0, 1], [loo_all.elpd_loo, loo_small.elpd_loo], yerr=[loo_all.se, loo_small.se], fmt="o"
)
ax.set_xticks([0, 1], ["30 features", "10 'mean'"])
ax.set_xlim(-0.5, 1.5)
ax.set_ylabel("elpd_loo ± SE (higher is better)")
ax.set_title(
    f"3. Leave-one-out\ndifference {difference.sum():.1f} ± {se_difference:.1f}", fontsize=10
)
fig.tight_layout()
plt.show()
