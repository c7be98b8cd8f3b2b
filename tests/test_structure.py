"""The package's shape: imports point one way, with no circle, and the CLI only dispatches."""

import ast
import re
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


TASK_WORDS = re.compile(r"\bimages?\b|\btop-?[15]\b|\bclasses\b|num_classes|\blabels\b|\bpixels?\b", re.IGNORECASE)
TASK_AGNOSTIC = [
    "core/trainer.py", "core/checkpoint.py", "core/engine.py", "core/accounts.py", "loggers/console.py",
    "loggers/time_to_accuracy.py", "loggers/steps.py", "sweep.py", "report/bottleneck.py", "report/curves.py",
    "report/build.py",
]  # fmt: skip


def test_the_loop_and_its_outputs_name_nothing_of_a_task():
    """Images, top-1 and classes belong to the image task; the trainer, checkpoints, loggers, sweeps
    and reports speak of the task's inputs, targets and quality metric."""
    for relative in TASK_AGNOSTIC:
        text = (PACKAGE / relative).read_text()
        found = sorted({match.group(0) for match in TASK_WORDS.finditer(text)})
        assert not found, f"{relative} names {found}"
