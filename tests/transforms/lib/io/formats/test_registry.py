"""The input-format seam: every place asks the registry, and a new format is one module and one row.

The source is read like tests/test_layers.py reads it: a suffix tested anywhere outside the format
modules fails here. A format built in this file (as a next format's module would be) goes through
listing, planning and reading with nothing else changed.
"""
import ast
import json
import pathlib
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rollout_relabel.transforms.core.reasons import Reason
from rollout_relabel.transforms.lib.errors import BadFile
from rollout_relabel.transforms.lib.io import formats, inputs, jsonl
from rollout_relabel.transforms.lib.io.formats import Format, jsonl_format
from rollout_relabel.transforms.lib.io.inputs import expand_inputs
from rollout_relabel.transforms.lib.io.plan import group_by_batch_sharing, read_footers
from rollout_relabel.transforms.lib.io.readers import read_table

ROOT = pathlib.Path(__file__).resolve().parents[5]
FORMATS_DIR = ROOT / "transforms/lib/io/formats"
SOURCE = ("transforms", "pipeline", "rollout_relabel", "schemas")


def _suffixes() -> set[str]:
    """Every suffix a format reads, and the last part of each (`.gz` of `.jsonl.gz`)."""
    known = set(formats.suffixes())
    return known | {"." + s.rsplit(".", 1)[-1] for s in known}


def suffix_tests(path: pathlib.Path, suffixes: set[str]) -> list[str]:
    """`line: text` of each place a file name's suffix is tested: a suffix given to endswith/removesuffix/
    len, compared with ==/in, or listed in a tuple, list or set. (A name the code writes, such as
    f"{step}.pt", tests nothing.)"""
    tree = ast.parse(path.read_text(), filename=str(path))

    def is_suffix(node) -> bool:
        return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.lower() in suffixes

    def flat(nodes):
        for node in nodes:
            yield from (node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node])

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in ("endswith", "removesuffix", "len") and any(is_suffix(a) for a in flat(node.args)):
                found.append(node)
        elif isinstance(node, ast.Compare) and any(is_suffix(c) for c in flat([node.left, *node.comparators])):
            found.append(node)
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)) and any(is_suffix(e) for e in node.elts):
            found.append(node)
    text = path.read_text()
    lines = sorted({n.lineno: ast.get_source_segment(text, n) for n in found}.items())
    return [f"{line}: {segment}" for line, segment in lines]


def test_no_suffix_is_tested_outside_the_format_modules():
    suffixes = _suffixes()
    offenders = {}
    for folder in SOURCE:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.is_relative_to(FORMATS_DIR):
                continue
            found = suffix_tests(path, suffixes)
            if found:
                offenders[str(path.relative_to(ROOT))] = found
    assert offenders == {}


def test_the_source_check_finds_a_suffix_test(tmp_path):
    """The check above can fail: each shape of suffix test that was in the source before the registry."""
    sample = tmp_path / "sample.py"
    sample.write_text('PT = (".pt", ".pth")\n'
                      'def f(path, ext):\n'
                      '    a = path.lower().endswith((".parquet", ".pq"))\n'
                      '    b = path[:-len(".jsonl.gz")]\n'
                      '    c = path.endswith(".gz")\n'
                      '    d = ext == ".jsonl"\n'
                      '    e = f"part-{path}.parquet"\n'  # a written name: not a test
                      '    return a, b, c, d, e\n')
    assert [line.split(":")[0] for line in suffix_tests(sample, _suffixes())] == ["1", "3", "4", "5", "6"]


@pytest.mark.parametrize(("name", "expected"), [
    ("a/b.pt", "pt"), ("b.PTH", "pt"), ("x/y.parquet", "parquet"), ("y.pq", "parquet"), ("z.jsonl", "jsonl"),
    ("z.JSONL.GZ", "jsonl"), ("d/rollout_data/3.pt", "miles-details"), ("d/rollout_data/eval_3.pt", "pt"),
    ("r/step_2/train/effective/traces.jsonl", "prime-rl"), ("step_2/train/all/traces.jsonl", "prime-rl"),
    ("z.json", None), ("z.gz", None), ("jsonl", None)])
def test_a_file_is_detected_by_the_first_row_that_claims_it(name, expected):
    found = formats.detect(name)
    assert (found.name if found else None) == expected


def test_an_unknown_file_is_refused_naming_it_and_what_is_read():
    with pytest.raises(BadFile) as refused:
        formats.format_of("dir/notes.txt")
    assert refused.value.reason == Reason.UNREADABLE_FILE
    assert refused.value.message == ("dir/notes.txt: unknown file type (expected .pt, .pth, .parquet, .pq, .jsonl, "
                                     ".jsonl.gz, miles-details files, roll files, prime-rl files, rllm files, "
                                     "skyrl files)")


def test_every_row_is_named_once_and_a_preset_row_reads_nothing():
    names = [f.name for f in formats.FORMATS]
    assert len(names) == len(set(names))
    assert formats.preset_names() == ("miles-details", "roll", "prime-rl", "slime", "miles", "verl", "areal", "nemo-rl",
                                      "trl", "rllm", "skyrl")
    # a preset row reads nothing, unless it reads its framework's own layout (found by its file-name pattern)
    assert all(f.read is None and not f.suffixes for f in formats.FORMATS if f.preset and f.matches is None)
    assert all(f.plan is not None for f in formats.FORMATS if f.read is not None)


def test_each_format_module_defines_one_row_and_the_registry_lists_every_module():
    modules = {p.stem for p in FORMATS_DIR.glob("*.py")} - {"__init__", "format"}
    assert sorted(_module_of(row) for row in formats.FORMATS) == sorted(modules)


