"""The logistic-normal integral ``E[σ(a + s Z)]``, Z standard normal, by a Chebyshev table.

The softmax predictive's QMC rule integrates its leading class's direction exactly at each
node (:mod:`vsbayes.models.softmax_predictive`, "The integrand"): one such integral per
node. It is ``1 / (1 + exp(−2 y P))`` with ``y = a / σ_t``, ``σ_t² = s² + π²/3`` and P a
Chebyshev series in ``2 (y / 9)² − 1`` whose coefficients are Chebyshev series in
``2 √r − 1``, ``r = (π²/3) / σ_t²``: the coefficients are summed once per s and turned
into the power series of −2P in ``u = 2 (y / 9)² − 1``, and an evaluation costs one Horner
recurrence (two operations a degree; Clenshaw's recurrence took three and twice the
buffers, 1.6 times the time on the QMC rule's chunks, D-187). In float32 the power series'
rounding stays within 1.5e-6 of the Chebyshev form's on ``|a| ≤ 80`` and s up to 100, and
its largest error against the integral is the table's (4e-6 there).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["logistic_normal_mean"]

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
    """The coefficients (…, 13) of −2P at each r as a power series in ``2 (y / 9)² − 1``,
    lowest power first: the table's series in r summed, then P's Chebyshev series turned
    into powers (float64)."""
    v = 2.0 * np.sqrt(np.clip(r, _TABLE_R_MIN, 1.0)) - 1.0
    terms = np.polynomial.chebyshev.chebvander(v, _LOGISTIC_NORMAL_CHEBYSHEV.shape[1] - 1)
    return (terms @ _LOGISTIC_NORMAL_CHEBYSHEV.T) @ _CHEBYSHEV_TO_POWER


def _chebyshev_to_power(degree: int) -> np.ndarray:
    """(degree + 1, degree + 1): row j the power series of −2 T_j."""
    out = np.zeros((degree + 1, degree + 1))
    for j in range(degree + 1):
        power = np.polynomial.chebyshev.cheb2poly(np.eye(degree + 1)[j])
        out[j, : len(power)] = -2.0 * power
    return out


_CHEBYSHEV_TO_POWER = _chebyshev_to_power(_LOGISTIC_NORMAL_CHEBYSHEV.shape[0] - 1)


def _logistic_normal_at(a, inv_scale, coefficients):
    """The table's ``E[σ(a + s Z)]`` for a (m, …) in float32, one s per row: ``1 / σ_t``
    (m,) and :func:`_table_coefficients` (m, 13) (Horner's recurrence in
    ``2 (y / 9)² − 1``); or one s per row and class: a (m, K, …), ``1 / σ_t`` (m, K) and
    the coefficients (m, K, 13)."""
    extra = (slice(None),) * inv_scale.ndim + (None,) * (a.ndim - inv_scale.ndim)
    y = a * inv_scale[extra]
    np.clip(y, -_TABLE_Y_MAX, _TABLE_Y_MAX, out=y)
    u = y * y
    u *= np.float32(2.0 / _TABLE_Y_MAX**2)
    u -= np.float32(1.0)
    current = np.empty_like(u)
    current[...] = coefficients[..., -1][extra]
    for c in range(coefficients.shape[-1] - 2, -1, -1):
        current *= u
        current += coefficients[..., c][extra]  # −2P at the end
    current *= y
    np.exp(current, out=current)
    current += np.float32(1.0)
    return np.reciprocal(current, out=current)
