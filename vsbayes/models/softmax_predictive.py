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

This module holds the entry points, which pick a rule for each row; the parts are where a
reader looks for them: the node sets and the deterministic rules in
:mod:`vsbayes.models.softmax_predictive_rules`, the adaptive replicate QMC average in
:mod:`vsbayes.models.softmax_predictive_qmc`, its logistic-normal table in
:mod:`vsbayes.models.logistic_normal`, and the Gumbel–orthant rule in
:mod:`vsbayes.models.gumbel_orthant`.

**The rules, chosen row by row by the row's latent spread** (no loop over rows: each rule
takes its rows at once, in blocks). A narrow row's integrand is smooth on the scale of its
spread and takes a low-order rule on few nodes; only the wide rows take many. The spread is
the trace t of ``Qᵀ S Q`` (the sum of the centred variances, ≥ the largest of them, free
to compute), or for three classes its largest eigenvalue λ.

- *Three classes* (K − 1 = 2): tensor trapezoid rules, equally spaced nodes over ±7
  standard deviations, weighted by the normal density, averaged in float64 in the linear
  domain (the log domain on rows where a class's average is below ~1e-280): 64 × 64
  nodes, and fewer where λ is small (20² up to λ = 0.3, 32² up to 1, 48² up to 3), at the
  same accuracy. For analytic integrands such rules converge
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
  the adaptive rule; in more dimensions a tensor rule has too many nodes.
- *Five classes or more, just wider* (D-195): Smolyak's sparse grids on the nested
  Genz–Keister rules (:func:`~vsbayes.models.softmax_predictive_rules.sparse_grid_nodes`),
  exact for polynomials of total degree 7 up to t = 0.3 with up to 12 classes (89 nodes
  for 5 classes, 889 for 10, 1629 for 12) and of degree 9 up to t = 0.6 with up to 8
  (225 nodes for 5 classes, 709 for 7, 1485 for 8); signed weights, summed and guarded as
  the degree-5 rule's. Their error has a heavy tail, set by rows whose spread lies in two
  or three directions (a row of rank one is integrated by the 9-point rule itself, exact to
  degree 15). Against 2^17-node references on random rows as above, half of them of
  concentrated shapes (rank one along two tied classes' difference, rank one, rank two),
  600 rows a trace for five classes: degree 7, largest error 3.8e-6 at t = 0.2 and 1.0e-5
  at 0.3 (99th percentile 3.2e-6, median 3e-7; 1.7e-5 at 0.35); degree 9, 2.2e-6 at 0.5 and
  2.1e-5 at 0.6 (99th percentile 3.9e-6, median 4e-7); smaller with many classes at the
  same trace (degree 7 at 0.3: 1.3e-5 for 6 classes on 300 rows, 9.5e-7 for 10 and
  6.5e-7 for 12 on 100). These rows took the first level of the adaptive rule before (4096
  nodes), which errs by far more there: on another 600 five-class rows a trace, largest
  error 4.1e-5 at t = 0.3 and 9.2e-5 at 0.6, medians 4e-6 and 2e-5, where the grids err by
  6.2e-6 and 6.6e-6, medians 2e-7 and 3e-7; on 60 rows a trace against 2^18-node
  references, 8 classes 4.8e-6 and 1.8e-5 against the grids' 5.2e-7 and 3.1e-6, 10 classes
  3.8e-6 at 0.3 against 4.0e-7. The grids cost less (µs a row on one BLAS thread, load
  8.5: 5 classes 123 against 6 and 14 for the degree-7 and -9 grids, 8 classes 176 against
  32 and 92, 10 classes 213 against 95, 12 classes 275 against 116). They stop where their
  nodes would cost about as much as those 4096 (degree 7 on 13 classes: 2121 nodes, 272
  µs a row against 296; degree 9 on 10: 3769 nodes, 267 against 213): the rows of more classes just
  wider than the degree-5 rule's range, and the wider rows, take the first level of the
  adaptive rule, whose error there is far below its tolerance (against 2^18-node
  references: 5 classes 9e-5 at t = 1, 2.7e-4 at 3; 10 classes 7.7e-6 at 1, 6.4e-5 at 3;
  on 16 and 6 rows a trace, 20 classes 8.6e-7 at 0.3 and 1.2e-5 at 1, 50 classes 2.8e-7
  and 1.0e-5). End to end, after 20,000 rows × 20 features (Laplace, C = 1), most test
  rows are in the grids' range: ``predict_proba`` takes 2.1 times less time with 10
  classes, 11 times less with 6 (D-195).
- *Thirteen to 23 classes, just wider* (D-204; t ≤ 1.5): the sparse grids' nodes grow
  as (K − 1)³ and the rows' latent covariances are not concentrated in a few directions,
  but the softmax bends along a few of them. Each row is turned to its curvature
  directions (:func:`~vsbayes.models.softmax_predictive_rules._curvature_rotation`: the
  eigenvectors of ``Lᵀ Qᵀ H Q L``, H the softmax's Hessian ``diag(p) − p pᵀ`` at the
  row's mean, most curved first) and takes an anisotropic sparse grid there
  (:func:`~vsbayes.models.softmax_predictive_rules.anisotropic_grid_nodes`): degree 7 in
  the three leading directions, degree 5 with every pair in the others, about
  2 (K − 1)² + 27 nodes (315 for 13 classes, 749 for 20, 995 for 23). Its embedded rule
  (degree 5 in the leading directions, 3 in the others, on the same nodes) gives each row
  an estimate, the largest difference over the classes; a row keeps the grid's value where
  it is ≤ 5e-5 (:data:`~vsbayes.models.softmax_predictive_rules.ANISOTROPIC_GRID_ESTIMATE`,
  and ≤ ``tol``), the others go on to the adaptive rule. On every row measured the error was
  below the estimate (at most 0.23 of it on fitted models' rows, 0.87 on random ones, the
  latter at errors of 2e-8; where the estimate is above 2e-5, at most 0.08 on 480 rows of
  13 to 30 classes, D-226), so a kept row errs by less than half the 1e-4 target. Against
  references on 2^19 and 2^20 nodes: on 60 rows a fit stratified by trace, after 20,000
  rows × 20 features (Laplace, C = 1; as D-195's), the grid's rows err by at most 2.1e-7,
  2.9e-7 and 3.2e-7 with 13, 20 and 23 classes where the QMC level erred by 2.1e-6,
  8.8e-7 and 1.2e-6 (59, 54 and 48 of the 60 rows kept it); on random rows (30 a trace,
  13 to 23 classes, t = 0.3, 1, 1.5) at most 1.2e-6 where the QMC level erred by up to
  2.7e-5. A row costs 0.22, 0.47 and 0.58 of the QMC level's with 13, 20 and 23 classes
  (µs a row on one thread, load 11: 201 + 124 for the turn, an eigendecomposition, against
  1458; 581 + 292 against 1862; 811 + 306 against 1921); rows wider than t = 1.5, which
  seldom meet the estimate, are not tried. The rows of wider fits (classes20's, traces 5
  to 73) stay with the QMC level, which errs less there than the grids tried on as many
  nodes or more (D-204).

The rows that none of these takes (K ≥ 4 with t above their range or beyond the
anisotropic grid's estimate, K = 3 with λ > 40):
randomized quasi-Monte Carlo with a stated accuracy, refined row by row. The nodes are 8
replicates, each a scrambled Sobol sequence (fixed scramblings: the rule is deterministic)
mapped by the normal quantile and taken with its mirror image. The estimate is the
replicates' average, and its standard error their standard deviation over √8. Every row
starts with 512 nodes per replicate (4096 in all), whitened so that their mean is exactly 0
and their second moment exactly I (exact for polynomials of degree ≤ 3); the rows where
three standard errors exceed ``tol`` (5e-4 by default, absolute, on any class) are refined
to four times as many nodes, then twice as many at each level, up to 32,768 per replicate
(16,384, 32,768, 65,536, 131,072 and 262,144 in all; D-186). From the second level on the
nodes are nested and not whitened: each replicate's Sobol sequence's first 1024 points and
their mirror images, then its next 1024, 2048, 4096 and 8192, pooled with the ones before,
so that a row taking 65,536 nodes costs 69,632 node evaluations (86,016 when every level was
a new whitened set). Doubling rather than quadrupling lets a row stop nearer the nodes it
needs, and the same node evaluations then reach 262,144 nodes on the rows that need them
(digits, 1797 rows at the default ``tol``: 37,584 evaluations a row on average against
37,311 for 4096, 16,384 and 65,536 nodes; rows whose estimated error is still above ``tol``
at their last level 1.4 % against 5.8 %; on the 200 rows below, against Gumbel–orthant
references on 262,144 nodes: largest error 4.8e-4 against 6.9e-4, 99th percentile 4.0e-4
against 4.7e-4, median 1.42e-4 against 1.37e-4). Whitening each block of a sequence on its
own disturbed the net, and so did keeping the whitened first 512 nodes among the sequence's
others (digits rows on 65,536 nodes, largest and median error: blocks whitened on their own
1.2e-3 and 1.9e-4, the first 512 whitened 9.7e-4 and 1.2e-4, the sequence's nodes alone
9.4e-4 and 1.1e-4, a new whitened set 1.2e-3 and 1.2e-4); the rows refined are wide ones,
where exactness for quadratics buys nothing. Three standard errors bound the error with high
probability, not surely (the standard error has 7 degrees of freedom).

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
are summed once per row, and a node costs one Horner recurrence. Conditioning every
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
31 % more nodes for a largest error of 1.0e-3 instead of 1.2e-3. Genz and Monahan's
spherical–radial rule (D-267): each direction's line integrated to ~1e-5 (Gauss–Legendre
pieces between the crossing points of the K affine latents, ~28 evaluations a half-line),
the directions from scrambled Sobol points or random rotations of ±e_i, or rays from a
centre inside the leading class's region; on 120 rows against Gumbel–orthant references,
a ray errs as much as a node of this rule or more (16,384 half-lines from the mean: largest
error 2.1e-3, median 2.6e-4, against 1.2e-3 and 1.7e-4 on 16,384 nodes; 32,768 rays from
the centre: 9.8e-4 and 1.6e-4 against 9.3e-4 and 6.9e-5): a line removes only the
variance along it, and on these rows nearly all of it lies across directions.

**For the argmax only** (``argmax_only=True``, a classifier's ``predict``; D-157). A
decision needs the order of the two largest probabilities, not their values. A wide row
first takes a screen, 8 replicates of 64 whitened nodes
(:func:`~vsbayes.models.softmax_predictive_rules.screen_nodes`, an eighth of the first
level), and stops where its largest average leads the second by more than
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
LogisticRegression (loaded machine; the nested levels take 20 % less time, and D-185 to
D-187's node sums 1.3 times less CPU time again), with a largest error of 9.4e-4 on 200 rows
stratified by spread against 2^20-node references (which agree with each other to 4e-5;
4.8e-4 now, against the Gumbel–orthant references, D-186). Ten times LogisticRegression is
out of reach there for two reasons. The exact latent moments alone cost 13 to 31 × its
``predict_proba`` (1e5 rows, loaded machine; 210 × before they were computed as quadratic
forms, :class:`~vsbayes.models.latent.JointLatents`, and passed in the centred basis without
a K × K round trip; as pair products ``x_i x_j``, half the multiply-adds, they were no
faster): the 45 centred quadratic forms ``x̃ᵀ Σ^Q_ab x̃`` of a row are 1.9e5 multiply-adds
against LogisticRegression's 650, and the posterior covariance has no low-rank structure to
exploit (its centred eigenvalues spread from 0.005 to 3; 523 of the 585 are more than 0.01
away from the prior's 1), nor have the rows' latent covariances (all nine centred variances
of a row are large: median eigenvalues 3.9 to 21.5). And a 9-dimensional integral of a
nearly stepwise integrand, with standard deviations of 3 to 45 against the softmax's
transition width of about 1, needs 10⁴–10⁵ nodes a row for 1e-3; for 1e-4, the 99th
percentile of the error falling as N^(-0.6) and the largest as N^(-0.4)
(``benchmarks/prediction_timing.py``, the rule's error against its nodes), about 2·10⁶ nodes
on 99 % of the digits rows and 5·10⁷ on the worst.

Tried and not kept in sizing the rules: Stroud's rule beyond t = 0.08 (2.7e-4 at 0.3);
the sparse grids on the adaptive rule's integrand conditioned on the leading class's
direction (below), which gains nothing there (5 classes, 20 rows a trace: degree 7 9.4e-6
against 1.0e-5 at t = 0.6, 1.5e-4 against 1.7e-4 at 1; degree 5 and 9 alike) and would add
the logistic-normal table's error (≤ 9.3e-6) to every node;
tensor Gauss–Hermite on three-class rows in place of the trapezoid (8² nodes err by 1e-4 at
λ = 1 where 32² trapezoid nodes err by 3e-13); reshaping the rows' small products
(``Qᵀ S Q``, ``Q L``) into single tall products with an inner dimension of K: slower here
than NumPy's batched products (OpenBLAS, 1e5 rows, K = 4: 0.44 s against 0.02 s).

**Below the default tol: every class conditioned on its own direction** (D-268; rows of
centred trace above 5, :data:`OWN_DIRECTIONS_TRACE`, when ``tol`` is below 5e-4,
:data:`OWN_DIRECTIONS_BELOW`). Class k's logit against the others,
``f_k − log Σ_{j≠k} e^{f_j}``, moves by exactly τ_k along ``u_k = Qᵀ e_k``, so at each node
``p_k = LN(c_k − τ_k, s_k²)`` with class k's own ``τ_k = v_k · z`` and s_k: K table look-ups
a node (the others' sums taken without cancellation: for the node's top class, its others
summed apart), each class's boundaries all smoothed where the leader's direction smooths the
leading class's only. The K averages are unbiased each and sum to 1 within their error
(then normalized); the table's error being absolute (≤ 9.3e-6), a class whose average is
below :data:`OWN_DIRECTIONS_FLOOR`, 1e-5, takes log sums on the first level's nodes, as the
leader's below float32's range (D-277: a class e^-197 behind read e^-18, the table's floor).
The leader's integrand's largest errors lie on the other classes, at
every rank of probability (digits, 65,536 nodes: the leading class 1.8e-4, the others up to
7.0e-4, the eighth most probable class's 7.0e-4 among them; own directions for the two to
five most probable classes only: 6.5e-4 to 6.9e-4). Measured on 120 digits rows evenly
spaced in the rank of their centred trace, against Gumbel–orthant references on 262,144
nodes (two scramblings differ by ≤ 3.0e-5), every row on a level's nodes: largest error
3.7e-3, 5.4e-4, 2.9e-4, 1.6e-4 and 1.15e-4 on 4,096 to 131,072 nodes (the leader's: 4.7e-3,
1.2e-3, 9.3e-4, 7.0e-4, 4.1e-4; medians 2.0e-4 to 1.6e-5 against 4.9e-4 to 2.7e-5), falling
about as N^-1 from 16,384 nodes on where the leader's falls as N^-0.5; a node costs about
four times the leader's (one thread: 0.43 against 0.10 ms a row on 4,096 nodes, 10.5
against 2.45 on 131,072). Refined row by row on all 1797 rows (one thread, load 7-8): at
``tol`` 3e-4, 8.9 s of CPU for a largest error of 2.3e-4 on those rows (99 % 1.6e-4), where
the leader's integrand took 2.35 s and left 4.8e-4 (its worst row at its last level, still
above ``tol``); at 2e-4, 15.0 s for 1.7e-4 (3.1 s for 4.8e-4). At the default ``tol`` it
would take 5.4 s against 1.47 s for 3.8e-4 against 4.8e-4 (medians 4.4e-5 and 1.3e-4): the
leader's direction stays the default's integrand.

**The Gumbel–orthant rule** (:func:`~vsbayes.models.gumbel_orthant.gumbel_orthant_proba`;
when ``tol`` is below :data:`ORTHANT_BELOW`, 2e-4, the wide rows that the own-direction
average leaves above ``tol`` at its last level, and the narrower rows that the QMC rule's
first level leaves above it; D-268: at ``tol`` 1e-4 on the 120 digits rows, 6.8 s of CPU
for a largest error of 8.7e-5, 99 % 6.8e-5, where the orthant rule on every row after the
QMC rule's first level took 48 s for 6.4e-5 and 5.8e-5): each class's probability
as an orthant probability of Gaussian differences under Gumbel noise, integrated by
sequential conditioning; on digits its error falls as N^-0.9 where the QMC rule's falls as
N^-0.6, at 100 to 250 times the QMC rule's cost a node on ten classes. Its method and
measurements are in :mod:`vsbayes.models.gumbel_orthant`.

The QMC rule's node sums run in float32 in the linear domain (the other classes'
exponentials shifted by their largest latent value unless no latent value can overflow
or all underflow, the leader's logit from its latent value, never from an exponential,
then a weighted sum per replicate; one product for a node's latent values, the leader's,
its τ, their mirror images and the means, in chunks of nodes that stay near the
processor's caches, D-185): 4096 nodes on all digits rows took 0.12 s for the plain
average against 2.7 s in float64 log sums. Float32's rounding (1e-7 relative) is far
below the tolerance. A row where some class's average underflows (below 1e-30) is redone in
float64 log sums on the first level's nodes, so that the log-probabilities stay finite.
The probabilities sum to 1 to round-off in every case.
"""

from __future__ import annotations

import math

import numpy as np

from .._memory import PREDICTIVE_TOL, block_bytes
from .._sums import logsumexp
from .gumbel_orthant import gumbel_orthant_proba
from .softmax_predictive_qmc import _adaptive_average, _settled
from .softmax_predictive_rules import (
    _LEVELS,
    ANISOTROPIC_GRID_DIMS,
    ANISOTROPIC_GRID_ESTIMATE,
    ANISOTROPIC_GRID_MAX_TRACE,
    GAUSS_HERMITE_LEVELS,
    GAUSS_HERMITE_MAX_DIM,
    SPARSE_GRID_LEVELS,
    STROUD_MAX_TRACE,
    TRAPEZOID_LEVELS,
    TRAPEZOID_MAX_DIM,
    _curvature_rotation,
    _log_average,
    _log_sum_exp,
    _roots,
    _row_blocks,
    _rule_log_average,
    anisotropic_grid_nodes,
    centred_basis,
    gauss_hermite_nodes,
    replicate_nodes,
    sparse_grid_nodes,
    stroud_nodes,
    trapezoid_nodes,
    trapezoid_weights,
)

__all__ = [
    "DECISION_MARGIN",
    "ORTHANT_BELOW",
    "OWN_DIRECTIONS_BELOW",
    "OWN_DIRECTIONS_FLOOR",
    "OWN_DIRECTIONS_TRACE",
    "TOLERANCE",
    "centred_softmax_predictive_log_proba",
    "softmax_predictive_log_proba",
]

#: Default accuracy of the K ≥ 4 rule: three estimated standard errors, absolute (the
#: estimators' default, :func:`vsbayes.set_config`'s ``predictive_tol``).
TOLERANCE = PREDICTIVE_TOL
#: Multiple of a wide row's estimated error (three standard errors, on any class) by which
#: its largest probability must lead the second for ``argmax_only`` to stop refining it:
#: twice the 2 at which the two classes' error bounds cannot swap them (see
#: :func:`centred_softmax_predictive_log_proba`).
DECISION_MARGIN = 4.0
#: ``tol`` below which the wide rows take the Gumbel–orthant rule instead of the replicate
#: QMC average of the softmax (whose largest error on wide ten-class rows stays above 1e-4
#: up to 2^18 nodes; see :mod:`vsbayes.models.gumbel_orthant`).
ORTHANT_BELOW = 2e-4
#: ``tol`` below which the wide rows (:data:`OWN_DIRECTIONS_TRACE`) take the QMC average
#: of each class's softmax conditioned on its own direction (D-268): more accurate on as
#: many nodes, at about four times a node's cost; at the default ``tol`` the leader's
#: direction alone is the cheaper of the two.
OWN_DIRECTIONS_BELOW = TOLERANCE
#: The centred trace above which a row is wide for :data:`OWN_DIRECTIONS_BELOW`.
OWN_DIRECTIONS_TRACE = 5.0
#: Own-direction average below which a class's probability takes log sums over the first
#: level's nodes (D-277): the table's error (≤ 9.3e-6) is absolute, so below it the
#: average keeps no relative accuracy (a class far behind reads the table's floor).
OWN_DIRECTIONS_FLOOR = 1e-5
# Smallest average kept in the linear domain; rows with a smaller one take log sums.
_LINEAR_FLOOR = 1e-30


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
        standard errors are below ``tol`` on every class, or it has 262,144 nodes. Below
        5e-4 (:data:`OWN_DIRECTIONS_BELOW`) the rows of centred trace above 5 condition
        every class on its own direction: on digits' rows 2.3e-4 at ``tol`` 3e-4 where the
        default integrand stays at 4.8e-4, at about four times its cost (D-268). Below
        2e-4 (:data:`ORTHANT_BELOW`) the rows still above ``tol`` take the Gumbel–orthant
        rule, refined the same way up to 262,144 nodes (accurate to ~1e-4 on 65,536
        nodes, at 100 to 250 times the QMC rule's cost a node). Unused for the
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
        # largest variance of 10) on fewer nodes where the rows are narrower. Its weights
        # are positive: sums in the linear domain (the rows with a class's average below
        # float64's range in log sums) are its log sums to round-off, in half the time.
        largest = np.linalg.eigvalsh(reduced).max(axis=1)
        for per_axis, widest in TRAPEZOID_LEVELS:
            z_tr = trapezoid_nodes(dim, per_axis**dim)[0]
            w_tr = trapezoid_weights(dim, per_axis**dim)
            take(
                np.flatnonzero(~done & (largest <= widest)),
                lambda f, c, z_tr=z_tr, w_tr=w_tr: _rule_log_average(f, c, z_tr, w_tr, max_bytes),
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
    if dim > GAUSS_HERMITE_MAX_DIM:
        for degree, widest, largest_dim in SPARSE_GRID_LEVELS:
            if dim <= largest_dim:
                z_sg, w_sg = sparse_grid_nodes(dim, degree)
                take(
                    np.flatnonzero(~done & (spread <= widest)),
                    lambda f, c, z_sg=z_sg, w_sg=w_sg: _rule_log_average(
                        f, c, z_sg, w_sg, max_bytes
                    ),
                )
    if ANISOTROPIC_GRID_DIMS[0] <= dim <= ANISOTROPIC_GRID_DIMS[1]:
        # Many classes, just wider: the anisotropic grid in each row's curvature directions,
        # kept where its embedded rule agrees to the deterministic rules' accuracy (D-204).
        tried = np.flatnonzero(~done & (spread <= ANISOTROPIC_GRID_MAX_TRACE))
        if tried.size:
            z_an, w_an, w_embedded = anisotropic_grid_nodes(dim)
            logs, estimated = _rule_log_average(
                _curvature_rotation(factor[tried], centred[tried]),
                centred[tried],
                z_an,
                w_an,
                max_bytes,
                embedded=w_embedded,
            )
            kept = ~np.isnan(logs).any(axis=1) & (estimated <= min(tol, ANISOTROPIC_GRID_ESTIMATE))
            out[tried[kept]] = logs[kept]
            done[tried[kept]] = True
    if not done.all():
        wide = np.flatnonzero(~done)
        factor, centred = factor[wide], centred[wide]
        # Below the default tol the wide rows condition each class on its own direction
        # (D-268): K table look-ups a node, for an error that falls about as fast as N^-1
        # there where the leader's direction alone gives N^-0.5.
        own = (spread[wide] > OWN_DIRECTIONS_TRACE) & (tol < OWN_DIRECTIONS_BELOW)
        average, estimated = np.empty((wide.size, k)), np.empty(wide.size)
        for rows, own_directions in ((np.flatnonzero(~own), False), (np.flatnonzero(own), True)):
            if rows.size:
                # Below ORTHANT_BELOW the leader's integrand takes its first level only (the
                # rows just wider than the narrow rules', where the Gumbel coordinates'
                # steps would slow the orthant rule), the own directions' every level.
                average[rows], estimated[rows] = _adaptive_average(
                    factor[rows],
                    root[wide[rows]],
                    centred[rows],
                    tol,
                    max_bytes,
                    levels=1 if tol < ORTHANT_BELOW and not own_directions else _LEVELS,
                    margin=margin,
                    own_directions=own_directions,
                )
        if tol < ORTHANT_BELOW:
            # The Gumbel–orthant rule on the rows whose estimate is still above tol.
            rest = np.flatnonzero((estimated > tol) & ~_settled(average, estimated, margin, tol))
            own[rest] = False  # (the orthant rule's averages: no table)
            if rest.size:
                average[rest] = gumbel_orthant_proba(
                    centred[rest], q @ reduced[wide[rest]] @ q.T, tol=tol, max_bytes=max_bytes
                )[0]
        with np.errstate(divide="ignore"):
            logs = np.log(average)
        # The own-direction averages are the logistic-normal table's, accurate to ~1e-5
        # absolute, not relative: a class far behind reads its floor (e^-18 for e^-197 on
        # four classes). Their classes below OWN_DIRECTIONS_FLOOR take log sums on the first
        # level's nodes, as the leader's integrand's below float32's range (D-277).
        floor = np.where(own, OWN_DIRECTIONS_FLOOR, _LINEAR_FLOOR)[:, None]
        tiny = np.flatnonzero((average < floor).any(axis=1))
        if tiny.size:
            half = replicate_nodes(k - 1, 0).reshape(k - 1, -1).T.astype(float)
            z = np.vstack([half, -half])
            log_w = np.full(len(z), -math.log(len(z)))
            exact = _log_average(factor[tiny], centred[tiny], z, log_w, max_bytes)
            logs[tiny] = np.where(average[tiny] < floor[tiny], exact, logs[tiny])
        out[wide] = logs
    # Normalize away the round-off of the node average (the exact rule sums to 1), and the
    # own-direction averages' error in their sum.
    out -= logsumexp(out, axis=1, keepdims=True)
    return out
