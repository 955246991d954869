"""Worker of tests/test_examples.py: runs example scripts, one JSON line each.

Run as ``python _run_examples.py SCRIPT...``. Each script runs as ``__main__`` in its own
directory, with matplotlib's non-interactive Agg backend, RuntimeWarnings as errors (as the
suite's ``filterwarnings`` makes them) and SciPy's BLAS on one thread; each line gives the
script and the traceback that stopped it, or null.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import traceback
import warnings

import matplotlib
import scipy.linalg  # noqa: F401 (loads SciPy's BLAS, for the limit below)
from threadpoolctl import ThreadpoolController


def main() -> None:
    # SciPy's BLAS on one thread, as in the suite's process (tests/conftest.py says why).
    for library in ThreadpoolController().lib_controllers:
        folder = os.path.basename(os.path.dirname(library.filepath))
        if library.user_api == "blas" and folder == "scipy.libs":
            library.set_num_threads(1)
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for script in sys.argv[1:]:
        os.chdir(os.path.dirname(script))
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", RuntimeWarning)
                runpy.run_path(script, run_name="__main__")
            error = None
        except BaseException:  # recorded, not raised: the script's test says which
            error = traceback.format_exc()
        plt.close("all")
        print(json.dumps({"script": script, "error": error}), flush=True)


if __name__ == "__main__":
    main()
