import logging
import os
import shutil
import subprocess
import sys
import sysconfig

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


SOURCES = ("pyproject.toml", "README.md", "pipeline", "transforms", "schemas", "rollout_relabel")


@pytest.fixture(scope="session")
def installed(tmp_path_factory):
    """A venv with the project's wheel installed and nothing of the source tree reachable (built once a session:
    tests/pipeline/test_installed_package.py and tests/test_packaging.py use it)."""
    work = tmp_path_factory.mktemp("installed")
    source = work / "src"
    source.mkdir()
    for name in SOURCES:
        copy = shutil.copytree if os.path.isdir(os.path.join(ROOT, name)) else shutil.copy
        copy(os.path.join(ROOT, name), source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "-w", work / "wheel", source], check=True, capture_output=True)
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    site = next((venv / "lib").glob("python3*/site-packages"))
    # this venv's site-packages, and where its dependencies are when it shares another venv's (a .pth there)
    dependencies = dict.fromkeys([sysconfig.get_paths()["purelib"], os.path.dirname(os.path.dirname(pytest.__file__))])
    (site / "dependencies.pth").write_text("".join(f"{path}\n" for path in dependencies))
    wheel = next((work / "wheel").glob("rollout_relabel-*.whl"))
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", site, wheel],
                   check=True, capture_output=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"  # workers start as `python`
    return venv / "bin" / "python", env, site, work
