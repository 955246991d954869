"""Posterior predictive of the softmax: ``E[softmax(f)]`` for Gaussian latent values f.

For one row, the K latent values ``f = W x + b`` are Gaussian under a Gaussian posterior,
``N(m, S)``, and the predictive probabilities are the K-dimensional integral
``p = ∫ softmax(f) N(f; m, S) df``. The softmax is invariant to adding one value to every
class, so the integral only sees the centred latent ``f − mean_k f_k``: m and S are centred
first (``P m``, ``P S P``, ``P = I − 11ᵀ/K``), which removes the posterior's prior-only
shift direction (wide along the sum of the intercepts, see
:mod:`vsbayes.models.softmax`) before any node is placed. In an orthonormal basis Q of the
centred subspace, ``f = P m + Q L z`` with ``L Lᵀ = Qᵀ S Q`` and z standard normal in
K − 1 dimensions.

**The rules, chosen row by row by the row's latent spread** (no loop over rows: each rule
takes its rows at once, in blocks). A narrow row's integrand is smooth on the scale of its
spread and takes a low-order rule on few nodes; only the wide rows take many. The spread is
the trace t of ``Qᵀ S Q`` (the sum of the centred variances, ≥ the largest of them, free
to compute), or for three classes its largest eigenvalue λ.

- *Three classes* (K − 1 = 2): tensor trapezoid rules, equally spaced nodes over ±7
  standard deviations, weighted by the normal density, averaged in the log domain
  (float64): 64 × 64 nodes, and fewer where λ is small (20² up to λ = 0.3, 32² up to 1,
  48² up to 3), at the same accuracy. For analytic integrands such rules converge
  geometrically; measured against a 321 × 321 rule, the absolute error is below 1e-10 where
  the centred latent variances are ≤ 10 (the smaller rules: ≤ 5e-12 at their largest λ on
  rows with tied classes). The node spacing grows with the widest direction's standard
  deviation while the softmax's poles stay at a distance π from the real axis, so the error
  grows with λ: measured against a 1201² rule, ≤ 1e-5 up to λ = 40, 3e-5 at 60, 1.6e-4 at
  80, 1.5e-3 at 200. Rows with λ > 40 take the adaptive rule below.
- *Narrow rows, four classes or more* (t ≤ 0.08): Stroud's degree-5 rule, 2(K − 1)² + 1
  nodes (0, ±√3 e_i, ±√3 e_i ± √3 e_j; signed weights), float64 sums in the linear domain.
  Its error is of order t³: measured on random rows (random shapes of S, half of them with
  two tied classes, where the softmax curves most) against 2^18-node references, the
  largest error is ≤ 0.02 t³ for K = 3, 4 and 10 (1.1e-5 at t = 0.08; 2.7e-4 at t = 0.3
  and 3e-3 at t = 1, too coarse there). A row on which the signed sums are not positive
  (impossible at this spread; a guard) goes on to the next rule.
- *Four classes, just wider* (t ≤ 2): tensor Gauss–Hermite rules, 6³ nodes up to t = 0.3,
  8³ up to 1, 16³ up to 2: on the same random rows ≤ 4e-7, 5e-6 and 2e-5 at those traces.
  Gauss–Hermite converges slowly on wide rows (16³ nodes: 9e-4 at t = 10), which stay with
  the adaptive rule; in more dimensions a tensor rule has too many nodes. With five
  classes or more, the rows just wider than the degree-5 rule's range take the first level
  of the adaptive rule, whose error there is far below its tolerance (on the same random
  rows against 2^18-node references: 5 classes 1.2e-5 at t = 0.3, 9e-5 at 1, 2.7e-4 at 3;
  10 classes 7.7e-6 at 1, 6.4e-5 at 3).

The rows that none of these takes (K ≥ 4 with t above their range, K = 3 with λ > 40):
randomized quasi-Monte Carlo with a stated accuracy, refined row by row. The nodes are 8
replicates, each a scrambled Sobol sequence (fixed scramblings: the rule is deterministic)
mapped by the normal quantile and taken with its mirror image. The estimate is the
replicates' average, and its standard error their standard deviation over √8. Every row
starts with 512 nodes per replicate (4096 in all), whitened so that their mean is exactly
0 and their second moment exactly I (exact for polynomials of degree ≤ 3); the rows where
three standard errors exceed ``tol`` (5e-4 by default, absolute, on any class) are refined
to four times as many nodes, then four times more, up to 8192 per replicate (65,536 in
all). From the second level on the nodes are nested and not whitened: each replicate's
Sobol sequence's first 1024 points and their mirror images, then its next 3072, pooled with
the first, so that a row taking 65,536 nodes costs 69,632 node evaluations (86,016 when
every level was a new whitened set). Whitening each block of a sequence on its own
disturbed the net, and so did keeping the whitened first 512 nodes among the sequence's
others (digits rows on 65,536 nodes, largest and median error: blocks whitened on their
own 1.2e-3 and 1.9e-4, the first 512 whitened 9.7e-4 and 1.2e-4, the sequence's nodes alone
9.4e-4 and 1.1e-4, a new whitened set 1.2e-3 and 1.2e-4); the rows refined are wide ones,
where exactness for quadratics buys nothing. Three standard errors bound the error with
high probability, not surely (the standard error has 7 degrees of freedom).

**The integrand: the softmax conditioned on the leading class's direction** (Rao–Blackwell
along one direction, closed form for every class at once). Let t be the row's leading
class (largest centred mean) and ``u_t = Qᵀ e_t``. With ``g = Qᵀ f = μ + L z``, the part of
g along u_t that is independent of the rest is ``τ = v · z``, ``v = s² L⁻¹ u_t``, of
variance ``s² = 1 / |L⁻¹ u_t|²``; moving along u_t adds the same amount to ``f_t`` against
every other class, so the leader's logit ``c_t = f_t − log Σ_{j≠t} e^{f_j}`` moves by
exactly τ while the other classes keep their shares ``e^{f_k} / Σ_{j≠t} e^{f_j}`` of the
rest. Integrating τ out: at each node ``p_t = LN(c_t − τ, s²)`` and
``p_k = (1 − p_t) e^{f_k} / Σ_{j≠t} e^{f_j}``, with ``LN(a, s²) = E[σ(a + s Z)]`` the
logistic-normal integral — one per node, whatever K, and the K values still sum to 1 at
every node. Both integrands are unbiased for the same probabilities; the conditioned one
has no step across the leader's boundaries (they all move with τ), where the plain
average's error concentrates on wide rows. ``LN`` is a table, ``1 / (1 + exp(−2 y P))``
with ``y = a / σ_t``, ``σ_t² = s² + π²/3`` and P a Chebyshev series in ``2 (y / 9)² − 1``
(degree 12) whose coefficients are Chebyshev series in ``2 √r − 1``, ``r = (π²/3) / σ_t²``
(degree 10), fitted by ``benchmarks/logistic_normal_table.py``: largest error 9.3e-6 for
every a and s ≤ 60 (wider s take s = 60's coefficients, within 1e-7); P's coefficients
are summed once per row, and a node costs one Clenshaw recurrence. Conditioning every
class on its own direction instead (a logistic-normal integral per class and node, D-076)
is as accurate on digits (largest replicate spread on 65,536 nodes 2.8e-4 against 3.8e-4
here, the plain average's 7.1e-4) at K times the integrals: the leading class's error
dominates either way.

The error is QMC's on an integrand that is nearly a step where the latent variances are
large (the softmax changes over a width of about 1 where two classes tie, against standard
deviations of several units): it falls roughly as N^(-0.6) there, so wide posteriors take
the higher levels and narrow ones stop at the first. Measured on the Laplace posterior of
standardized digits (10 classes, C = 1, median centred variance 19, up to 2000): against the
average of two 2^20-node rules (which differ by 1e-4) on 60 rows, the largest error is
1.0e-3, the 99th percentile 8.6e-4 (a single 4096-node set: 2.4e-3, and 20 of the 60 rows
above 1e-3). With the nested levels, on 200 rows evenly spaced in the rank of their
spread against one 2^20-node rule: largest error 9.4e-4, 99th percentile 8.6e-4, median
2.1e-4 (separate levels: 1.2e-3, 9.4e-4, 2.5e-4); 2 %, 53 % and 45 % of the 1797 rows stop
at 4096, 16,384 and 65,536 nodes, 42,000 node evaluations a row on average (separate
levels: 53,200). Replication has a price where the integrand is smooth:
on four classes with variances ≤ 3, 8 replicates of 512 nodes err by 3e-4 where one set of
4096 errs by 1e-4 (the rows stop there, their estimated error being below ``tol``).
*With the conditioned integrand* (D-096; ``benchmarks/softmax_estimators.py``): a node
costs 1.13 times the plain average's (the kernel's CPU time on all 1797 digits rows, loaded
machine), the replicates spread about half as much, and at ``tol`` 5e-4 the rows take
37,300 node evaluations on average against the plain average's 42,000 at 1e-3; on the same
200 rows, against references good to ~5e-5 (D-096), the largest error is 6.7e-4, the 99th
percentile 4.8e-4, the median 1.4e-4 (the plain average at 1e-3: 9.5e-4, 8.6e-4, 2.2e-4);
every row on 65,536 nodes: 6.7e-4 and median 3.8e-5. The 1e-4 target on every row stays out
of reach at this cost: see D-096 for the estimators measured (the Gumbel mixture that
smooths every boundary of the leading class, 13 to 33 times less error than the plain
average at equal nodes but K − 1 table look-ups per node and class and heavy-tailed on rare
classes; per class the best of the estimators, 7.4e-5 on every row on 65,536 nodes, at
some 8 to 12 times today's cost).
Tried and not kept (measured on the same digits rows): the binary predictive of each class
against its strongest rival as a control variate cuts the mean error by 20 % only (the
rows' classes compete several at a time); keeping only the classes whose probability can
matter leaves 9 or 10 of the 10 classes on most digits rows (against the 2^20-node
references of 200 rows, 159 keep all 10 classes above 1e-5). Also tried, on the 200 rows:
nodes along the eigen-directions of each row's covariance, the widest on the first Sobol
coordinate, instead of the Cholesky factor's (65,536 nodes: largest error 8.9e-4 against
1.2e-3 but median 1.6e-4 against 1.2e-4; 2^18 nodes: 4.2e-4 against 5.0e-4 — no consistent
gain: all nine directions of a row are wide, median eigenvalues 3.9 to 21.5); integrating
the widest direction exactly for the hard maximum, with the softmax as the probability that
``f + g`` peaks at the class for Gumbel noise g (``softmax_k(f) = P(argmax(f + g) = k)``;
the noise a QMC dimension per class): 4 × 16,384 nodes, largest error 1.9e-3, median
4.8e-4, at about 25 times the cost of a node (the noise moves the crossing points as much
as the other directions do); a fourth level of 2^18 nodes for the rows still above ``tol``:
31 % more nodes for a largest error of 1.0e-3 instead of 1.2e-3.

**For the argmax only** (``argmax_only=True``, a classifier's ``predict``; D-157). A
decision needs the order of the two largest probabilities, not their values. A wide row
first takes a screen, 8 replicates of 64 whitened nodes (:func:`screen_nodes`, an eighth
of the first level), and stops where its largest average leads the second by more than
:data:`DECISION_MARGIN` (4) times its estimated error and 4 ``tol``; the others take the
levels as without it (the screen not pooled with them), stopping as well after a level
where their lead is as large. The deterministic rules' rows are computed as without it.
Were the three-standard-error bounds sure, a lead above twice the error could not be
reversed by the true probabilities, nor by the full rule's values where their own lead
exceeds twice their error: so the argmax is the full values' except on rows whose two
largest full probabilities are within twice the full rule's error bound (1e-3 at the
default ``tol``, where the row converged), with the confidence of those bounds; the
factor 2 beyond allows for an error underestimated by half, and the floor of 4 ``tol``
for a region of the latent space that the screen's 512 nodes miss in every replicate.
On digits' posteriors (C = 1, all 1797 rows wide) the screen settles 1781 of the Laplace
posterior's rows and all of VS's: 722 and 512 node evaluations a row against
predict_proba's 37,311 and 10,761; on 6,000 random rows of 3 to 10 classes (traces 0.5 to
3000, a third with their means shrunk to near ties) and on digits, the argmax never
differed from the full values'.

**Speed, and what the rules cannot change** (``benchmarks/prediction_timing.py --part
multinomial``, ratios in one process on a loaded 2-core machine). On make_classification
4000 × 8 with 4 classes (Laplace, C = 1), 96 % of the rows take the degree-5 rule and 4 %
Gauss–Hermite 6³: ``predict_proba`` takes 28 × LogisticRegression's (side by side with the
QMC rule on every row before: 55 ms against 1.46 s), and its largest error on every row,
against a 30³ Gauss–Hermite reference, is 1.5e-7 (before: 1.3e-6); the latent moments now
cost more than the rule. On digits (10 classes, 64 features) every row is wide (λ ≥ 10,
trace 44 to 19,000) and takes the QMC rule: 1e5 resampled rows take 1200 to 2000 ×
LogisticRegression (loaded machine; the nested levels take 20 % less time), with a largest
error of 9.4e-4 on 200 rows stratified by spread against 2^20-node references (which agree
with each other to 4e-5). Ten times LogisticRegression is out of reach there for two
reasons. The exact latent moments alone cost 13 to 31 × its ``predict_proba`` (1e5 rows,
loaded machine; 210 × before they were computed as quadratic forms,
:class:`~vsbayes.models.latent.JointLatents`, and passed in the centred basis without a
K × K round trip; as pair products ``x_i x_j``, half the multiply-adds, they were no
faster): the 45 centred quadratic forms
``x̃ᵀ Σ^Q_ab x̃`` of a row are 1.9e5 multiply-adds against LogisticRegression's 650, and
the posterior covariance has no low-rank structure to exploit (its centred eigenvalues
spread from 0.005 to 3; 523 of the 585 are more than 0.01 away from the prior's 1), nor
have the rows' latent covariances (all nine centred variances of a row are large: median
eigenvalues 3.9 to 21.5). And a 9-dimensional integral of a nearly
stepwise integrand, with standard deviations of 3 to 45 against the softmax's transition
width of about 1, needs 10⁴–10⁵ nodes a row for 1e-3; for 1e-4, the 99th percentile of
the error falling as N^(-0.6) and the largest as N^(-0.4) (``benchmarks/prediction_timing.py``,
the rule's error against its nodes), about 2·10⁶ nodes on 99 % of the digits rows and 5·10⁷
on the worst.

Tried and not kept in sizing the rules: Stroud's rule beyond t = 0.08 (2.7e-4 at 0.3);
tensor Gauss–Hermite on three-class rows in place of the trapezoid (8² nodes err by 1e-4 at
λ = 1 where 32² trapezoid nodes err by 3e-13); reshaping the rows' small products
(``Qᵀ S Q``, ``Q L``) into single tall products with an inner dimension of K: slower here
than NumPy's batched products (OpenBLAS, 1e5 rows, K = 4: 0.44 s against 0.02 s).

**The Gumbel–orthant rule** (:func:`gumbel_orthant_proba`; the wide rows when ``tol`` is
below :data:`ORTHANT_BELOW`, 2e-4). The softmax is the law of the argmax under Gumbel noise,
``softmax_k(f) = P(argmax_j (f_j + G_j) = k)`` for independent standard Gumbel G_j, so
``p_k = E_G[P(f_k − f_j > G_j − G_k for all j ≠ k)]`` with f Gaussian: given G, an orthant
probability of the K − 1 Gaussian differences ``d_j = f_k − f_j`` (mean ``m_k − m_j``,
covariance from S). Genz's sequential conditioning integrates it one difference at a time
(Cholesky factor of the differences' covariance, most constrained first): the product of
K − 1 normal probabilities ``Φ(c_i)``, each bound c_i depending on the earlier
differences drawn from their truncated normals, ``Φ⁻¹(u_i Φ(c_i))``. Per class a node is
2K − 2 uniforms (K Gumbel, K − 2 for the chain), 8 scrambled Sobol replicates, nested
levels of 512 · 4^l points each (8 × 512 to 8 × 131,072), a row stopping where three
standard errors are below ``tol``. The integrand is smooth in every coordinate where the
differences are wide against the Gumbel noise (standard deviation 1.28): no step is left
for QMC to resolve, and on digits its largest error falls as N^-0.9 (against references
on 2^24 nodes of the conditioned rule, which differ from each other by ≤ 3.8e-5): 8.6e-4,
1.8e-4 and 8.9e-5 on 4,096, 16,384 and 65,536 nodes (99 %: 7.2e-4, 1.7e-4, 8.6e-5), where
the conditioned QMC average errs by 4.2e-3, 1.4e-3 and 7.0e-4 (4.7e-4 on 262,144). It
costs K (K − 1) normal probabilities and K (K − 2) quantiles a node (scipy's, ~11 ns each,
float64): 100 to 250 times the QMC rule's node on ten classes, so that it is the cheaper of
the two only at tolerances the QMC rule cannot reach (1e-4 on every digits row would take
it 2e7 to 6e7 nodes, extrapolating its rate N^-0.3 to N^-0.37). Where a difference is narrow
(``Var(f_k − f_j)`` small against the Gumbel noise) the integrand is a step in the Gumbel
coordinates (a zero-variance row: 1.8e-3 on 16,384 nodes); such rows stop at the QMC rule's
first level, whose estimated error there is below ``tol``.

The QMC rule's node sums run in float32 in the linear domain (the other classes'
exponentials shifted by their largest latent value unless no latent value can overflow
or all underflow, the leader's logit from its latent value, never from an exponential,
then a weighted sum per replicate; one product for a node's latent values, its τ and its
mirror image): 4096 nodes on all digits rows took 0.12 s for the plain average against
2.7 s in float64 log sums. Float32's rounding (1e-7 relative) is far below
the tolerance. A row where some class's average underflows (below 1e-30) is redone in
float64 log sums on the first level's nodes, so that the log-probabilities stay finite.
The probabilities sum to 1 to round-off in every case.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from scipy.special import ndtr, ndtri
from scipy.stats import qmc

from .._memory import block_bytes
from .._sums import logsumexp
from ..sampling.rules import SOBOL_SEED, sobol_normal_points, symmetric_sobol_nodes

__all__ = [
    "DECISION_MARGIN",
    "N_NODES",
    "ORTHANT_BELOW",
    "TOLERANCE",
    "centred_basis",
    "centred_softmax_predictive_log_proba",
    "gauss_hermite_nodes",
    "gumbel_orthant_proba",
    "logistic_normal_mean",
    "replicate_nodes",
    "screen_nodes",
    "softmax_predictive_log_proba",
    "stroud_nodes",
    "symmetric_sobol_nodes",
]

#: Nodes of the three-class trapezoid rule (64 × 64) and of one replicate at the finest level.
N_NODES = 4096
#: Default accuracy of the K ≥ 4 rule: three estimated standard errors, absolute.
TOLERANCE = 5e-4
#: Multiple of a wide row's estimated error (three standard errors, on any class) by which
#: its largest probability must lead the second for ``argmax_only`` to stop refining it:
#: twice the 2 at which the two classes' error bounds cannot swap them (see
#: :func:`centred_softmax_predictive_log_proba`).
DECISION_MARGIN = 4.0
#: Independently scrambled replicates per level (the standard error's degrees of freedom + 1).
REPLICATES = 8
#: Nodes per replicate at the first level, then four times as many at each level.
_FIRST_NODES = 512
_LEVELS = 3
#: Nodes per replicate of ``argmax_only``'s screen, before the first level.
_SCREEN_NODES = 64
_SEED = SOBOL_SEED  # fixed scrambling: the rule is deterministic
#: Dimensions (K − 1) up to which the tensor trapezoid rule is used.
TRAPEZOID_MAX_DIM = 2
#: (nodes per axis, largest variance of the centred latent in any direction, i.e. the
#: largest eigenvalue of Qᵀ S Q) of the trapezoid rules, narrowest first; wider rows take
#: the adaptive rule.
TRAPEZOID_LEVELS = ((20, 0.3), (32, 1.0), (48, 3.0), (64, 40.0))
TRAPEZOID_MAX_VAR = TRAPEZOID_LEVELS[-1][1]
_HALF_WIDTH = 7.0
#: Largest trace of a row's centred latent covariance that the degree-5 rule takes (its
#: error, ≤ 0.02 · trace³ measured, is below 1.1e-5 there).
STROUD_MAX_TRACE = 0.08
#: Dimensions (K − 1) up to which tensor Gauss–Hermite rules take the rows just wider.
GAUSS_HERMITE_MAX_DIM = 3
#: (nodes per axis, largest trace) of the tensor Gauss–Hermite rules, narrowest first.
GAUSS_HERMITE_LEVELS = ((6, 0.3), (8, 1.0), (16, 2.0))
# Largest latent value below which float64's exponentials of K ≤ 10^6 classes cannot
# overflow (e^709.8 is float64's largest); with a margin.
_NO_SHIFT_FLOAT64 = 600.0
# Smallest average kept in float64's linear domain; rows with a smaller one take log sums.
_FLOAT64_FLOOR = 1e-280
# Latent values (float32) per block at most, whatever the memory allows: the block stays
# near the processor's caches (digits, 4096 nodes: 2^18 to 2^22 within 15 % of each other).
_CACHE_ENTRIES = 2**20
# Smallest average kept in the linear domain; rows with a smaller one take log sums.
_LINEAR_FLOOR = 1e-30
# Largest latent value below which float32's exponentials of K ≤ 10^6 classes cannot
# overflow (e^88.7 is float32's largest); with a margin.
_NO_SHIFT = 60.0
# The logistic-normal integral E[σ(a + s Z)] as 1 / (1 + exp(−2 y P(y, r))), y = a / σ_t,
# σ_t² = s² + π²/3, r = (π²/3) / σ_t²: P's Chebyshev coefficients in 2 (y / 9)² − 1 (rows,
# degree 12) and 2 √r − 1 (columns, degree 10), fitted by benchmarks/logistic_normal_table.py
# (largest error 9.3e-6 for s ≤ 60, y clipped to ±9, where the integral is within 1e-7 of
# 0 or 1; wider s take s = 60's r, whose integral differs from theirs by ~1e-7).
_LOGISTIC_NORMAL_CHEBYSHEV = np.array(
    [
        [
            1.3214477236863031,
            -0.17758186618242511,
            -0.049694664412247735,
            0.22871203770550158,
            -0.10124607185795709,
            0.06987118591132177,
            -0.09699027087326674,
            0.039053441930258816,
            -0.10339333889139685,
            0.0080370000499062066,
            -0.095860151314209108,
        ],
        [
            0.37754083453604914,
            0.0410693849617806,
            -0.029584539529039517,
            0.35036276952861756,
            -0.16380903588457429,
            0.1201918527234951,
            -0.17021775812209311,
            0.056351851406655565,
            -0.17956228758009002,
            0.0052382024956737529,
            -0.16284308498381767,
        ],
        [
            -0.074567955859151921,
            0.38117048903094153,
            0.029769391380515216,
            0.17176939464205918,
            -0.075936498547496428,
            0.065939254359961119,
            -0.1140419815885745,
            0.016100275370504298,
            -0.11652644058953303,
            -0.012444083083377208,
            -0.096565448467625992,
        ],
        [
            0.035343388014597028,
            0.15028668118905292,
            -0.0003419381286350956,
            0.057715214650133517,
            -0.012499628728338024,
            0.0039555115379630822,
            -0.052362329596093993,
            -0.0068033540687287494,
            -0.048630460852718826,
            -0.01398148365071139,
            -0.030328503653086245,
        ],
        [
            -0.0041650837405264882,
            0.0093462343646226048,
            0.015768171141280277,
            -0.021918285618101226,
            0.006730388434169652,
            -0.03600615034296533,
            0.0010992023084729768,
            -0.011159325876417815,
            0.012742402565136951,
            0.00087035898774501241,
            0.020003762526495217,
        ],
        [
            0.0025184449381953702,
            -0.11736768079821444,
            0.0093882757364367742,
            -0.10758387422534556,
            0.027898903466188209,
            -0.065307846600335839,
            0.048329622083626886,
            -0.017120488295417437,
            0.068501505133503254,
            0.013877752445254549,
            0.06375959774672571,
        ],
        [
            0.0048210607774418629,
            -0.22931977038161749,
            0.030730637492069911,
            -0.17306842966487557,
            0.065641592111130298,
            -0.099607891192752124,
            0.093128746740251289,
            -0.034976409796050892,
            0.11342932601367171,
            0.014379354329968693,
            0.10630259788235052,
        ],
        [
            0.017719528325352812,
            -0.2853041115337468,
            0.055332996884455116,
            -0.21355151166194683,
            0.092987910684683178,
            -0.12456679722381547,
            0.12148119809045202,
            -0.05406761286731665,
            0.13573262365016539,
            0.0080199692309830366,
            0.13250204064897927,
        ],
        [
            0.022228832793539738,
            -0.26428023281137708,
            0.0592631263065172,
            -0.19845095923218511,
            0.091360986279281187,
            -0.11979372859853378,
            0.11514631070270334,
            -0.055249163869141998,
            0.12605137490220186,
            0.0044744360288941631,
            0.12451275229416703,
        ],
        [
            0.015425612090843296,
            -0.17671012792844831,
            0.04024764399270403,
            -0.13786513834975161,
            0.059201083193889913,
            -0.085677970332651357,
            0.079046736792981936,
            -0.036464018872265261,
            0.088782276514668329,
            0.0053356421164532306,
            0.086397754508917263,
        ],
        [
            0.005567621949851255,
            -0.082584399210358095,
            0.016293389981150902,
            -0.068149921940202723,
            0.024607765824291986,
            -0.042371120778165551,
            0.038085957794734761,
            -0.014689078002139713,
            0.044917723152732028,
            0.0055975304711925744,
            0.042377636814626862,
        ],
        [
            0.00060876869144352308,
            -0.024249900248381626,
            0.0034852372391442343,
            -0.021873832894421241,
            0.0056394470176721889,
            -0.013325183414396887,
            0.01171476205594249,
            -0.0029978751395908221,
            0.014829466684898429,
            0.0031443584693680374,
            0.013329892864033938,
        ],
        [
            -0.00010674795724957553,
            -0.003573892165253903,
            0.00014013292033929203,
            -0.0035809892216363617,
            0.00049593813869810988,
            -0.0019861405029286232,
            0.0018866902255735042,
            -7.1754242541398469e-05,
            0.0024841565387629244,
            0.0007344109415930028,
            0.0020591518609924253,
        ],
    ]
)
_LOGISTIC_VARIANCE = math.pi**2 / 3.0
_TABLE_Y_MAX = 9.0
_TABLE_R_MIN = 9e-4


def centred_basis(k: int) -> np.ndarray:
    """An orthonormal basis (K, K − 1) of the vectors whose entries sum to zero."""
    # Householder-free: QR of the first K − 1 columns of the centring matrix.
    centring = np.eye(k) - 1.0 / k
    q, _ = np.linalg.qr(centring[:, : k - 1])
    return q


@functools.lru_cache(maxsize=64)
def replicate_nodes(dim: int, level: int) -> np.ndarray:
    """The first halves of the nodes that ``level`` adds to each replicate, float32
    (dim, REPLICATES, n / 2): each replicate's new nodes are these and their negatives
    (read-only, cached).

    Level 0: the replicate's 512 nodes of :func:`symmetric_sobol_nodes` (whitened). Level
    l ≥ 1: the next 384 · 4^(l − 1) points of the same Sobol sequence
    (:func:`~vsbayes.sampling.rules.sobol_normal_points`), not whitened, so that up to level
    l the replicate's 512 · 4^l nodes are the sequence's first points and their mirror
    images (see the module docstring).
    """
    half = _FIRST_NODES // 2
    if level == 0:
        halves = [
            symmetric_sobol_nodes(dim, _FIRST_NODES, (_SEED, 0, r))[:half]
            for r in range(REPLICATES)
        ]
    else:
        first = 0 if level == 1 else half * 4 ** (level - 1)
        halves = [
            sobol_normal_points(dim, half * 4**level, (_SEED, 0, r))[first:]
            for r in range(REPLICATES)
        ]
    z = np.ascontiguousarray(np.stack(halves, axis=1).transpose(2, 1, 0), dtype=np.float32)
    z.flags.writeable = False
    return z


@functools.lru_cache(maxsize=16)
def screen_nodes(dim: int) -> np.ndarray:
    """The first halves of the screen's nodes (dim, REPLICATES, 32), float32: each
    replicate's :func:`symmetric_sobol_nodes` of 64 (the first 32 points of the
    replicate's Sobol sequence, whitened) for ``argmax_only`` (read-only, cached)."""
    half = _SCREEN_NODES // 2
    halves = [
        symmetric_sobol_nodes(dim, _SCREEN_NODES, (_SEED, 0, r))[:half] for r in range(REPLICATES)
    ]
    z = np.ascontiguousarray(np.stack(halves, axis=1).transpose(2, 1, 0), dtype=np.float32)
    z.flags.writeable = False
    return z


