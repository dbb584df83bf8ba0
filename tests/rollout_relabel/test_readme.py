"""The README's Python API examples run, and print what their comments say (so they never rot)."""
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT

EXAMPLE_1_ADVANTAGES = "[-0.5, 0.5, 0.5, 0.5, -1.0, -1.0, 1.0]"


def python_api_examples() -> list[str]:
    """The ```python blocks of the README's "Python API" section, in order."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as handle:
        readme = handle.read()
    section = readme.split("\n## Python API\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)


def run(code: str) -> list[str]:
    """The example's stdout lines, run as a user would: a fresh interpreter in the repository root."""
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout.splitlines()


def test_there_are_two_examples():
    examples = python_api_examples()
    assert len(examples) == 2
    assert "rollout_relabel.relabel(" in examples[0] and "RelabelRollouts(" in examples[1]


@pytest.mark.parametrize("index", [0, 1], ids=["in-memory", "beam"])
def test_example_prints_the_worked_example(index):
    code = python_api_examples()[index]
    printed = run(code)
    assert EXAMPLE_1_ADVANTAGES in printed
    # a print's trailing comment is the line it prints
    promised = [line.split("#", 1)[1].strip() for line in code.splitlines() if line.startswith("print(")]
    assert [line.strip() for line in printed if line.strip() in promised] == promised
