"""The package's shape: no import cycles, one export list, every catchable error exported."""

import ast
import inspect
from pathlib import Path

import replaygpu as rg
from replaygpu import errors
from replaygpu.service import status

PACKAGE = Path(rg.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _module_level_imports(tree: ast.Module, module: str, modules: set[str]) -> set[str]:
    """replaygpu modules ``module`` imports outside functions, type-checking imports included
    (a cycle hidden behind ``if TYPE_CHECKING`` is still two modules that need each other);
    ``from pkg import name`` counts as importing ``pkg.name`` when that is a module."""
    found: set[str] = set()
    stack: list[ast.AST] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.If, ast.Try)):
            for field in ("body", "orelse", "finalbody", "handlers"):
                stack.extend(getattr(node, field, []))
            continue
        if isinstance(node, ast.ExceptHandler):
            stack.extend(node.body)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                child = f"{node.module}.{alias.name}"
                found.add(child if child in modules else node.module)
    return {name for name in found if name in modules and name != module}


def _import_graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    modules = set(files)
    return {
        name: _module_level_imports(ast.parse(path.read_text()), name, modules)
        for name, path in files.items()
    }


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
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


def test_no_module_of_the_package_imports_itself_back_through_a_cycle():
    graph = _import_graph()
    assert graph.get("replaygpu.service.server")
    assert _find_cycle(graph) is None, " -> ".join(_find_cycle(graph) or [])


def test_the_cycle_finder_finds_a_cycle():
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set()}) is None


def test_every_exported_name_resolves_and_the_replaygpu_imports_are_the_one_list():
    for name in rg.__all__:
        assert getattr(rg, name) is not None, name
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    imported = [
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("replaygpu")
        for alias in node.names
    ]
    assert sorted(imported) == sorted(rg.__all__)


def test_internals_are_not_exported_but_stay_importable_from_their_modules():
    for name in ("batch_signature", "validate_batch", "resolve_device", "SumTree", "ReplayServer"):
        assert name not in rg.__all__ and not hasattr(rg, name), name
    from replaygpu.samplers.sum_tree import SumTree
    from replaygpu.service.server import ReplayServer
    from replaygpu.specs import batch_signature, validate_batch

    assert all(callable(x) for x in (SumTree, ReplayServer, batch_signature, validate_batch))


def test_every_error_a_caller_can_catch_is_exported():
    for module in (errors, status):
        for name, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, errors.ReplayError) and cls.__module__ == module.__name__:
                assert getattr(rg, name, None) is cls, f"rg.{name} is not exported"


def test_the_batch_keys_are_exported_as_constants():
    assert (rg.PRIORITIES, rg.IMPORTANCE_WEIGHTS, rg.MASK, rg.DISCOUNT, rg.NSTEP) == (
        "priorities",
        "importance_weights",
        "mask",
        "discount",
        "nstep",
    )


def test_the_wheel_installs_the_agents_under_replaygpu_and_marks_the_package_typed(tmp_path):
    import subprocess
    import sys
    import zipfile

    root = PACKAGE.parent
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
        "replaygpu/agents/learner.py",
        "replaygpu/py.typed",
    } <= names
    assert not any(name.startswith(("agents/", "tests/", "benchmarks/")) for name in names)
    metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
    text = zipfile.ZipFile(wheel).read(metadata).decode()
    assert "Requires-Dist: grpcio>=1.85.1" in text  # the generated code's floor
    assert "Requires-Dist: matplotlib" in text and 'extra == "demos"' in text
