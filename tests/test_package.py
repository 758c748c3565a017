"""The package's shape: no import cycles, one export list, every catchable error exported."""

import ast
import importlib
import inspect
import itertools
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

import replaygpu as rg
from replaygpu import errors
from replaygpu.keys import DISCOUNT, IMPORTANCE_WEIGHTS, MASK, NSTEP, PRIORITIES
from replaygpu.service.wire import status

PACKAGE = Path(rg.__file__).parent
ROOT = PACKAGE.parent
# agents/ installs as replaygpu.agents (pyproject's package-dir), so its modules are named so
SOURCES = {PACKAGE: "replaygpu", ROOT / "agents": "replaygpu.agents"}


def _module_name(path: Path) -> str:
    folder = next(folder for folder in SOURCES if path.is_relative_to(folder))
    parts = path.relative_to(folder).with_suffix("").parts
    return ".".join([SOURCES[folder], *(parts[:-1] if parts[-1] == "__init__" else parts)])


def _imports(tree: ast.Module, module: str, modules: set[str], is_package: bool) -> dict[str, int]:
    """``{package module: line of its first import}`` for every import in ``module``'s source:
    in function, method and class bodies, under ``if TYPE_CHECKING`` and in ``try`` blocks alike
    (a cycle hidden behind a deferred import is still two modules that need each other), relative
    imports resolved. ``from pkg import name`` counts as importing ``pkg.name`` when that is a
    module, else ``pkg``; importing a package counts as importing its ``__init__``."""
    package = module if is_package else module.rpartition(".")[0]
    found: dict[str, int] = {}
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                child = f"{base}.{alias.name}"
                names.append(child if child in modules else base)
        for name in names:
            if name in modules and name != module:
                found.setdefault(name, node.lineno)
    return found


def _import_graph() -> dict[str, dict[str, int]]:
    """``{module: {module it imports: line}}`` over replaygpu/ and agents/."""
    files = {_module_name(p): p for folder in SOURCES for p in folder.rglob("*.py")}
    modules = set(files)
    return {
        name: _imports(ast.parse(path.read_text()), name, modules, path.stem == "__init__")
        for name, path in files.items()
    }


