"""
Choosing C by the evidence instead of by cross-validation
=========================================================

``GridSearchCV`` picks ``C`` by refitting on folds over a grid. The Bayesian answer is one
curve: the log evidence ``log p(y | X, C)``, the probability of the labels under the
prior N(0, C·I) averaged over the coefficients. ``EmpiricalBayesClassifier`` brackets its
maximum with the Laplace approximation's evidence over a grid (cheap: one Newton fit per
C) and refines it with the estimator's own evidence, here VS's. The chosen ``C_`` is
where the data say the coefficients' scale lies; the cross-validated log loss, drawn for
comparison, has its minimum nearby.
"""

import matplotlib.pyplot as plt
import numpy as np
from sklearn.datasets import load_breast_cancer
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import cross_val_score
from sklearn.preprocessing import StandardScaler
from threadpoolctl import threadpool_limits

import vsbayes

X, y = load_breast_cancer(return_X_y=True)
X = StandardScaler().fit_transform(X)

model = vsbayes.EmpiricalBayesClassifier(vsbayes.VSLogisticRegression(random_state=0), Cs=9)
model.fit(X, y)
# Fits of a few hundred rows: one BLAS thread is the fastest (threads only contend).
with threadpool_limits(limits=1):
    cv_loss = [
        -cross_val_score(
            LogisticRegression(C=c, max_iter=5000), X, y, cv=5, scoring="neg_log_loss"
        ).mean()
        for c in model.Cs_
    ]

fig, ax = plt.subplots(figsize=(7, 4))
ax.semilogx(model.Cs_, model.log_evidence_, "o-", label="log evidence (Laplace, the grid)")
ax.semilogx(model.refined_Cs_, model.refined_log_evidence_, "s", label="log evidence (VS)")
ax.axvline(model.C_, color="C1", ls="--", label=f"C_ = {model.C_:.3g}")
ax.set_xlabel("C")
ax.set_ylabel("log evidence")
twin = ax.twinx()
twin.semilogx(model.Cs_, cv_loss, "^:", color="C2", label="5-fold log loss (right)")
twin.set_ylabel("cross-validated log loss", color="C2")
lines = ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
ax.legend(lines, [line.get_label() for line in lines], loc="lower center", fontsize=8)
print(f"C by the evidence: {model.C_:.3g}; by 5-fold log loss: {model.Cs_[np.argmin(cv_loss)]:.3g}")
fig.tight_layout()
plt.show()
