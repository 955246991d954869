"""Memory: a guard against dense allocations larger than the machine, and the block size.

**The guard.**
NumPy's ``MemoryError: Unable to allocate 120 GiB`` says neither which matrix was too large
nor what to change, and an allocation that does succeed beyond physical memory makes the
machine swap for hours. :func:`check_memory` is called with an estimate *before* the dense
arrays are allocated and raises :class:`~vsbayes.exceptions.MemoryLimitError` naming them.

**The address-space limit.** Where the process runs under an address-space limit
(``ulimit -v``, ``resource.setrlimit(RLIMIT_AS, ...)``, as batch schedulers and CI runners
set), an allocation beyond it fails with NumPy's ``MemoryError`` however much physical
memory the machine has: the limit is then the smaller of the two, the address-space
limit's headroom (the limit less the address space the process already maps) taken at the
same fraction.

**The block size.** Passes over many rows, points or sites (the likelihood at N points,
the Gram matrices, the tilted moments, the features of the VS solver) run in blocks whose
temporaries stay within :func:`block_bytes`: a quarter of scikit-learn's
``working_memory`` setting (256 MiB at its default of 1024 MiB), the one knob for all of
them. A fit holds a few such blocks at once (the likelihood's, the solver's features), and
its own arrays besides, hence the quarter. Set it as in scikit-learn::

    with sklearn.config_context(working_memory=256):
        VSLogisticRegression().fit(X, y)  # blocks of at most 64 MiB

Results may differ from the default's in the last bits (sums over other blocks).

**The settings.** :func:`config_context` (and :func:`set_config`) sets the memory limit
that the guard and the estimators' choice of covariance structure read, in bytes (default:
:data:`MEMORY_FRACTION` of physical memory), and can force a binary posterior's covariance
structure ("dense", "dual", "lowrank" or "diagonal"; "auto" lets the fit choose from the
problem's size) and the rank of the "lowrank" one::

    with vsbayes.config_context(memory_limit=2 * 2**30, covariance="lowrank"):
        VSLogisticRegression().fit(X, y)

**Freed pages kept (glibc).** A fit allocates and frees the same temporaries of a few
hundred KiB to tens of MiB many times over (the likelihood's blocks, the solver's
features, EP's sites). Under glibc, the main thread's arena maps each such array afresh
or returns the top of its heap to the system after each free, and the next array pays a
page fault for each of its pages (about 2 µs each; measured: 740 a likelihood block on
iris, two thirds of the block's time, against none in a worker thread, whose arena keeps
its pages). :func:`keep_freed_pages`, called when the outermost fit starts, sets glibc's
thresholds to the values its own adaptive rule moves to once a program frees an array of
32 MiB (maps from 32 MiB, returns the heap's top beyond 64 MiB): the default fit of iris
then takes no page fault after the first and 0.44× the CPU time, wine's 0.89×
(docs/decisions.md D-152). Results are the same to the bit. Elsewhere than glibc, or
where the environment sets glibc's malloc itself (``MALLOC_*_`` variables,
``GLIBC_TUNABLES``), it does nothing.
"""

from __future__ import annotations

import ctypes
import numbers
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

try:  # POSIX only
    import resource
except ImportError:  # pragma: no cover - Windows
    resource = None

from sklearn import get_config as sklearn_config

from .exceptions import MemoryLimitError

__all__ = [
    "MAX_DENSE_PARAMS",
    "MEMORY_FRACTION",
    "PREDICTIVE_TOL",
    "block_bytes",
    "block_length",
    "carried_config",
    "check_memory",
    "config_context",
    "format_bytes",
    "get_config",
    "keep_freed_pages",
    "memory_limit",
    "set_config",
]

#: The covariance structures of a binary posterior (see ``get_config``).
COVARIANCE_STRUCTURES = ("auto", "dense", "dual", "lowrank", "diagonal")
#: Default accuracy of the multinomial predictive on its wide rows (``predictive_tol``):
#: three estimated standard errors, absolute, on any class's probability.
PREDICTIVE_TOL = 5e-4
_DEFAULTS = {
    "memory_limit": None,
    "covariance": "auto",
    "covariance_rank": 4,
    "predictive_tol": PREDICTIVE_TOL,
}
_settings = dict(_DEFAULTS)
# Settings over the global ones in one thread (carried_config): a lazy dask prediction's.
_carried = threading.local()


def get_config() -> dict:
    """vsbayes's settings: ``memory_limit`` (bytes, or None: :data:`MEMORY_FRACTION` of
    physical memory), ``covariance`` (a binary posterior's covariance structure: "auto",
    "dense", "dual", "lowrank" or "diagonal"), ``covariance_rank`` (the rank of the
    "lowrank" structure) and ``predictive_tol`` (the accuracy of the multinomial
    predictive's adaptive rules).

    Returns
    -------
    dict
        A copy of the settings.
    """
    return {**_settings, **getattr(_carried, "settings", {})}