def _find_cycle(graph: Mapping[str, Iterable[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def _find_cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """One cycle for each knot of modules that import each other (strongly connected set), so a
    failure names every knot to untie, not just the first."""
    reach = {node: _reachable(graph, node) for node in graph}
    knots = {frozenset(n for n in reach[node] if node in reach[n]) for node in graph}
    cycles = []
    for knot in knots:
        inside = {node: [n for n in graph[node] if n in knot] for node in knot}
        if cycle := _find_cycle(inside):
            cycles.append(cycle)
    return sorted(cycles)


def _reachable(graph: Mapping[str, Iterable[str]], start: str) -> set[str]:
    seen, stack = {start}, [start]
    while stack:
        for nxt in graph[stack.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return seen


def _describe(cycle: list[str], graph: dict[str, dict[str, int]]) -> str:
    steps = [f"{a} (line {graph[a][b]}) -> {b}" for a, b in itertools.pairwise(cycle)]
    return "\n  ".join(steps)


def test_no_module_of_the_package_imports_itself_back_through_a_cycle():
    graph = _import_graph()
    assert graph.get("replaygpu.service.server.server") and graph.get("replaygpu.agents.dqn.agent")
    cycles = _find_cycles(graph)
    assert not cycles, f"{len(cycles)} import cycles:\n" + "\n".join(
        f"- {' -> '.join(cycle)}\n  {_describe(cycle, graph)}" for cycle in cycles
    )


def test_the_cycle_finder_finds_a_cycle():
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set()}) is None
    two = {"a": {"b"}, "b": {"a", "c"}, "c": {"d"}, "d": {"c"}, "e": {"a"}}
    assert _find_cycles(two) == [["a", "b", "a"], ["c", "d", "c"]]


def test_the_import_graph_counts_imports_inside_functions_classes_and_relative_ones():
    source = """
import os
from typing import TYPE_CHECKING
if TYPE_CHECKING:
    from replaygpu.specs import Spec
def f():
    import replaygpu.errors
class C:
    from replaygpu.service.wire import status
    def g(self):
        from . import outbox
        from ...samplers.uniform import Uniform
        from ... import keys
"""
    modules = {
        "replaygpu",
        "replaygpu.specs",
        "replaygpu.errors",
        "replaygpu.keys",
        "replaygpu.service",
        "replaygpu.service.wire.status",
        "replaygpu.service.actor",
        "replaygpu.service.actor.outbox",
        "replaygpu.service.actor.client",
        "replaygpu.samplers",
        "replaygpu.samplers.uniform",
    }
    found = _imports(ast.parse(source), "replaygpu.service.actor.client", modules, is_package=False)
    not_imported = {
        "replaygpu",
        "replaygpu.service",
        "replaygpu.service.actor",
        "replaygpu.service.actor.client",
        "replaygpu.samplers",
    }
    assert set(found) == modules - not_imported
    assert found["replaygpu.errors"] == 7  # the function-level import, with its line
    init = ast.parse("from . import outbox\nfrom ... import x")  # in service/actor/__init__.py
    from_init = _imports(init, "replaygpu.service.actor", modules, is_package=True)
    assert set(from_init) == {"replaygpu.service.actor.outbox", "replaygpu"}


def test_the_lazy_exports_and_the_type_checking_imports_are_the_same_list():
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    (block,) = [n for n in tree.body if isinstance(n, ast.If) and n.test.id == "TYPE_CHECKING"]
    imported = {
        alias.asname or alias.name: node.module for node in block.body for alias in node.names
    }
    assert imported == rg._EXPORTS
    assert rg.__all__ == [*rg._EXPORTS, "__version__"]
    for name, module in rg._EXPORTS.items():
        assert getattr(rg, name) is getattr(importlib.import_module(module), name), name


def test_the_top_level_is_a_small_core_and_the_rest_lives_in_its_modules():
    assert len(rg.__all__) <= 16, rg.__all__
    moved = ("SequenceLedger", "learner_step", "specs_from_env", "BatchError", "PRIORITIES")
    for name in (*moved, "UniformSampler", "SumTree", "ReplayServer", "batch_signature"):
        assert name not in rg.__all__ and not hasattr(rg, name), name
    from replaygpu.keys import PRIORITIES
    from replaygpu.samplers.sum_tree import SumTree
    from replaygpu.service.server.ledger import SequenceLedger
    from replaygpu.service.server.server import ReplayServer
    from replaygpu.specs import batch_signature, specs_from_env

    assert all(callable(x) for x in (SumTree, ReplayServer, batch_signature, specs_from_env))
    assert callable(SequenceLedger) and PRIORITIES == "priorities"


def test_importing_replaygpu_and_its_error_modules_does_not_import_tensorflow():
    code = (
        "import sys, replaygpu, replaygpu.errors, replaygpu.service.wire.status, replaygpu.keys\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] == 'tensorflow')\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_every_error_a_caller_can_catch_lives_in_errors_or_the_service_status_module():
    """`replaygpu.errors` holds the library's errors and names the service's home."""
    for module in (errors, status):
        for name, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, errors.ReplayError) and cls.__module__ == module.__name__:
                assert name in errors.__doc__, f"replaygpu.errors' docstring omits {name}"


def test_the_batch_keys_are_constants():
    assert (PRIORITIES, IMPORTANCE_WEIGHTS, MASK, DISCOUNT, NSTEP) == (
        "priorities",
        "importance_weights",
        "mask",
        "discount",
        "nstep",
    )


def test_the_wheel_installs_the_agents_under_replaygpu_and_marks_the_package_typed(tmp_path):
    import shutil
    import zipfile

    # a copy of the sources: setuptools builds in the tree and reuses its build/ folder, which
    # keeps modules moved or deleted since (they would ship in the wheel)
    root = tmp_path / "src"
    root.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, root / name)
    for name in ("replaygpu", "agents"):
        shutil.copytree(ROOT / name, root / name, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path), str(root)],
        check=True,
        capture_output=True,
        timeout=300,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("replaygpu-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {
        "replaygpu/agents/demos.py",
        "replaygpu/agents/distributed/learner.py",
        "replaygpu/py.typed",
    } <= names
    assert not any(name.startswith(("agents/", "tests/", "benchmarks/")) for name in names)
    # pyproject lists the packages one by one: a subpackage left off it is missing here
    modules = {path.relative_to(ROOT).as_posix() for path in PACKAGE.rglob("*.py")}
    shipped = {name for name in names if name.endswith(".py") and "/agents/" not in name}
    assert shipped == modules, f"missing: {modules - shipped}, extra: {shipped - modules}"
    # the agents add their subcommands through entry points (replaygpu.cli.COMMAND_GROUP)
    entries = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "[replaygpu.commands]\nactor = replaygpu.agents.distributed.actor_cli" in (
        zipfile.ZipFile(wheel).read(entries).decode()
    )
    metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
    text = zipfile.ZipFile(wheel).read(metadata).decode()
    assert "Requires-Dist: grpcio>=1.85.1" in text  # the generated code's floor
    assert "Requires-Dist: matplotlib" in text and 'extra == "demos"' in text
    # what the package index shows: classifiers, project URLs (one repository), authors
    assert "Classifier: Programming Language :: Python :: 3.11" in text
    assert "Project-URL: Source, https://github.com/replaygpu/replaygpu" in text
    assert "Author: The replaygpu authors" in text or "Author-email:" in text


