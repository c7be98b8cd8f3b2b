"""The package's shape: imports point one way, with no circle, and the CLI only dispatches."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "trainrun"


def module_imports() -> dict[str, set[str]]:
    """Each trainrun module's imports of other trainrun modules, module-level and inside functions."""
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("trainrun"):
                found |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
            elif isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
        graph[name] = {target for target in found if target in modules and target != name}
    return graph


def test_no_import_circle():
    graph = module_imports()
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        for target in sorted(graph[module]):
            assert target not in path, "import circle: " + " -> ".join([*path[path.index(target) :], target])
            if target not in done:
                visit(target, [*path, target])
        done.add(module)

    for module in sorted(graph):
        visit(module, [module])


def test_core_imports_nothing_of_loggers_report_or_the_cli():
    for module, targets in module_imports().items():
        if module.startswith("trainrun.core"):
            outside = {t for t in targets if t.startswith(("trainrun.loggers", "trainrun.report", "trainrun.cli"))}
            assert not outside, f"{module} imports {sorted(outside)}"


def test_nothing_imports_the_cli():
    importers = [module for module, targets in module_imports().items() if "trainrun.cli" in targets]
    assert importers == ["trainrun.__main__"]