@contextmanager
def carried_config(settings: dict) -> Iterator[None]:
    """``settings`` over :func:`get_config`'s in this thread only, within a ``with`` block:
    the chunks of a lazy dask prediction, computed after the call (and its
    :func:`config_context`) returned, read the ``predictive_tol`` the call saw (D-276).
    Thread-local, so that chunks computed on dask's threads do not set one another's."""
    saved = getattr(_carried, "settings", None)
    _carried.settings = {**(saved or {}), **settings}
    try:
        yield
    finally:
        if saved is None:
            del _carried.settings
        else:
            _carried.settings = saved


def set_config(
    memory_limit: float | None = None,
    covariance: str | None = None,
    covariance_rank: int | None = None,
    predictive_tol: float | None = None,
) -> None:
    """Change vsbayes's settings (None leaves one unchanged); see :func:`get_config`.

    Parameters
    ----------
    memory_limit : float, optional
        Bytes one computation may allocate; the memory guard and the choice of the
        covariance structure read it.
    covariance : {"auto", "dense", "dual", "lowrank", "diagonal"}, optional
        The covariance structure of binary posteriors (and of each one-vs-rest problem;
        the multinomial posterior has no "dual"); "auto" chooses it from the problem's
        size and the memory limit (the fitted ``covariance_structure_`` and
        ``covariance_reason_`` record the choice).
    covariance_rank : int, optional
        Rank of the low-rank part of the "lowrank" structure (≥ 1).
    predictive_tol : float, optional
        Accuracy that the multinomial estimators' ``predict_proba``, ``predict_log_proba``,
        ``decision_function`` and ``predict`` ask of their adaptive rules: three estimated
        standard errors, absolute, on any class's probability (default
        :data:`PREDICTIVE_TOL`, 5e-4). Only rows whose latent spread is too wide for the
        deterministic rules (errors below 1e-5) read it; tighter values cost more nodes
        there (on standardized digits at C = 1, where every row is wide, 1e-4 takes about
        70 times the default's time). Binary predictives are accurate to about 1e-7
        whatever it is. Read when a read runs, in its process: a lazy dask prediction's
        chunks take the value of the call that built them (D-276).
    """
    if covariance is not None and covariance not in COVARIANCE_STRUCTURES:
        raise ValueError(f"covariance must be one of {COVARIANCE_STRUCTURES}; got {covariance!r}.")
    if covariance_rank is not None and (
        int(covariance_rank) != covariance_rank or covariance_rank < 1
    ):
        raise ValueError(f"covariance_rank must be an integer >= 1; got {covariance_rank!r}.")
    if predictive_tol is not None and not (
        isinstance(predictive_tol, numbers.Real) and 0 < predictive_tol < 1
    ):
        raise ValueError(
            f"predictive_tol must be a probability error in (0, 1); got {predictive_tol!r}."
        )
    if memory_limit is not None and not memory_limit > 0:
        raise ValueError(f"memory_limit must be a positive number of bytes; got {memory_limit!r}.")
    for name, value in (
        ("memory_limit", memory_limit),
        ("covariance", covariance),
        ("covariance_rank", covariance_rank),
        ("predictive_tol", predictive_tol),
    ):
        if value is not None:
            _settings[name] = value


@contextmanager
def config_context(**settings) -> Iterator[None]:
    """The settings of :func:`set_config` within a ``with`` block, restored after it.

    Parameters
    ----------
    **settings
        ``memory_limit``, ``covariance``, ``covariance_rank`` and ``predictive_tol``, as in
        :func:`set_config`.
    """
    saved = dict(_settings)
    set_config(**settings)
    try:
        yield
    finally:
        _settings.clear()
        _settings.update(saved)


#: The most parameters of a posterior fitted with dense p × p matrices where no structured
#: covariance replaces them (the multinomial posterior's, a shrinkage prior's): a p × p
#: factorization then takes up to 3.3·10¹¹ multiply-adds, about 10 s on two cores, and a
#: fit makes tens. Work, not memory: beyond it a fit that fits in memory runs for hours.
MAX_DENSE_PARAMS = 10_000

#: Fraction of physical memory that one computation may use: the rest is left to the
#: interpreter, the data and the other processes of the machine.
MEMORY_FRACTION = 0.8
# Used when the platform does not report its physical memory (os.sysconf is POSIX only).
_FALLBACK_LIMIT = 8 * 2**30
_UNITS = ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def _address_space_headroom() -> float:
    """Bytes the process may still map under its address-space limit (inf without one)."""
    if resource is None:
        return float("inf")
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return float("inf")
    try:  # the address space mapped now: the first field of statm, in pages (Linux)
        with open("/proc/self/statm") as statm:
            mapped = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        mapped = 0
    return max(float(soft - mapped), 0.0)


