import subprocess
import sys

from vsbayes.cli import main


def test_fit_demo_prints_a_comparison(capsys):
    assert main(["fit", "--dim", "3", "--n-samples", "400", "--seed", "1"]) == 0
    out = capsys.readouterr().out
    for word in ("Laplace", "VS", "IS", "excess KL", "exact"):
        assert word in out


def test_bad_options_give_one_line_errors(capsys):
    assert main(["fit", "--dim", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "positive" in err
    assert main(["fit", "--dim", "3", "--n-samples", "5"]) == 1
    err = capsys.readouterr().err
    assert "n_samples" in err and "Traceback" not in err


def test_module_entry_point():
    done = subprocess.run(
        [sys.executable, "-m", "vsbayes", "--version"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0 and "vsbayes" in done.stdout