@functools.lru_cache(maxsize=16)
def trapezoid_nodes(dim: int, n_nodes: int = N_NODES) -> tuple[np.ndarray, np.ndarray]:
    """Tensor trapezoid rule for N(0, I_dim): ``r = ⌊n_nodes^(1/dim)⌋`` equally spaced nodes
    per axis over ±7, weights ∝ the normal density, normalized (read-only, cached)."""
    r = math.floor(n_nodes ** (1.0 / dim) + 1e-9)
    t = np.linspace(-_HALF_WIDTH, _HALF_WIDTH, r)
    w = np.exp(-0.5 * t * t)
    w /= w.sum()
    grids = np.meshgrid(*([t] * dim), indexing="ij")
    nodes = np.stack([g.ravel() for g in grids], axis=1)
    log_w = np.log(np.prod(np.meshgrid(*([w] * dim), indexing="ij"), axis=0).ravel())
    nodes.flags.writeable = log_w.flags.writeable = False
    return nodes, log_w


@functools.lru_cache(maxsize=16)
def stroud_nodes(dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Stroud's degree-5 rule for N(0, I_dim): nodes 0, ±√3 e_i and ±√3 e_i ± √3 e_j
    (``2 dim² + 1``), weights ``(dim² − 7 dim + 18)/18``, ``(4 − dim)/18`` and ``1/36``
    (signed: negative on the axes beyond four dimensions; read-only, cached)."""
    a = math.sqrt(3.0)
    axes = np.eye(dim)
    pairs = [
        a * (si * axes[i] + sj * axes[j])
        for i in range(dim)
        for j in range(i + 1, dim)
        for si in (1.0, -1.0)
        for sj in (1.0, -1.0)
    ]
    nodes = np.vstack(
        [np.zeros((1, dim)), a * axes, -a * axes, *([np.array(pairs)] if pairs else [])]
    )
    weights = np.concatenate(
        [
            [(dim * dim - 7 * dim + 18) / 18.0],
            np.full(2 * dim, (4 - dim) / 18.0),
            np.full(len(pairs), 1.0 / 36.0),
        ]
    )
    nodes.flags.writeable = weights.flags.writeable = False
    return nodes, weights


@functools.lru_cache(maxsize=16)
def gauss_hermite_nodes(dim: int, per_axis: int) -> tuple[np.ndarray, np.ndarray]:
    """Tensor Gauss–Hermite rule for N(0, I_dim), ``per_axis^dim`` nodes, exact for
    polynomials of degree ≤ ``2 per_axis − 1`` in each variable (read-only, cached)."""
    t, w = np.polynomial.hermite_e.hermegauss(per_axis)
    w = w / w.sum()
    grids = np.meshgrid(*([t] * dim), indexing="ij")
    nodes = np.stack([g.ravel() for g in grids], axis=1)
    weights = np.prod(np.meshgrid(*([w] * dim), indexing="ij"), axis=0).ravel()
    nodes.flags.writeable = weights.flags.writeable = False
    return nodes, weights


def _roots(cov: np.ndarray) -> np.ndarray:
    """Lower Cholesky factors (n, r, r) of the stacked covariances, a ridge of 1e-12 of
    their largest variance added where round-off leaves one not positive definite."""
    try:
        return np.linalg.cholesky(cov)
    except np.linalg.LinAlgError:
        scale = np.maximum(np.einsum("nii->n", cov) / cov.shape[-1], 1e-300)
        eigval, eigvec = np.linalg.eigh(cov)
        eigval = np.maximum(eigval, 0.0) + 1e-12 * scale[:, None]
        return np.linalg.cholesky((eigvec * eigval[:, None, :]) @ np.swapaxes(eigvec, 1, 2))


def _log_sum_exp(a: np.ndarray, axis: int) -> np.ndarray:
    """``log Σ exp(a)`` along ``axis`` (kept), with the maximum factored out."""
    top = a.max(axis=axis, keepdims=True)
    return np.log(np.exp(a - top).sum(axis=axis, keepdims=True)) + top


def _row_blocks(n: int, bytes_per_row: float, entries_per_row: int, max_bytes: float):
    rows = max(1, min(int(max_bytes // bytes_per_row), _CACHE_ENTRIES // entries_per_row))
    return [slice(i, min(i + rows, n)) for i in range(0, n, rows)]


def _log_average(factor, centred, z, log_w, max_bytes) -> np.ndarray:
    """``log Σ_j w_j softmax(centred + factor z_j)`` per row, in float64 log sums."""
    n, k, dim = factor.shape
    out = np.empty((n, k))
    # Per row: the nodes' latent values, their exponentials and a log-softmax, K each.
    for rows in _row_blocks(n, 24.0 * len(z) * k, len(z) * k, max_bytes):
        block = factor[rows]
        f = (block.reshape(-1, dim) @ z.T).reshape(len(block), k, len(z))  # one GEMM
        f += centred[rows][:, :, None]
        f -= _log_sum_exp(f, axis=1)
        f += log_w
        out[rows] = _log_sum_exp(f, axis=2)[..., 0]
    return out


def _rule_log_average(factor, centred, z, w, max_bytes) -> np.ndarray:
    """``log Σ_j w_j softmax(centred + factor z_j)`` per row for a rule of few nodes and
    signed weights ``w`` summing to 1: float64 sums in the linear domain, log sums for the
    rows where some class's average is below ``_FLOAT64_FLOOR``; NaN where a sum is not
    positive (a rule with negative weights on a row too wide for it)."""
    n, k, dim = factor.shape
    out = np.empty((n, k))
    z_t = np.ascontiguousarray(z.T)
    # As in _replicate_averages: the largest latent value at a node is ≥ 0, so only a row
    # reaching beyond float64's exponent range needs the shift by the largest value.
    reach = np.abs(centred).max(axis=1) + np.linalg.norm(factor, axis=2).max(axis=1) * float(
        np.linalg.norm(z, axis=1).max()
    )
    # Per row: K float64 latent values per node, their exponentials, one sum per node.
    for rows in _row_blocks(n, 8.0 * len(z) * (2 * k + 1), len(z) * k, max_bytes):
        m = rows.stop - rows.start
        f = (factor[rows].reshape(-1, dim) @ z_t).reshape(m, k, len(z))  # one GEMM
        f += centred[rows][:, :, None]
        if reach[rows].max() > _NO_SHIFT_FLOAT64:
            f -= f.max(axis=1, keepdims=True)
        e = np.exp(f)
        # Sums over a few classes as K − 1 additions of (rows, nodes) slices: a reduction
        # over a short middle axis costs several times more.
        total = e[:, 0].copy()
        for c in range(1, k):
            total += e[:, c]
        np.divide(w, total, out=total)
        # Σ_j w_j e_kj / Σ_l e_lj (einsum: batched products of small matrices cost per row)
        average = np.einsum("nkj,nj->nk", e, total)
        tiny = average.min(axis=1) < _FLOAT64_FLOOR
        with np.errstate(divide="ignore", invalid="ignore"):
            logs = np.log(average)
        if tiny.any():
            log_softmax = f[tiny] - np.log(e[tiny].sum(axis=1, keepdims=True))
            top = log_softmax.max(axis=2, keepdims=True)
            signed = np.exp(log_softmax - top) @ w
            with np.errstate(divide="ignore", invalid="ignore"):
                logs[tiny] = np.log(signed) + top[..., 0]
        if tiny.any() or not (average > 0).all():
            logs[~np.isfinite(logs).all(axis=1)] = np.nan
        out[rows] = logs
    return out


def logistic_normal_mean(a: np.ndarray, variance: np.ndarray) -> np.ndarray:
    """``E[σ(a + s Z)]`` for Z standard normal and ``s² = variance`` (broadcast), by the
    Chebyshev table (absolute error ≤ 1e-5; see the module docstring), in ``a``'s float
    precision (the rule's own evaluation, float64 for any other input)."""
    a, variance = np.broadcast_arrays(np.asarray(a), np.asarray(variance))
    dtype = a.dtype if a.dtype == np.float32 else np.float64
    total = (variance + _LOGISTIC_VARIANCE).ravel()
    coefficients = _table_coefficients(_LOGISTIC_VARIANCE / total).astype(dtype)
    inv_scale = (1.0 / np.sqrt(total)).astype(dtype)
    flat = a.astype(dtype).ravel()
    return _logistic_normal_at(flat, inv_scale, coefficients).reshape(a.shape)


def _table_coefficients(r: np.ndarray) -> np.ndarray:
    """P's Chebyshev coefficients in y at each r (…, 13): the table's series in r summed."""
    v = 2.0 * np.sqrt(np.clip(r, _TABLE_R_MIN, 1.0)) - 1.0
    terms = np.polynomial.chebyshev.chebvander(v, _LOGISTIC_NORMAL_CHEBYSHEV.shape[1] - 1)
    return terms @ _LOGISTIC_NORMAL_CHEBYSHEV.T


def _leader_conditioning(root: np.ndarray, centred: np.ndarray):
    """Per row, what the rule needs to integrate its leading class's direction exactly
    (module docstring): the leading class t (largest centred mean), the coefficients
    ``v = s² L⁻¹ u_t`` (n, K − 1) of the independent part ``τ = v · z`` of the node's
    latent along ``u_t = Qᵀ e_t``, whose variance is ``s² = 1 / |L⁻¹ u_t|²``, and the
    logistic-normal table at s²: ``1 / σ_t`` (n,) and P's coefficients (n, 13)."""
    leader = centred.argmax(axis=1)
    u = centred_basis(centred.shape[1])[leader]  # (n, K − 1): Qᵀ e_t
    solved = np.linalg.solve(root, u[:, :, None])[..., 0]  # L⁻¹ u_t
    variance = 1.0 / np.einsum("na,na->n", solved, solved)
    total = variance + _LOGISTIC_VARIANCE
    coefficients = _table_coefficients(_LOGISTIC_VARIANCE / total)
    return leader, solved * variance[:, None], 1.0 / np.sqrt(total), coefficients


def _logistic_normal_at(a, inv_scale, coefficients):
    """The table's ``E[σ(a + s Z)]`` for a (m, …) in float32, one s per row: ``1 / σ_t``
    (m,) and P's coefficients (m, 13) (Clenshaw's recurrence in ``2 (y / 9)² − 1``)."""
    extra = (slice(None),) + (None,) * (a.ndim - 1)
    y = a * inv_scale[extra]
    np.clip(y, -_TABLE_Y_MAX, _TABLE_Y_MAX, out=y)
    u = y * y
    u *= np.float32(2.0 / _TABLE_Y_MAX**2)
    u -= np.float32(1.0)
    twice = u + u
    later = np.zeros_like(u)
    current = np.broadcast_to(coefficients[:, -1][extra], u.shape).copy()
    for c in range(coefficients.shape[1] - 2, 0, -1):
        step = twice * current
        step -= later
        step += coefficients[:, c][extra]
        later, current = current, step
    current *= u
    current -= later
    current += coefficients[:, 0][extra]  # P
    current *= y
    current *= np.float32(-2.0)
    np.exp(current, out=current)
    current += np.float32(1.0)
    return np.reciprocal(current, out=current)


def _replicate_averages(factor, centred, lead, half, max_bytes) -> np.ndarray:
    """Each replicate's average over its nodes ±z of the softmax conditioned on the leading
    class's direction (module docstring): (n, REPLICATES, K), float32 sums in the linear
    domain. ``lead`` is :func:`_leader_conditioning`'s tuple (in float32).

    The leader's latent value is set aside and the others' exponentials shifted by their
    largest value (so that their sum, ``Σ_{j≠t} e^{f_j}``, is ≥ 1), unless no latent value
    can overflow or all underflow (bounded by ``_NO_SHIFT`` over the level's nodes, by the
    triangle inequality); the leader's logit against the rest, ``f_t − log Σ_{j≠t} e^{f_j}``,
    is taken from its latent value, never from its exponential.
    """
    n, k, dim = factor.shape
    leader, v, inv_scale, coefficients = lead
    _, replicates, n_half = half.shape
    n_nodes = replicates * 2 * n_half
    reach = np.abs(centred).max(axis=1) + np.linalg.norm(factor, axis=2).max(axis=1) * float(
        np.sqrt((half.astype(float) ** 2).sum(axis=0)).max()
    )
    # Each node's latent values and τ in one product: τ's coefficients as a (K + 1)-th row.
    stacked = np.concatenate([factor, v[:, None, :]], axis=1)
    out = np.empty((n, replicates, k))
    # Per row: K float32 latent values per node, half of them (and τ) as the product, and
    # about a dozen per-node arrays (τ, the leader's value and probability, the table's
    # recurrence, the weights).
    for rows in _row_blocks(n, 4.0 * n_nodes * (1.5 * k + 12), n_nodes * k, max_bytes):
        m = rows.stop - rows.start
        product = (stacked[rows].reshape(-1, dim) @ half.reshape(dim, -1)).reshape(
            m, k + 1, replicates, 1, n_half
        )  # one GEMM for both signs
        f = np.empty((m, k, replicates, 2, n_half), dtype=np.float32)
        shift = centred[rows][:, :, None, None, None]
        np.add(shift, product[:, :k], out=f[:, :, :, :1])
        np.subtract(shift, product[:, :k], out=f[:, :, :, 1:])
        tau = np.concatenate([product[:, k], -product[:, k]], axis=2).reshape(m, replicates, -1)
        del product
        f = f.reshape(m, k, replicates, 2 * n_half)
        picked = np.arange(m), leader[rows]
        lead_value = f[picked]  # a copy (advanced indexing): the leader's latent values
        f[picked] = -np.inf
        if reach[rows].max() > _NO_SHIFT:
            top = f.max(axis=1)
            f -= top[:, None]
            lead_value -= top
        np.exp(f, out=f)  # the leader's exponentials are 0
        rest = f.sum(axis=1)
        # The leader's logit against the rest, less τ: the conditional mean given the rest.
        logit = np.log(rest)
        np.subtract(lead_value, logit, out=logit)
        logit -= tau
        lead_p = _logistic_normal_at(logit, inv_scale[rows], coefficients[rows])
        # Σ_j e_kj (1 − p_j) / rest_j per replicate for the other classes: one batched
        # matrix-vector product; the leader's own sum replaces its (zero) entry.
        np.divide(np.float32(1.0) - lead_p, rest, out=rest)
        sums = np.matmul(f.transpose(0, 2, 1, 3), rest[..., None])[..., 0]
        sums[picked[0], :, picked[1]] = lead_p.sum(axis=2)
        out[rows] = sums
    out /= 2 * n_half
    return out


def _settled(average: np.ndarray, error: np.ndarray, margin: float | None, tol: float):
    """Rows (n,) whose largest average leads the second by more than ``margin`` times
    their estimated error (three standard errors, the largest over the classes), and by
    more than ``margin · tol`` (an estimate on few nodes can miss a region of the latent
    space in every replicate, and the decision needs no more than the full rule's
    accuracy): False everywhere without a margin."""
    if margin is None:
        return np.zeros(len(average), dtype=bool)
    top_two = np.partition(average, -2, axis=1)[:, -2:]
    return top_two[:, 1] - top_two[:, 0] > margin * np.maximum(error, tol)


def _estimated_error(replicates: np.ndarray) -> np.ndarray:
    """Three standard errors of the replicates' average (n, REPLICATES, K), the largest
    over the classes (n,)."""
    return 3.0 * replicates.std(axis=1, ddof=1).max(axis=1) / math.sqrt(replicates.shape[1])


def _adaptive_average(factor, root, centred, tol, max_bytes, levels=_LEVELS, margin=None):
    """The K ≥ 4 rule (module docstring): (n, K) averages, refined row by row on nested
    nodes (each level's averages pooled with the levels' before it) up to ``levels``
    levels, and each row's three estimated standard errors on its last level (n,).

    With a ``margin`` (:data:`DECISION_MARGIN`), every row first takes the screen
    (:func:`screen_nodes`, 8 × 64 nodes), and a row also stops where its leading class is
    settled (:func:`_settled`), on the screen or after a level: its values are then good
    for the argmax only. The screen's averages are not pooled with the levels'; a row it
    does not settle takes the levels as without a margin."""
    n, k, dim = factor.shape
    factor32 = factor.astype(np.float32)
    centred32 = centred.astype(np.float32)
    lead = tuple(
        x if x.dtype.kind == "i" else x.astype(np.float32)
        for x in _leader_conditioning(root, centred)
    )
    out = np.empty((n, k))
    estimated = np.empty(n)
    todo = np.arange(n)
    if margin is not None:
        screen = _replicate_averages(factor32, centred32, lead, screen_nodes(dim), max_bytes)
        out[:], estimated[:] = screen.mean(axis=1), _estimated_error(screen)
        todo = np.flatnonzero(~_settled(out, estimated, margin, tol))
        if not todo.size:
            return out, estimated
    replicates, summed = None, 0
    for level in range(levels):
        z = replicate_nodes(dim, level)
        whole = todo.size == n
        added = _replicate_averages(
            factor32 if whole else factor32[todo],
            centred32 if whole else centred32[todo],
            lead if whole else tuple(x[todo] for x in lead),
            z,
            max_bytes,
        )
        new = 2 * z.shape[2]
        if level <= 1:
            replicates, summed = added, 0
        else:
            replicates = (summed * replicates + new * added) / (summed + new)
        summed += new
        out[todo] = replicates.mean(axis=1)
        error = _estimated_error(replicates)
        estimated[todo] = error
        if level + 1 == levels:
            break
        refined = (error > tol) & ~_settled(out[todo], error, margin, tol)
        todo, replicates = todo[refined], replicates[refined]
        if not todo.size:
            break
    return out, estimated


#: (nodes per axis, largest λ) of the trapezoid rules of one class's log predictive (three
#: classes), narrowest first: the log of the class's average within 1e-4 nats of the
#: 64 × 64 rule at each level's largest λ, on random rows (random shapes of S, means 0 to
#: 3 sd, random classes: the worst are improbable classes) — and within 2e-6 on EP's
#: cavities and posteriors of wine and iris. Wider rows take the full rule.
OBSERVED_TRAPEZOID_LEVELS = ((16, 1.0), (20, 2.0), (24, 4.0), (32, 7.0), (40, 10.0), (48, 20.0))


def _observed_log_average(factor, centred, label, z, log_w, max_bytes) -> np.ndarray:
    """``log Σ_j w_j softmax(centred + factor z_j)_label`` per row, in float64 log sums."""
    n, k, dim = factor.shape
    out = np.empty(n)
    for rows in _row_blocks(n, 24.0 * len(z) * k, len(z) * k, max_bytes):
        block = factor[rows]
        f = (block.reshape(-1, dim) @ z.T).reshape(len(block), k, len(z))  # one GEMM
        f += centred[rows][:, :, None]
        chosen = f[np.arange(len(block)), label[rows]]  # (rows, nodes)
        chosen -= _log_sum_exp(f, axis=1)[:, 0]
        chosen += log_w
        out[rows] = _log_sum_exp(chosen, axis=1)[:, 0]
    return out


def observed_class_log_predictive(
    mean: np.ndarray, cov: np.ndarray, label: np.ndarray, *, max_bytes: float | None = None
) -> np.ndarray:
    """``log ∫ softmax(f)_{label_i} N(f; mean_i, cov_i) df`` for each row i: the log
    predictive of one class per row (leave-one-out's terms), to about 1e-4 nats.

    All K classes' probabilities to 1e-10 (:func:`softmax_predictive_log_proba`) cost the
    log-domain average of every class on up to 64 × 64 nodes; one class's log to 1e-5
    needs far fewer. Three classes: the trapezoid rule of that class alone on
    :data:`OBSERVED_TRAPEZOID_LEVELS` nodes, sized by each row's widest direction λ (the
    rule's error grows with the node spacing times that direction's standard deviation).
    Other K, and three-class rows wider than λ = 20: the full rule's value.

    Parameters
    ----------
    mean : ndarray of shape (n, K)
        Latent means.
    cov : ndarray of shape (n, K, K)
        Latent covariances (positive semi-definite).
    label : ndarray of shape (n,)
        Each row's class index.
    max_bytes : float, optional
        Bound on the temporaries of one block of rows; default
        :func:`~vsbayes._memory.block_bytes`.

    Returns
    -------
    ndarray of shape (n,)
        Log predictive probabilities of each row's class.
    """
    mean = np.asarray(mean, dtype=float)
    label = np.asarray(label, dtype=np.intp)
    n, k = mean.shape
    rows = np.arange(n)
    if k - 1 != TRAPEZOID_MAX_DIM:
        return softmax_predictive_log_proba(mean, cov, max_bytes=max_bytes)[rows, label]
    max_bytes = block_bytes() if max_bytes is None else max_bytes
    q = centred_basis(k)
    reduced = q.T @ cov @ q
    reduced = 0.5 * (reduced + np.swapaxes(reduced, 1, 2))
    largest = np.linalg.eigvalsh(reduced).max(axis=1)
    factor = q @ _roots(reduced)
    centred = mean - mean.mean(axis=1, keepdims=True)
    out = np.empty(n)
    done = np.zeros(n, dtype=bool)
    for per_axis, widest in OBSERVED_TRAPEZOID_LEVELS:
        take = np.flatnonzero(~done & (largest <= widest))
        if take.size:
            z, log_w = trapezoid_nodes(k - 1, per_axis ** (k - 1))
            out[take] = _observed_log_average(
                factor[take], centred[take], label[take], z, log_w.ravel(), max_bytes
            )
            done[take] = True
    if not done.all():
        wide = np.flatnonzero(~done)
        out[wide] = softmax_predictive_log_proba(mean[wide], cov[wide], max_bytes=max_bytes)[
            np.arange(wide.size), label[wide]
        ]
    return out


def softmax_predictive_log_proba(
    mean: np.ndarray, cov: np.ndarray, *, tol: float = TOLERANCE, max_bytes: float | None = None
) -> np.ndarray:
    """``log ∫ softmax(f) N(f; mean_i, cov_i) df`` for each row i (see the module docstring).

    Parameters
    ----------
    mean : ndarray of shape (n, K)
        Latent means.
    cov : ndarray of shape (n, K, K)
        Latent covariances (positive semi-definite; only their centred part matters).
    tol : float, default=5e-4
        Absolute accuracy of the K ≥ 4 rule: each row is refined until three estimated
        standard errors are below ``tol`` on every class, or it has 65,536 nodes. Below
        2e-4 (:data:`ORTHANT_BELOW`) the wide rows take the Gumbel–orthant rule instead,
        refined the same way up to 262,144 nodes: accurate to ~1e-4 on 65,536 nodes
        where the default rule errs by 7e-4, at 100 to 250 times its cost. Unused for the
        rows of K ≤ 3 classes whose centred latent variances are ≤ 60, whose rule is
        accurate to far better.
    max_bytes : float, optional
        Bound on the temporaries of one block of rows; default
        :func:`~vsbayes._memory.block_bytes`.

    Returns
    -------
    ndarray of shape (n, K)
        Log predictive probabilities; their exponentials sum to 1 in each row.
    """
    mean = np.asarray(mean, dtype=float)
    q = centred_basis(mean.shape[1])
    return centred_softmax_predictive_log_proba(mean, q.T @ cov @ q, tol=tol, max_bytes=max_bytes)


#: The trace of a row's centred latent covariance beyond which the predictive is taken at
#: this scale (see :func:`centred_softmax_predictive_log_proba`).
_LIMIT_SPREAD = 1e24


def centred_softmax_predictive_log_proba(
    mean: np.ndarray,
    centred_cov: np.ndarray,
    *,
    tol: float = TOLERANCE,
    max_bytes: float | None = None,
    argmax_only: bool = False,
) -> np.ndarray:
    """:func:`softmax_predictive_log_proba` from the covariance of the centred latent in
    the basis :func:`centred_basis` (all that the rule uses), as
    :class:`~vsbayes.models.latent.JointLatents` computes it: no round trip through the
    K × K covariance (two batched products of small matrices per row, which cost as much
    as the latent moments' own product on 10 classes).

    Parameters
    ----------
    mean : ndarray of shape (n, K)
        Latent means.
    centred_cov : ndarray of shape (n, K - 1, K - 1)
        ``Qᵀ cov Q`` for the rows' latent covariances cov and Q = ``centred_basis(K)``
        (positive semi-definite).
    tol, max_bytes
        As in :func:`softmax_predictive_log_proba`.
    argmax_only : bool, default=False
        Values for the argmax only (a classifier's ``predict``): the rows of the
        deterministic rules as without it, bitwise; a wide row (the adaptive rules') first
        takes a screen of 8 × 64 nodes and stops there, or after the first level, where its
        largest probability leads the second by more than :data:`DECISION_MARGIN` times
        its estimated error and ``DECISION_MARGIN · tol``; otherwise it is refined as
        without it. **Guarantee:** the argmax differs from the full values' only on rows
        whose two largest full probabilities are within ``2 ε`` of each other, ε the full
        rule's error bound on the row (three estimated standard errors: ≤ ``tol`` where the
        row converged, its own estimate where it reached the last level first), as far as
        the three-standard-error bounds hold at both levels (with high probability, not
        surely: the bound the full values themselves rest on). Were both bounds to hold, a
        row settled with a lead above ``2 ε_l`` keeps its leader (the true probabilities
        order as the settled ones do), and the full values order as the true ones where
        their lead exceeds ``2 ε``; the margin of 4 leaves a factor 2 for an
        underestimated ``ε_l`` (see the module docstring).

    Returns
    -------
    ndarray of shape (n, K)
        Log predictive probabilities; their exponentials sum to 1 in each row.
    """
    if not tol > 0:
        raise ValueError(f"tol must be positive; got {tol!r}.")
    margin = DECISION_MARGIN if argmax_only else None
    max_bytes = block_bytes() if max_bytes is None else max_bytes
    mean = np.asarray(mean, dtype=float)
    k = mean.shape[1]
    q = centred_basis(k)
    with np.errstate(over="ignore"):  # rows at float64's limit: refused just below
        reduced = 0.5 * (centred_cov + np.swapaxes(centred_cov, 1, 2))
        spread = np.einsum("nii->n", reduced)  # the trace: ≥ the largest variance
    overflowed = ~(np.isfinite(spread) & np.isfinite(mean).all(axis=1))
    if overflowed.any():
        raise ValueError(
            f"The latent values of {overflowed.sum()} row(s) overflow float64: their "
            f"features are too large (~1e154 or more) for a multinomial predictive. Rescale "
            f"X, e.g. with sklearn.preprocessing.StandardScaler in a pipeline."
        )
    huge = spread > _LIMIT_SPREAD
    if huge.any():
        # Past a latent sd of 1e12 the softmax's own unit width is below round-off beside
        # it: the predictive is its limit as the row's scale grows (the probabilities of
        # each class's latent being the largest), which this scale still gives to ~1e-12.
        # The rows are brought to it, mean and covariance alike, so that the rules'
        # products stay finite (rows of features ~1e35 gave NaN).
        shrink = np.sqrt(spread[huge] / _LIMIT_SPREAD)
        mean, reduced, spread = mean.copy(), reduced.copy(), spread.copy()
        mean[huge] /= shrink[:, None]
        reduced[huge] /= (shrink**2)[:, None, None]
        spread[huge] = _LIMIT_SPREAD
    root = _roots(reduced)
    factor = q @ root  # (n, K, K-1)
    centred = mean - mean.mean(axis=1, keepdims=True)
    out = np.empty((len(mean), k))
    done = np.zeros(len(mean), dtype=bool)

    def take(rows: np.ndarray, rule) -> None:
        """Rows' values by ``rule(factor, centred)``; those it leaves NaN stay to do."""
        if rows.size:
            values = rule(factor[rows], centred[rows])
            kept = ~np.isnan(values).any(axis=1)
            out[rows[kept]] = values[kept]
            done[rows[kept]] = True

    dim = k - 1
    if dim <= TRAPEZOID_MAX_DIM:
        # Two dimensions: the trapezoid rule, as accurate as 64 × 64 nodes (1e-10 up to a
        # largest variance of 10) on fewer nodes where the rows are narrower.
        largest = np.linalg.eigvalsh(reduced).max(axis=1)
        for per_axis, widest in TRAPEZOID_LEVELS:
            z_tr, log_w = trapezoid_nodes(dim, per_axis**dim)
            take(
                np.flatnonzero(~done & (largest <= widest)),
                lambda f, c, z_tr=z_tr, log_w=log_w: _log_average(f, c, z_tr, log_w, max_bytes),
            )
    else:
        z, w = stroud_nodes(dim)
        take(
            np.flatnonzero(spread <= STROUD_MAX_TRACE),
            lambda f, c: _rule_log_average(f, c, z, w, max_bytes),
        )
    if TRAPEZOID_MAX_DIM < dim <= GAUSS_HERMITE_MAX_DIM:
        for per_axis, widest in GAUSS_HERMITE_LEVELS:
            z_gh, w_gh = gauss_hermite_nodes(dim, per_axis)
            take(
                np.flatnonzero(~done & (spread <= widest)),
                lambda f, c, z_gh=z_gh, w_gh=w_gh: _rule_log_average(f, c, z_gh, w_gh, max_bytes),
            )
    if not done.all():
        wide = np.flatnonzero(~done)
        factor, centred = factor[wide], centred[wide]
        if tol < ORTHANT_BELOW:
            # The QMC rule's first level where it meets tol (rows just wider than the narrow
            # rules', where the Gumbel coordinates' steps would slow the orthant rule);
            # the Gumbel–orthant rule on the others.
            average, estimated = _adaptive_average(
                factor, root[wide], centred, tol, max_bytes, levels=1, margin=margin
            )
            rest = np.flatnonzero((estimated > tol) & ~_settled(average, estimated, margin, tol))
            if rest.size:
                average[rest] = gumbel_orthant_proba(
                    centred[rest], q @ reduced[wide[rest]] @ q.T, tol=tol, max_bytes=max_bytes
                )[0]
        else:
            average, _ = _adaptive_average(
                factor, root[wide], centred, tol, max_bytes, margin=margin
            )
        with np.errstate(divide="ignore"):
            logs = np.log(average)
        tiny = np.flatnonzero(average.min(axis=1) < _LINEAR_FLOOR)
        if tiny.size:
            half = replicate_nodes(k - 1, 0).reshape(k - 1, -1).T.astype(float)
            z = np.vstack([half, -half])
            log_w = np.full(len(z), -math.log(len(z)))
            exact = _log_average(factor[tiny], centred[tiny], z, log_w, max_bytes)
            logs[tiny] = np.where(average[tiny] < _LINEAR_FLOOR, exact, logs[tiny])
        out[wide] = logs
    # Normalize away the round-off of the node average (the exact rule sums to 1).
    out -= logsumexp(out, axis=1, keepdims=True)
    return out


#: ``tol`` below which the wide rows take the Gumbel–orthant rule instead of the replicate
#: QMC average of the softmax (whose largest error on wide ten-class rows stays above 1e-4
#: up to 2^18 nodes; see the module docstring).
ORTHANT_BELOW = 2e-4
#: Levels of the Gumbel–orthant rule: 8 replicates of 512 · 4^l scrambled Sobol points,
#: nested (each level's points are the same sequences' first points).
_ORTHANT_LEVELS = 4


@functools.lru_cache(maxsize=16)
def orthant_uniforms(k: int, level: int, seed=_SEED) -> np.ndarray:
    """The uniforms (REPLICATES, n, 2K − 2) that level ``level`` of the Gumbel–orthant rule
    adds to each replicate: points ``n_before`` to ``512 · 4^level`` of the replicate's
    scrambled Sobol sequence (K Gumbel coordinates, then K − 2 for the sequential
    conditioning), kept inside (0, 1) (read-only, cached)."""
    end = _FIRST_NODES * 4**level
    start = 0 if level == 0 else end // 4
    tiny = np.finfo(float).eps
    u = np.stack(
        [
            qmc.Sobol(
                2 * k - 2, scramble=True, rng=np.random.default_rng((seed, 2, r))
            ).random_base2(int(math.log2(end)))[start:end]
            for r in range(REPLICATES)
        ]
    )
    u = np.clip(u, tiny, 1.0 - tiny)
    u.flags.writeable = False
    return u


def _orthant_class_setup(centred, cov, k):
    """Per row, the sequential conditioning of class k's orthant (module docstring): the
    differences ``d_j = f_k − f_j`` (j ≠ k, most constrained first), their means ``μ`` (n,
    K − 1), the Cholesky factor of their covariance (n, K − 1, K − 1) and the classes j in
    that order (n, K − 1)."""
    others = np.array([j for j in range(centred.shape[1]) if j != k])
    mu = centred[:, [k]] - centred[:, others]
    cross = cov[:, k, others]  # Cov(f_k, f_j)
    c = cov[:, k, k][:, None, None] + cov[:, others][:, :, others]
    c -= cross[:, :, None] + cross[:, None, :]
    sd = np.sqrt(np.maximum(np.einsum("nii->ni", c), 1e-300))
    order = np.argsort(mu / sd, axis=1, kind="stable")
    c = np.take_along_axis(np.take_along_axis(c, order[:, :, None], 1), order[:, None, :], 2)
    return np.take_along_axis(mu, order, 1), _roots(c), others[order]


def _orthant_replicates(centred, cov, u, max_bytes) -> np.ndarray:
    """Each replicate's average over its uniforms u (REPLICATES, n_u, 2K − 2) of the
    Gumbel–orthant integrand of every class (module docstring): (n, REPLICATES, K)."""
    n, k = centred.shape
    replicates, n_u, _ = u.shape
    gumbel = -np.log(-np.log(u[:, :, :k]))  # (REPLICATES, n_u, K)
    out = np.empty((n, replicates, k))
    # Per row and node: the chain's K − 2 conditioned values, the bound, the product and
    # a temporary, float64, one replicate at a time; per row and class, its setup.
    for rows in _row_blocks(n, 8.0 * (n_u * (k + 2) + k * k), n_u * k, max_bytes):
        m = rows.stop - rows.start
        for c in range(k):
            mu, root, order = _orthant_class_setup(centred[rows], cov[rows], c)
            for r in range(replicates):
                # P(f_c − f_j > G_j − G_c for all j ≠ c | G): with the differences'
                # Cholesky factor, one conditioned standard normal at a time (Genz).
                y = np.empty((k - 2, m, n_u))
                product = np.ones((m, n_u))
                for i in range(k - 1):
                    bound = mu[:, i][:, None] + gumbel[r, :, c] - gumbel[r][:, order[:, i]].T
                    if i:
                        bound -= np.einsum("ml,lmn->mn", root[:, i, :i], y[:i])
                    bound /= root[:, i, i][:, None]
                    share = ndtr(bound)
                    product *= share
                    if i < k - 2:
                        share *= u[r, :, k + i]
                        np.clip(share, 1e-300, None, out=share)
                        y[i] = ndtri(share)
                out[rows, r, c] = product.mean(axis=1)
    return out


def gumbel_orthant_proba(
    mean: np.ndarray,
    cov: np.ndarray,
    *,
    levels: int = _ORTHANT_LEVELS,
    tol: float = 0.0,
    seed=_SEED,
    max_bytes: float | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``∫ softmax(f) N(f; mean_i, cov_i) df`` per row by the Gumbel–orthant rule (module
    docstring), refined row by row: every row starts on 8 × 512 nodes, and those whose
    three estimated standard errors exceed ``tol`` on some class take four times as many,
    up to ``levels`` levels (8 × 512 · 4^(levels − 1) nodes).

    Parameters
    ----------
    mean : ndarray of shape (n, K)
        Latent means.
    cov : ndarray of shape (n, K, K)
        Latent covariances (positive semi-definite; only their centred part matters).
    levels : int, default=4
        Largest number of levels (8 × 131,072 nodes at 4).
    tol : float, default=0.0
        Absolute accuracy (three standard errors) at which a row stops; 0 takes every row
        to the last level.
    seed : int or tuple, default=the rule's fixed scrambling
        Scrambling of the Sobol sequences (the rule is deterministic for a given seed).
    max_bytes : float, optional
        Bound on the temporaries of one block of rows; default
        :func:`~vsbayes._memory.block_bytes`.

    Returns
    -------
    proba : ndarray of shape (n, K)
        The estimates, normalized to sum to 1 (they sum to 1 within their error before).
    error : ndarray of shape (n,)
        Three standard errors of the replicates' average, the largest over the classes.
    nodes : ndarray of shape (n,)
        Nodes each row took (all replicates).
    """
    max_bytes = block_bytes() if max_bytes is None else max_bytes
    mean = np.asarray(mean, dtype=float)
    cov = np.asarray(cov, dtype=float)
    n, k = mean.shape
    centred = mean - mean.mean(axis=1, keepdims=True)
    q = centred_basis(k)
    cov = q @ (q.T @ (0.5 * (cov + np.swapaxes(cov, 1, 2))) @ q) @ q.T
    proba = np.empty((n, k))
    error = np.empty(n)
    nodes = np.zeros(n, dtype=np.int64)
    todo = np.arange(n)
    replicates, summed = None, 0
    for level in range(levels):
        u = orthant_uniforms(k, level, seed)
        added = _orthant_replicates(centred[todo], cov[todo], u, max_bytes)
        new = u.shape[1]
        replicates = added if level == 0 else (summed * replicates + new * added) / (summed + new)
        summed += new
        nodes[todo] = REPLICATES * summed
        proba[todo] = replicates.mean(axis=1)
        error[todo] = 3.0 * replicates.std(axis=1, ddof=1).max(axis=1) / math.sqrt(REPLICATES)
        refined = error[todo] > tol
        todo, replicates = todo[refined], replicates[refined]
        if not todo.size:
            break
    proba /= proba.sum(axis=1, keepdims=True)
    return proba, error, nodes