#: extras whose floors must resolve with the base dependencies (gpu shares cpu's TensorFlow
#: floor; test pins tools)
RESOLVED_EXTRAS = ("cpu", "demos", "ray", "atari")


def _tomllib():
    import pytest

    return pytest.importorskip("tomllib", reason="tomllib (Python >= 3.11) reads pyproject.toml")


def _floors(python: str) -> dict[str, str]:
    """``{distribution: lowest allowed version}`` of pyproject's dependencies and
    `RESOLVED_EXTRAS` that apply on Linux x86-64 with ``python``."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    project = _tomllib().loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [(r, "") for r in project["dependencies"]]
    wanted += [(r, x) for x in RESOLVED_EXTRAS for r in project["optional-dependencies"][x]]
    floors = {}
    for text, extra in wanted:
        req = Requirement(text)
        env = {"sys_platform": "linux", "platform_machine": "x86_64", "python_version": python}
        if req.marker is not None and not req.marker.evaluate({**env, "extra": extra}):
            continue
        lows = [s.version for s in req.specifier if s.operator in (">=", "==")]
        assert lows, f"{text}: no floor (>=) to resolve at"
        floors[canonicalize_name(req.name)] = lows[0]
    return floors


def test_the_dependency_floors_resolve_together(tmp_path):
    """A resolver asked for the lowest version of every direct dependency (uv's
    ``--resolution lowest-direct``, Linux x86-64, the lowest Python the package supports) gets
    each one's floor: a dependency that comes out higher has a floor that cannot be installed
    together with the others (``tensorflow-cpu>=2.17`` beside ``protobuf>=7.35.1`` did: TF 2.17
    wants protobuf < 5)."""
    import os
    import urllib.request

    import pytest
    from packaging.utils import canonicalize_name
    from packaging.version import Version

    index = os.environ.get("UV_DEFAULT_INDEX") or os.environ.get("UV_INDEX_URL")
    index = index or "https://pypi.org/simple"
    try:
        urllib.request.urlopen(index.rstrip("/") + "/protobuf/", timeout=15).close()
    except OSError as err:
        pytest.skip(f"the package index {index} is unreachable ({err}); nothing to resolve from")
    project = _tomllib().loads((ROOT / "pyproject.toml").read_text())["project"]
    python = project["requires-python"].removeprefix(">=")
    extras = [arg for extra in RESOLVED_EXTRAS for arg in ("--extra", extra)]
    proc = subprocess.run(
        [sys.executable, "-m", "uv", "pip", "compile", str(ROOT / "pyproject.toml"), *extras,
         "--resolution", "lowest-direct", "--python-version", python,
         "--python-platform", "x86_64-manylinux_2_28", "--no-annotate", "--no-header",
         "--output-file", str(tmp_path / "lowest.txt")],
        capture_output=True,
        text=True,
        timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, f"the floors do not resolve:\n{proc.stderr[-3000:]}"
    pins = [line.split("==") for line in (tmp_path / "lowest.txt").read_text().splitlines()]
    resolved = {canonicalize_name(p[0].split("[")[0]): p[1] for p in pins if len(p) == 2}
    floors = _floors(python)
    # a floor names a release (4.8), the resolver the first published one under it (4.8.0.76)
    above = {
        name: f"floor {low}, resolved {resolved.get(name)}"
        for name, low in floors.items()
        if name not in resolved
        or Version(resolved[name]).release[: len(Version(low).release)] != Version(low).release
    }
    assert not above, f"floors that cannot be met together (raise them): {above}"
