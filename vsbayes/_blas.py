"""BLAS threads: the fits call BLAS on one thread and run their own blocks side by side.

NumPy and SciPy each load an OpenBLAS with its own pool of threads. A fit alternates many
products and factorizations of the two; between calls, the idle threads of one pool spin
while the other works, and when another process is busy on a core, a spinning or
descheduled BLAS thread stalls every call that waits for it. Measured on 2 cores: a 35 × 35
covariance inversion inside a variational-sampling fit took 7 ms on two threads against
0.05 ms on one; a (d+1) × N by N × (d+1) moment pass (d = 34, N = 76,160) took 1.16 s on
two BLAS threads with another process busy, against 10 ms idle; and for that skinny
product two BLAS threads gained only 10 % on an idle machine, while the same product cut
into column blocks on two Python threads (one BLAS thread each) gained 1.8×. (Passes that
are bound by memory rather than flops gain little from threads either way.)

So every fit runs inside :func:`single_blas_thread`, and its large passes are cut into
blocks that :func:`map_blocks` runs on up to :func:`worker_threads` threads: as many as BLAS
could use when the outermost fit started (``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS``,
threadpoolctl and joblib limits all count). The blocks never depend on the number of
threads, and each BLAS call is single-threaded, so results are bitwise the same for any
thread count.

The limit is set through each OpenBLAS's ``openblas_set_num_threads_local`` where it has one
(threadpoolctl's setter elsewhere): OpenBLAS 0.3.30 and 0.3.31 (NumPy's and SciPy's wheels)
silently ignore ``openblas_set_num_threads`` called from any thread but the main one once
the main thread has called it, so a fit started in a thread (joblib's threading backend,
dask's threaded scheduler, a web server) ran BLAS on its threads under its own blocks' worker
threads, at 3 to 12 times the CPU time of the same fit from the main thread. In these
pthreads builds ``openblas_set_num_threads_local`` sets the same process-wide limit from any
thread (docs/decisions.md D-154).
"""

from __future__ import annotations

import ctypes
import functools
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import TypeVar

import numpy as np
from threadpoolctl import ThreadpoolController

from ._memory import keep_freed_pages
from ._warnings import carried

__all__ = [
    "SMALL_WORK",
    "blas_thread_count",
    "block_slices",
    "map_blocks",
    "one_blas_thread",
    "one_blas_thread_below",
    "single_blas_thread",
    "sum_blocks",
    "worker_threads",
]

T = TypeVar("T")
R = TypeVar("R")

_controller: ThreadpoolController | None = None
_blas_libraries: list | None = None
_controls: list | None = None  # _blas_libraries' _Threads
# The BLAS limit is process-wide. Fits running in several threads share it: it is set when
# the first fit starts and restored when the last one ends, so that one fit never restores
# the threads under another's running pass (or leaves BLAS at one thread for good by
# restoring a limit it captured from another fit).
_lock = threading.Lock()
_users = 0
_saved_limits: list = []  # (_Threads, its threads before the outermost context)
_budget = 1
# One pool per size (the BLAS limit rarely changes), never shut down while a fit could be
# submitting to it.
_pools: dict[int, ThreadPoolExecutor] = {}
# Set in the pool's threads: a block that itself calls map_blocks runs its blocks in line.
_local = threading.local()


def _get_controller() -> ThreadpoolController:
    """The process's controller, created once NumPy's and SciPy's BLAS are loaded (callers
    run after both imports)."""
    global _controller
    if _controller is None:
        _controller = ThreadpoolController()
    return _controller


def _libraries() -> list:
    """The loaded BLAS libraries' threadpoolctl controllers, selected once: their limits
    are read and set directly (:class:`_Threads`), where threadpoolctl's ``info()`` and
    ``limit()`` describe every library anew (~18 against ~4 µs a context, most of a
    one-row ``partial_fit``'s fixed cost after its site math)."""
    global _blas_libraries
    if _blas_libraries is None:
        _blas_libraries = list(_get_controller().select(user_api="blas").lib_controllers)
    return _blas_libraries


