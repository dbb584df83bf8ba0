"""Dependencies point one way: numeric core <- pure layer <- Beam stages <- CLI (read from the import graph).

Every import counts, also one inside a function.
"""
import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent


def imports(path: pathlib.Path) -> set[str]:
    """Absolute module names a file imports (relative imports resolved against its package)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1]) if path.is_relative_to(ROOT) else ""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                found.add(f"{base}.{node.module}" if node.module else base)
            else:
                found.add(node.module)
    return found


def modules(folder: str, recursive: bool = True) -> list[pathlib.Path]:
    pattern = "**/*.py" if recursive else "*.py"
    return sorted((ROOT / folder).glob(pattern))


def offending(files, forbidden, allowed=()) -> dict[str, list[str]]:
    """file -> the imports it must not have (a forbidden prefix, unless an allowed one)."""
    def under(name, prefixes):
        return any(name == p or name.startswith(p + ".") for p in prefixes)
    bad = {}
    for path in files:
        names = sorted(n for n in imports(path) if under(n, forbidden) and not under(n, allowed))
        if names:
            bad[str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)] = names
    return bad


def test_the_numeric_core_imports_neither_beam_nor_arrow_nor_anything_above_it():
    assert offending(modules("transforms/core"), ("apache_beam", "pyarrow", "pipeline", "schemas", "transforms"),
                     allowed=("transforms.core",)) == {}


def test_the_pure_layer_builds_no_pipeline_and_imports_no_stage():
    lib = [p for p in modules("transforms/lib") if p.name != "filesystem.py"]
    assert offending(lib, ("apache_beam", "pipeline", "transforms", "rollout_relabel"),
                     allowed=("transforms.core", "transforms.lib")) == {}


def test_only_the_filesystem_module_reaches_beam_and_only_its_filesystems():
    assert offending([ROOT / "transforms/lib/filesystem.py"], ("apache_beam", "pipeline", "transforms"),
                     allowed=("apache_beam.io.filesystem", "apache_beam.io.filesystems",
                              "apache_beam.io.localfilesystem")) == {}


def test_stages_never_import_the_cli_layer():
    assert offending(modules("transforms"), ("pipeline", "rollout_relabel")) == {}
    assert offending(modules("schemas"), ("pipeline", "transforms", "apache_beam", "rollout_relabel")) == {}


def test_the_check_sees_function_level_imports(tmp_path):
    # a check that missed imports inside functions would pass a module that hides one there
    hidden = tmp_path / "hidden.py"
    hidden.write_text("import numpy\n\ndef f():\n    from pipeline.run import run\n")
    assert imports(hidden) == {"numpy", "pipeline.run"}
    assert offending([hidden], ("pipeline",)) == {str(hidden): ["pipeline.run"]}


def test_the_public_package_reaches_beam_only_in_its_beam_module():
    plain = [p for p in modules("rollout_relabel") if p.name != "beam.py"]
    assert offending(plain, ("apache_beam", "pipeline", "transforms.lib.filesystem", "transforms.lib.readers")) == {}


def test_the_reward_hooks_reach_neither_arrow_nor_beam():
    # they run inside the trainer: numpy and the numeric core only (a fresh interpreter checks sys.modules too,
    # tests/rollout_relabel/test_hooks.py)
    hooks = modules("rollout_relabel/hooks") + [ROOT / "transforms/lib/sample_core.py",
                                                ROOT / "transforms/lib/dead_messages.py"]
    assert offending(hooks, ("apache_beam", "pyarrow", "schemas", "pipeline", "transforms", "rollout_relabel"),
                     allowed=("transforms.core", "transforms.lib.sample_core", "transforms.lib.dead_messages",
                              "rollout_relabel.hooks")) == {}