def memory_limit() -> float:
    """Bytes that one computation may allocate: the ``memory_limit`` setting
    (:func:`config_context`), else :data:`MEMORY_FRACTION` of physical memory, or of
    the headroom under the process's address-space limit where that is smaller.

    Returns
    -------
    float
        The setting, or ``0.8 × SC_PHYS_PAGES × SC_PAGE_SIZE`` (8 GiB when the platform
        does not report its physical memory), at most 0.8 × (``RLIMIT_AS`` − the address
        space mapped).
    """
    if _settings["memory_limit"] is not None:
        return float(_settings["memory_limit"])
    try:
        physical = float(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        physical = 0.0
    limit = MEMORY_FRACTION * physical if physical > 0 else float(_FALLBACK_LIMIT)
    return min(limit, MEMORY_FRACTION * _address_space_headroom())


def block_bytes() -> int:
    """Bytes the temporaries of one block of a chunked pass may take.

    Returns
    -------
    int
        A quarter of scikit-learn's ``working_memory`` (``sklearn.get_config()``, in MiB),
        read at each call so that ``sklearn.config_context`` applies.
    """
    return int(sklearn_config()["working_memory"] * 2**20) // 4


def block_length(bytes_per_item: float) -> int:
    """How many items (rows, points, sites) of ``bytes_per_item`` one block holds (≥ 1).

    Parameters
    ----------
    bytes_per_item : float
        Bytes of temporaries that one item of the pass takes.

    Returns
    -------
    int
    """
    return max(1, int(block_bytes() // max(bytes_per_item, 1.0)))


def format_bytes(nbytes: float) -> str:
    """A byte count in binary units (KiB = 1024 bytes), with three significant digits.

    Parameters
    ----------
    nbytes : float
        Number of bytes.

    Returns
    -------
    str

    Examples
    --------
    >>> format_bytes(120 * 2**30)
    '120 GiB'
    >>> format_bytes(1536)
    '1.5 KiB'
    >>> format_bytes(1023)
    '1023 bytes'
    """
    value = float(nbytes)
    for unit in _UNITS:
        if abs(value) < 1024.0 or unit == _UNITS[-1]:
            break
        value /= 1024.0
    # 1000 to 1023 in a unit would print as 1.02e+03 with three digits.
    return f"{value:.3g} {unit}" if abs(value) < 1000.0 else f"{value:.0f} {unit}"


def check_memory(nbytes: float, what: str, remedy: str) -> None:
    """Raise before allocating ``nbytes`` bytes if that exceeds :func:`memory_limit`.

    Parameters
    ----------
    nbytes : float
        Estimated bytes held at once by the arrays about to be allocated.
    what : str
        What they are, for the message (e.g. "the 200000 × 200000 posterior covariance").
    remedy : str
        What the user can change, one or more sentences.

    Raises
    ------
    MemoryLimitError
        If ``nbytes`` exceeds the limit; its message gives the estimate, the limit and the
        remedy.
    """
    limit = memory_limit()
    if nbytes > limit:
        raise MemoryLimitError(
            f"Computing {what} would allocate about {format_bytes(nbytes)}, more than the "
            f"memory limit of {format_bytes(limit)} ({_limit_source()}). {remedy}"
        )


def _limit_source() -> str:
    if _settings["memory_limit"] is not None:
        return "the memory_limit setting of vsbayes.config_context"
    return (
        f"{MEMORY_FRACTION:.0%} of this machine's physical memory, or of the headroom under "
        f"the process's address-space limit"
    )


# glibc's mallopt parameters and the values its adaptive thresholds stop at on 64-bit
# systems (DEFAULT_MMAP_THRESHOLD_MAX, and twice it for trimming).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_MMAP_THRESHOLD, _TRIM_THRESHOLD = 32 * 2**20, 64 * 2**20
_MALLOC_VARIABLES = (
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_TOP_PAD_",
    "MALLOC_MMAP_MAX_",
)
_pages_kept: bool | None = None  # None: not tried yet


def keep_freed_pages() -> bool:
    """Have glibc's malloc keep freed pages for the next allocations (see the module
    docstring); True where it does. Called when the outermost fit starts; the first call
    sets it for the process, the others return at once."""
    global _pages_kept
    if _pages_kept is None:
        _pages_kept = _set_malloc_thresholds()
    return _pages_kept


def _set_malloc_thresholds() -> bool:
    if any(name in os.environ for name in _MALLOC_VARIABLES):
        return False  # the user's own settings
    if "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - glibc only (not musl, macOS, Windows)
        mallopt = libc.mallopt
    except (AttributeError, OSError, TypeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # mallopt returns 1 on success. The map threshold first: a 32-bit glibc refuses 32 MiB
    # and then changes nothing, where a threshold set would end glibc's adaptive rule.
    return bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD)
    )
