"""
Posterior ellipses in 2-D: VS, Laplace and the exact posterior
==============================================================

Thirty observations, one feature, a slope and an intercept: the logistic posterior is
skewed. The exact posterior is computed on a fine grid (contours, and its mean and
covariance as a black ellipse); the Laplace approximation is centred at the mode with the
curvature there, while variational sampling (VS) fits the Gaussian that matches the
posterior's own moments from 256 evaluations: its ellipses lie on the exact ones (thick,
black). Ellipses are 1 and 2 standard deviations.
"""

import matplotlib.pyplot as plt
import numpy as np

import vsbayes
from vsbayes.models import BinaryGLMPosterior

rng = np.random.default_rng(5)
x = rng.standard_normal(30)
y = (rng.random(30) < 1 / (1 + np.exp(-(2.5 * x + 1)))).astype(int)
X = x[:, None]

# One global VS fit of the whole posterior from 256 evaluations. (The default picks a route
# per problem: here EP with VS site fits, whose standard deviations are 2-5 % narrower.)
vs = vsbayes.VSLogisticRegression(C=10.0, strategy="global", n_samples=256, random_state=0)
vs.fit(X, y)
laplace = vsbayes.LaplaceLogisticRegression(C=10.0).fit(X, y)

# The exact posterior of (slope, intercept) on a grid: the same log-density the estimators use.
model = BinaryGLMPosterior(
    X, 2.0 * y - 1, np.ones(len(y)), "logistic", prior_var=10.0,
    intercept_prior_var=vsbayes.estimators.INTERCEPT_PRIOR_VAR,
)  # fmt: skip
slope, intercept = np.meshgrid(np.linspace(-1, 9, 400), np.linspace(-2.5, 4, 400))
grid = np.column_stack([slope.ravel(), intercept.ravel()])
log_p = model.log_density(grid)
p = np.exp(log_p - log_p.max())
weights = p / p.sum()
mean = weights @ grid
cov = (grid - mean).T @ ((grid - mean) * weights[:, None])


def ellipse(ax, center, covariance, **style):
    angle = np.linspace(0, 2 * np.pi, 200)
    circle = np.column_stack([np.cos(angle), np.sin(angle)])
    half = np.linalg.cholesky(covariance)
    for k, alpha in ((1, 1.0), (2, 0.5)):
        points = center + k * circle @ half.T
        ax.plot(points[:, 0], points[:, 1], alpha=alpha, **style)
    ax.plot(*center, "o", color=style["color"])


fig, ax = plt.subplots(figsize=(6, 5))
ax.contourf(slope, intercept, p.reshape(slope.shape), levels=12, cmap="Greys", alpha=0.6)
ellipse(ax, mean, cov, color="k", lw=4, label="exact moments")
ellipse(ax, laplace.posteriors_[0].mean, laplace.sigma_, color="C1", ls="--", label="Laplace")
ellipse(ax, vs.posteriors_[0].mean, vs.sigma_, color="C0", lw=1.5, label="VS (256 evaluations)")
ax.set_xlim(0.5, 7.5)
ax.set_ylim(-0.5, 4.0)
ax.set_xlabel("slope")
ax.set_ylabel("intercept")
handles, labels = ax.get_legend_handles_labels()
unique = dict(zip(labels, handles, strict=True))
ax.legend(unique.values(), unique.keys(), loc="upper left")
ax.set_title("Logistic posterior, 30 observations")
fig.tight_layout()
plt.show()
