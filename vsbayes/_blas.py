"""BLAS threading for the engine's passes over the sample points."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

from threadpoolctl import ThreadpoolController

__all__ = ["SMALL_PASS", "blas_threads_for"]

# Multiply-adds per pass below which one BLAS thread is used. NumPy and SciPy each load
# their own OpenBLAS; between many small products, the idle threads of one pool spin while
# the other works, which made the variational-sampling fit of a 31-parameter posterior
# (4·10⁶ per pass) 2× slower on two cores, and far more variable, than with one thread.
# Passes of 1.5·10⁷ (d = 30, N = 15,872) are already faster on two threads.
SMALL_PASS = 2**23

_controller: ThreadpoolController | None = None


def blas_threads_for(work_per_pass: float) -> AbstractContextManager:
    """Context limiting BLAS to one thread when ``work_per_pass`` is below ``SMALL_PASS``."""
    global _controller
    if work_per_pass > SMALL_PASS:
        return nullcontext()
    if _controller is None:
        _controller = ThreadpoolController()
    return _controller.limit(limits=1, user_api="blas")
