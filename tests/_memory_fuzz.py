"""Worker of tests/test_memory_fuzz.py: fits under an address-space limit, one JSON line each.

Run as ``python _memory_fuzz.py HEADROOM_BYTES CASES_JSON``. After the imports, the process
limits its address space (``RLIMIT_AS``) to what it maps now plus ``HEADROOM_BYTES``, so
that vsbayes' memory setting (:func:`vsbayes._memory.memory_limit`) follows that limit, and
fits each case: ``{"estimator", "rows", "features", "classes", "density", "seed"}``, and
``"covariance"`` if the case forces a structure (``vsbayes.config_context``). Each
line says how the fit ended ("fit", or the exception's class and message) and the CPU
seconds it took (the process's, all threads: load on the machine barely changes them);
the first line gives vsbayes' memory limit under the address-space limit.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
import warnings

import numpy as np
import scipy.sparse as sp
import sklearn

import vsbayes
from vsbayes._memory import memory_limit
from vsbayes.exceptions import MemoryLimitError


def data(case: dict):
    """Rows (dense, or CSR below density 1) and labels with every class present."""
    rng = np.random.default_rng(case["seed"])
    m, d, k = case["rows"], case["features"], case["classes"]
    if case["density"] < 1.0:  # uniform positions (duplicates summed): fast at any shape
        nnz = max(m, int(case["density"] * m * d))
        positions = (rng.integers(0, m, nnz), rng.integers(0, d, nnz))
        X = sp.csr_matrix((rng.standard_normal(nnz), positions), shape=(m, d))
    else:
        X = rng.standard_normal((m, d))
    y = np.arange(m) % k
    rng.shuffle(y)
    return X, y


def run(case: dict) -> dict:
    X, y = data(case)
    estimator = getattr(vsbayes, case["estimator"])(random_state=0)
    start = time.process_time()
    try:
        with warnings.catch_warnings(), vsbayes.config_context(covariance=case.get("covariance")):
            warnings.simplefilter("ignore")
            estimator.fit(X, y)
        outcome, message = "fit", ""
    except MemoryLimitError as error:
        outcome, message = "MemoryLimitError", str(error)
    except MemoryError as error:  # NumPy's: what the guards must prevent
        outcome, message = "MemoryError", str(error)
    except Exception as error:  # recorded, not raised: the test says which
        outcome, message = type(error).__name__, str(error)
    return case | {
        "outcome": outcome,
        "message": message[:300],
        "cpu_seconds": time.process_time() - start,
    }


def main() -> None:
    headroom, cases = int(sys.argv[1]), json.loads(sys.argv[2])
    # Blocks of 32 MiB (a quarter of working_memory): the passes' margin stays well inside
    # the headroom.
    sklearn.set_config(working_memory=128)
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    resource.setrlimit(resource.RLIMIT_AS, (mapped + headroom, resource.RLIM_INFINITY))
    print(json.dumps({"memory_limit": memory_limit()}), flush=True)
    for case in cases:
        print(json.dumps(run(case)), flush=True)


if __name__ == "__main__":
    main()
