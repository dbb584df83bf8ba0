"""What the quarantine's tests share: resolve a pinned dotted name in the installed libraries, and read
from a module's source every name it takes past a public API."""
from __future__ import annotations

import ast
import importlib
import pathlib

# The Beam API the quarantine may use without pinning: what a pipeline author writes
PUBLIC = ("apache_beam", "apache_beam.pvalue", "apache_beam.pipeline.PipelineVisitor",
          "apache_beam.runners.runner.PipelineState")
# Underscore names the Python documentation gives as public
DOCUMENTED = ("os._exit",)


def resolve(dotted: str, instances: dict | None = None):
    """The object a dotted name denotes: the longest importable module prefix, then attributes. An
    attribute only instances carry (set in __init__) is looked up on instances[class]()."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        break
    else:
        raise ImportError(dotted)
    for name in parts[cut:]:
        if not hasattr(found, name) and isinstance(found, type) and instances and found in instances:
            found = instances[found]()
        found = getattr(found, name)
    return found


def is_module(dotted: str) -> bool:
    try:
        importlib.import_module(dotted)
    except ImportError:
        return False
    return True


def private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def names_used(path: pathlib.Path) -> tuple[set[str], set[str]]:
    """(dotted names a module takes from outside the project past PUBLIC, private attributes it reads
    on objects it did not import by name (e.g. `side._view_options`, only the attribute is known))."""
    tree = ast.parse(path.read_text())
    aliases: dict[str, str] = {}  # local name -> dotted name it was imported as
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                aliases[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else \
                    alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    project = {local for local, dotted in aliases.items() if dotted.startswith(("rollout_relabel", "__future__"))}
    used, loose = set(), set()
    for dotted in aliases.values():  # a module imported by name counts by the attributes read from it
        if dotted.startswith("apache_beam") and dotted not in PUBLIC and not is_module(dotted):
            used.add(dotted)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        base = node.value
        if isinstance(base, ast.Name) and base.id in aliases and base.id not in project:
            dotted = f"{aliases[base.id]}.{node.attr}"
            if aliases[base.id] not in PUBLIC and (dotted.startswith("apache_beam") or private(node.attr)):
                used.add(dotted)
        elif private(node.attr) and not (isinstance(base, ast.Name) and base.id in ("self", "cls")):
            loose.add(node.attr)
    return used - set(DOCUMENTED), loose


def check_pinned(path: pathlib.Path, pinned: tuple[str, ...], instances: dict | None = None) -> None:
    """Every name pinned exists in the installed libraries, and every name the module uses is pinned."""
    for name in pinned:
        resolve(name, instances)  # raises ImportError / AttributeError naming what moved
    used, loose = names_used(path)
    assert sorted(used - set(pinned)) == [], f"{path.name} uses these without pinning them"
    last = {name.rsplit(".", 1)[1] for name in pinned}
    assert sorted(loose - last) == [], f"{path.name} reads these private attributes without pinning them"
    stale = {n for n in pinned if n not in used and n.rsplit(".", 1)[1] not in loose}
    assert sorted(stale) == [], f"{path.name} pins names it no longer uses"