class _Threads:
    """One BLAS library's thread limit: read and set from any thread.

    For a pthreads OpenBLAS, its own ``openblas_get_num_threads`` and
    ``openblas_set_num_threads_local`` (where it has the latter; unmangled in the
    scipy-openblas wheels, whose other symbols carry a prefix), called directly: NumPy's
    and SciPy's OpenBLAS 0.3.30/0.3.31 ignore ``openblas_set_num_threads`` (threadpoolctl's
    setter) from a thread other than the main one once the main thread has called it,
    while ``_local`` sets the same process-wide limit from any thread (measured:
    docs/decisions.md D-154). An OpenMP build, where ``_local`` is meant per thread (the
    blocks' worker threads would not see it), and any other library keep threadpoolctl's
    calls. A set that did not take is repeated through threadpoolctl.
    """

    __slots__ = ("_set", "controller", "get")

    def __init__(self, lib) -> None:
        self.controller = lib
        self.get = lib.get_num_threads
        self._set = lib.set_num_threads
        if getattr(lib, "internal_api", None) != "openblas" or (
            getattr(lib, "threading_layer", None) != "pthreads"
        ):
            return
        prefix = getattr(lib, "_symbol_prefix", "")
        suffix = getattr(lib, "_symbol_suffix", "")
        setter = _symbol(lib, "openblas_set_num_threads_local", prefix, suffix)
        getter = _symbol(lib, "openblas_get_num_threads", prefix, suffix)
        if setter is not None and getter is not None:
            setter.argtypes = [ctypes.c_int]
            setter.restype = ctypes.c_int
            getter.argtypes = []
            getter.restype = ctypes.c_int
            self.get, self._set = getter, setter

    def set(self, threads: int) -> None:
        self._set(threads)
        if self.get() != threads:
            self.controller.set_num_threads(threads)


def _symbol(lib, name: str, prefix: str, suffix: str):
    """``lib``'s function ``name`` (mangled as the library's symbols, else plain), as a
    function object of its own (threadpoolctl's are left as they are), or None."""
    for symbol in (f"{prefix}{name}{suffix}", name):
        try:
            return lib.dynlib[symbol]
        except (AttributeError, TypeError):
            continue
    return None


def _thread_controls() -> list[_Threads]:
    global _controls
    if _controls is None:
        _controls = [_Threads(lib) for lib in _libraries()]
    return _controls


def _current_limit() -> int:
    return max((int(lib.get()) for lib in _thread_controls()), default=1)


def blas_thread_count() -> int:
    """Threads the loaded BLAS libraries may use now (the largest of their limits).

    It follows ``OMP_NUM_THREADS``/``OPENBLAS_NUM_THREADS``, threadpoolctl limits, joblib's
    limits in its workers, and is 1 inside :func:`single_blas_thread`.
    """
    with _lock:
        return _current_limit()


@contextmanager
def single_blas_thread() -> Iterator[None]:
    """Context in which BLAS runs on one thread; see the module docstring.

    The outermost context records the threads BLAS could use before it, which
    :func:`worker_threads` returns until the last context ends. Contexts nest and may be
    entered from several threads at once.
    """
    global _users, _saved_limits, _budget
    with _lock:
        if _users == 0:
            keep_freed_pages()  # (see vsbayes._memory)
            _saved_limits = [(lib, lib.get()) for lib in _thread_controls()]
            _budget = max((int(n) for _, n in _saved_limits), default=1)
            for lib, threads in _saved_limits:
                if threads != 1:
                    lib.set(1)
        _users += 1
    try:
        yield
    finally:
        with _lock:
            _users -= 1
            if _users == 0:
                for lib, threads in _saved_limits:
                    # A limit changed elsewhere during the fits is its owner's to restore.
                    if threads != 1 and lib.get() == 1:
                        lib.set(threads)
                _saved_limits = []
                _budget = 1


