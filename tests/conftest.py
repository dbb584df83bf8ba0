import logging
import os
import subprocess
import sys

import pytest

logging.getLogger().setLevel(logging.ERROR)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")


@pytest.fixture
def test_pipeline():
    """A TestPipeline on the in-process runner (a bare one would try to download Prism)."""
    from apache_beam.testing.test_pipeline import TestPipeline
    return TestPipeline(runner="FnApiRunner")


class Completed:
    def __init__(self, returncode, stdout, stderr):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def run_cli(*args, check_codes=(0,), timeout=300, subprocess_=False, cwd=None):
    """The real CLI entry point: in this process (fast), or as `python -m rollout_relabel` in a fresh one."""
    args = [str(a) for a in args]
    if subprocess_:
        proc = subprocess.run([sys.executable, "-m", "rollout_relabel", *args], capture_output=True, text=True,
                              cwd=cwd or ROOT, timeout=timeout)
    else:
        import contextlib
        import io

        from rollout_relabel.pipeline.cli import main
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), contextlib.chdir(cwd or os.getcwd()):
            code = main(args)
        proc = Completed(code, out.getvalue(), err.getvalue())
    if proc.returncode not in check_codes:
        raise AssertionError(f"relabel {' '.join(map(str, args))} exited {proc.returncode}\n"
                             f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-4000:]}")
    return proc
