"""
Predictive uncertainty: a band of posterior curves
==================================================

scikit-learn's ``LogisticRegression`` gives one curve P(y = 1 | x). With sixteen
observations the Bayesian fit is a posterior over curves: the band holds 90 % of the
curves drawn from the VS posterior (``sample_coef``); it is widest around the decision
boundary, where the uncertain slope and intercept matter most. The solid line is the
posterior predictive probability (``predict_proba``), the average of the curves: flatter
than the point estimate, it says "less sure" where the data are thin.
"""

import matplotlib.pyplot as plt
import numpy as np
from sklearn.linear_model import LogisticRegression

import vsbayes

rng = np.random.default_rng(1)
x = np.concatenate([rng.normal(-1.0, 0.7, 8), rng.normal(1.0, 0.7, 8)])
y = (rng.random(16) < 1 / (1 + np.exp(-2.0 * x))).astype(int)
X = x[:, None]

bayes = vsbayes.VSLogisticRegression(C=10.0, random_state=0).fit(X, y)
point = LogisticRegression(C=10.0).fit(X, y)

grid = np.linspace(-5, 5, 300)[:, None]
coef, intercept = bayes.sample_coef(2000, random_state=0)
curves = 1 / (1 + np.exp(-(grid @ coef[:, 0, :].T + intercept[:, 0])))
low, high = np.percentile(curves, [5, 95], axis=1)

fig, ax = plt.subplots(figsize=(7, 4))
ax.fill_between(grid[:, 0], low, high, color="C0", alpha=0.25, label="90 % of posterior curves")
ax.plot(grid[:, 0], bayes.predict_proba(grid)[:, 1], color="C0", label="VS predictive")
ax.plot(grid[:, 0], point.predict_proba(grid)[:, 1], "k--", label="LogisticRegression")
ax.plot(x, y + rng.uniform(-0.03, 0.03, 16), "|", color="C3", ms=12, label="data")
ax.set_xlabel("x")
ax.set_ylabel("P(y = 1 | x)")
ax.legend(loc="upper left")
fig.tight_layout()
plt.show()
