"""The reason codes have one source, transforms/core/reasons.py: no reason is spelled anywhere else in the
source, each code and text map one to one, and the contract's table documents every dead-letter reason."""
import re
from pathlib import Path

from rollout_relabel.transforms.core.reasons import CODE, OK, REASONS, Reason
from tests.conftest import ROOT

SOURCE_FOLDERS = ("transforms", "pipeline", "rollout_relabel", "schemas", "bench")
REGISTRY = Path(ROOT) / "transforms" / "core" / "reasons.py"


def spelled(text: str) -> list[str]:
    """Every reason written as a string literal ('x' or "x") in Python source."""
    names = "|".join(re.escape(r.value) for r in Reason)
    return [m.group(2) for m in re.finditer(rf"""(['"])({names})\1""", text)]


def test_codes_and_texts_map_one_to_one():
    assert REASONS[OK] == "" and len(set(REASONS)) == len(REASONS) == len(Reason) + 1
    assert all(REASONS[CODE[reason]] == reason for reason in Reason)
    assert all(isinstance(reason, str) and reason == reason.value for reason in Reason)  # written as its text
    assert "-".join(Reason.MALFORMED_LINE.name.lower().split("_")) == Reason.MALFORMED_LINE


def test_the_literal_finder_finds_both_quotes():
    assert spelled("""flag(p, 'empty-file') or BadFile("unreadable-file", m) + "empty-file-x" """) == [
        "empty-file", "unreadable-file"]


def test_no_reason_is_spelled_outside_the_registry():
    found = []
    for folder in SOURCE_FOLDERS:
        for path in sorted((Path(ROOT) / folder).rglob("*.py")):
            if path == REGISTRY or any(part.startswith(".") or part in ("data", "out") for part in path.parts):
                continue
            found += [f"{path.relative_to(ROOT)}: {name!r}" for name in spelled(path.read_text())]
    assert not found, "use Reason.X from transforms/core/reasons.py: " + ", ".join(found)


def test_the_contract_documents_every_reason():
    semantics = (Path(ROOT) / "docs" / "semantics.md").read_text()
    section = semantics.split("\n## Bad input\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([a-z0-9-]+)` \|", section, re.M)
    assert sorted(rows) == sorted({r.value for r in Reason} - {Reason.UNIFORM_GROUP})  # each once
    assert f"reason `{Reason.UNIFORM_GROUP}`" in section
