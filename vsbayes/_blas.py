"""BLAS threading for the engine's passes over the sample points."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext

from threadpoolctl import ThreadpoolController

__all__ = ["FACTORIZATION_PASS", "SMALL_PASS", "blas_thread_count", "blas_threads_for"]

# Multiply-adds per pass below which one BLAS thread is used. NumPy and SciPy each load
# their own OpenBLAS; between many small products, the idle threads of one pool spin while
# the other works, which made the variational-sampling fit of a 31-parameter posterior
# (4·10⁶ per pass) 2× slower on two cores, and far more variable, than with one thread.
# Passes of 1.5·10⁷ (d = 30, N = 15,872) are already faster on two threads.
SMALL_PASS = 2**23

# The same for the GLM approximations (Newton, EP, VB), whose every iteration alternates
# NumPy's products with SciPy's factorizations and triangular solves, each on its own
# OpenBLAS: measured on 2 cores, one thread was 3-5× faster than two for M p² + p³ from
# 6e5 (breast cancer) to 5e7 (1000 × 200); the sparse 5000 × 2000 model (p³ = 8e9) gains
# from two.
FACTORIZATION_PASS = 2**31

_controller: ThreadpoolController | None = None
# BLAS thread limits are process-wide. Fits running in several threads share one limit:
# it is set when the first small pass starts and restored when the last one ends, so that
# one fit never restores the threads under another's running pass (or leaves BLAS at one
# thread for good by restoring a limit it captured from another fit).
_lock = threading.Lock()
_users = 0
_limiter = None


def _get_controller() -> ThreadpoolController:
    """The process's controller, created once NumPy's and SciPy's BLAS are loaded (callers
    run after both imports)."""
    global _controller
    if _controller is None:
        _controller = ThreadpoolController()
    return _controller


def blas_thread_count() -> int:
    """Threads the loaded BLAS libraries may use now (the largest of their limits).

    It follows ``OMP_NUM_THREADS``/``OPENBLAS_NUM_THREADS``, threadpoolctl limits, joblib's
    limits in its workers, and is 1 inside a one-thread section of this module.
    """
    with _lock:
        info = _get_controller().select(user_api="blas").info()
    return max((int(lib["num_threads"]) for lib in info), default=1)


@contextmanager
def _one_blas_thread() -> Iterator[None]:
    global _users, _limiter
    with _lock:
        if _users == 0:
            _limiter = _get_controller().limit(limits=1, user_api="blas")
        _users += 1
    try:
        yield
    finally:
        with _lock:
            _users -= 1
            if _users == 0:
                _limiter.restore_original_limits()
                _limiter = None


def blas_threads_for(work_per_pass: float, small: float = SMALL_PASS) -> AbstractContextManager:
    """Context limiting BLAS to one thread when ``work_per_pass`` is at most ``small``."""
    if work_per_pass > small:
        return nullcontext()
    return _one_blas_thread()