def _module_of(row: Format) -> str:
    """The module whose FORMAT is this row."""
    for path in FORMATS_DIR.glob("*.py"):
        module = __import__(f"rollout_relabel.transforms.lib.io.formats.{path.stem}", fromlist=["FORMAT"])
        if getattr(module, "FORMAT", None) is row:
            return path.stem
    raise AssertionError(f"no module defines {row.name}")


# --- a next format through the seam: ROLL-like `rollout_dump_data.step_N.jsonl`, its step in its name, in a
# folder beside a companion `rollout_dump_data.meta.jsonl` that must never be read as rollouts
STEP_NAME = re.compile(r"rollout_dump_data\.step_(\d+)\.jsonl$")


def _step_dump(path: str) -> bool:
    return STEP_NAME.search(path.replace("\\", "/").rsplit("/", 1)[-1]) is not None


def _step_of(path: str):
    found = STEP_NAME.search(path)
    return int(found.group(1)) if found else None


def _companions(listing):
    return {p for p in listing if p.endswith("rollout_dump_data.meta.jsonl")}


STEPPED = Format("stepped", matches=_step_dump, read=jsonl_format.read, plan=jsonl_format.FORMAT.plan,
                 preset=("--semantics=group-index",), companions=_companions, step_from_name=_step_of)


@pytest.fixture
def with_stepped(monkeypatch):
    """The registry with the new row first (a pattern before the suffix it shares)."""
    monkeypatch.setattr(formats, "FORMATS", (STEPPED, *formats.FORMATS))


def _write_lines(path: pathlib.Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_a_new_format_is_listed_planned_and_read_through_its_row_alone(tmp_path, with_stepped):
    rows = [{"group_index": 0, "reward": 1.0}, {"group_index": 0, "reward": 0.0}]
    for step in (3, 4):
        _write_lines(tmp_path / f"rollout_dump_data.step_{step}.jsonl", rows)
    _write_lines(tmp_path / "rollout_dump_data.meta.jsonl", [{"note": "not rollouts"}])
    _write_lines(tmp_path / "other.jsonl", [dict(rows[0], step=4)])  # step 4 too: one batch with step_4

    files = expand_inputs([str(tmp_path)], str(tmp_path / "out"))
    assert [(pathlib.Path(f.path).name, f.output) for f in files] == [
        ("other.jsonl", "part-other.parquet"),
        ("rollout_dump_data.step_3.jsonl", "part-rollout_dump_data.step_3.parquet"),
        ("rollout_dump_data.step_4.jsonl", "part-rollout_dump_data.step_4.parquet")]
    assert [formats.detect(f.path).name for f in files] == ["jsonl", "stepped", "stepped"]

    footers = read_footers(files)
    assert [footers[f.path].steps for f in files] == [(4, 4), (3, 3), (4, 4)]
    one_pass, shuffled = group_by_batch_sharing(files, footers=footers)
    assert [[pathlib.Path(f.path).name for f in g] for g in one_pass] == [
        ["other.jsonl", "rollout_dump_data.step_4.jsonl"], ["rollout_dump_data.step_3.jsonl"]] and shuffled == []

    table, metadata = read_table(files[2].path)
    assert table.to_pylist() == [dict(r, step=4) for r in rows] and metadata["step"] == 4
    assert read_table(files[2].path, columns=["reward"])[0].column_names == ["reward"]
    assert read_table(files[0].path)[0].column("step").to_pylist() == [4]  # its own column, not a name's


def test_a_new_formats_preset_is_a_format_choice(with_stepped):
    from rollout_relabel.pipeline.formats import expand_format
    assert "stepped" in formats.preset_names()
    assert expand_format(["run", "--format", "stepped", "--input", "x"]) == [
        "--semantics=group-index", "run", "--input", "x"]


def test_a_step_in_the_name_never_replaces_a_step_column(tmp_path, with_stepped):
    path = tmp_path / "rollout_dump_data.step_5.jsonl"
    _write_lines(path, [{"step": 7, "reward": 1.0}])
    assert read_table(str(path))[0].column("step").to_pylist() == [7]
    found = read_footers(expand_inputs([str(path)], str(tmp_path / "out")))
    assert [f.steps for f in found.values()] == [(7, 7)]


def test_the_parquet_format_plans_from_the_footer_alone(tmp_path):
    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"step": pa.array([2, 5], pa.int64()), "reward": [1.0, 0.0]}), path)
    footer = formats.plan(str(path), path.stat().st_size, "step", 1 << 30)
    assert footer.steps == (2, 5) and footer.decoded_bytes == 2 * 8 + 2 * 8


def test_jsonl_is_gunzipped_by_its_suffix_only(tmp_path):
    import gzip
    (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress(b'{"reward": 1.0}\n'))
    assert read_table(str(tmp_path / "a.jsonl.gz"))[0].to_pylist() == [{"reward": 1.0}]
    (tmp_path / "b.jsonl").write_bytes(gzip.compress(b'{"reward": 1.0}\n'))  # compressed but not so named
    assert jsonl.malformed_lines(read_table(str(tmp_path / "b.jsonl"))[0]) != {}


def test_inputs_name_outputs_by_their_formats_suffix():
    assert inputs.output_name("r/a/b.jsonl.gz", "r/") == "part-a__b.parquet"
    assert inputs.output_name("r/a/b.PT", "r/") == "part-a__b.parquet"
    assert inputs.InputFile("r/a.b.pt", "part-a.b.parquet", 1, 0.0).name == "a.b"