def one_blas_thread(func: Callable[..., R]) -> Callable[..., R]:
    """Decorator: run ``func`` inside :func:`single_blas_thread`."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        with single_blas_thread():
            return func(*args, **kwargs)

    return wrapper


#: Multiply-adds below which :func:`one_blas_thread_below` runs a call on one BLAS thread:
#: the work that :func:`block_slices` deems worth a thread's hand-off (about 1 to 2 ms on one
#: thread of the 2-core machine the docstring's figures come from).
SMALL_WORK = 2.0**22


def one_blas_thread_below(
    work: Callable[..., float],
) -> Callable[[Callable[..., R]], Callable[..., R]]:
    """Decorator: run the function inside :func:`single_blas_thread` when
    ``work(*args, **kwargs)``, its estimated multiply-adds, is below :data:`SMALL_WORK`;
    otherwise at BLAS's threads as they are.

    ``work`` takes the function's own arguments. Where it raises (arguments the function
    itself will refuse), the call runs on one thread and the function raises its own error.
    """

    def decorate(func: Callable[..., R]) -> Callable[..., R]:
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            try:
                small = work(*args, **kwargs) < SMALL_WORK
            except Exception:  # invalid arguments: the function's own error says what
                small = True
            if not small:
                return func(*args, **kwargs)
            with single_blas_thread():
                return func(*args, **kwargs)

        return wrapper

    return decorate


def worker_threads() -> int:
    """Threads :func:`map_blocks` uses: BLAS's limit when the running fits started (1
    outside :func:`single_blas_thread`, and inside a block run by :func:`map_blocks`)."""
    if getattr(_local, "in_block", False):
        return 1
    return _budget


def _get_pool(threads: int) -> ThreadPoolExecutor:
    with _lock:
        if threads not in _pools:
            _pools[threads] = ThreadPoolExecutor(
                threads, thread_name_prefix="vsbayes", initializer=_mark
            )
        return _pools[threads]


def _mark() -> None:
    _local.in_block = True


def map_blocks(func: Callable[[T], R], blocks: Sequence[T] | Iterable[T]) -> list[R]:
    """``[func(b) for b in blocks]``, run on :func:`worker_threads` threads.

    Call it inside :func:`single_blas_thread`, so that each block's BLAS calls are
    single-threaded. The results come back in the order of ``blocks`` (callers that sum them
    get the same bits whatever the threads); a block's exception is re-raised.
    """
    blocks = list(blocks)
    threads = worker_threads()
    if threads <= 1 or len(blocks) <= 1:
        return [func(b) for b in blocks]
    # (in the calling fit's warning blocks: the pool's threads are not its thread)
    return list(_get_pool(threads).map(carried(func), blocks))


def sum_blocks(func: Callable[[T], np.ndarray], blocks: Sequence[T]) -> np.ndarray:
    """``Σ func(b)`` over ``blocks``, run as :func:`map_blocks` does.

    The blocks run in waves of :func:`worker_threads`, so that at most that many results
    are held at once, and are added in the order of ``blocks``: the same bits whatever the
    threads.
    """
    blocks = list(blocks)
    step = max(1, min(worker_threads(), len(blocks)))
    total = None
    for start in range(0, len(blocks), step):
        for part in map_blocks(func, blocks[start : start + step]):
            if total is None:
                total = np.array(part, dtype=float)
            else:
                total += part
    return total


def block_slices(
    n_items: int, work_per_item: float, max_items: int | None = None, min_work: float = 2**22
) -> list[slice]:
    """Consecutive slices covering ``range(n_items)`` for :func:`map_blocks`.

    Each holds at least ``min_work`` multiply-adds (``work_per_item`` each) when there are
    enough, so that it is worth a thread's hand-off, and at most ``max_items`` items (a
    memory bound). The slices depend on the problem's size alone, never on the threads.
    """
    per_block = max(1, int(min_work // max(work_per_item, 1.0)))
    count = max(1, n_items // per_block)
    if max_items is not None:
        count = max(count, -(-n_items // max(1, max_items)))
    count = min(count, max(1, n_items))
    edges = [round(i * n_items / count) for i in range(count + 1)]
    return [slice(edges[i], edges[i + 1]) for i in range(count)]
