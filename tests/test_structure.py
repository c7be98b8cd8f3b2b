"""The package's shape: imports point one way, with no circle, and the CLI only dispatches."""

import ast
import dataclasses
import re
import typing
from pathlib import Path

import pytest
import yaml

from trainrun.algorithms.specs import SPECS
from trainrun.data.token_store import parse_python
from trainrun.schema import TrainConfig

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
        for node in ast.walk(parse_python(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("trainrun"):
                found |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
            elif isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
        graph[name] = {target for target in found if target in modules and target != name}
    return graph


def bench_imports() -> dict[str, set[str]]:
    """Each bench script's imports of the other bench scripts (they import each other by file name)."""
    scripts = {path.stem: path for path in (PACKAGE.parent / "bench").glob("*.py")}
    graph = {}
    for name, path in scripts.items():
        found = set()
        for node in ast.walk(parse_python(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                found.add(node.module)
            elif isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
        graph[name] = {target for target in found if target in scripts and target != name}
    return graph


@pytest.mark.parametrize("graph_of", [module_imports, bench_imports], ids=["trainrun", "bench"])
def test_no_import_circle(graph_of):
    graph = graph_of()
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        for target in sorted(graph[module]):
            assert target not in path, "import circle: " + " -> ".join([*path[path.index(target) :], target])
            if target not in done:
                visit(target, [*path, target])
        done.add(module)

    for module in sorted(graph):
        visit(module, [module])


def test_a_model_imports_no_method():
    """Models offer capabilities and methods ask for them (DESIGN.md): nothing under models/, specs
    included, imports a method or the methods' specs."""
    for module, targets in module_imports().items():
        if module.startswith("trainrun.models"):
            methods = {t for t in targets if t.startswith("trainrun.algorithms")}
            assert not methods, f"{module} imports {sorted(methods)}"


def test_core_imports_nothing_of_loggers_report_or_the_cli():
    for module, targets in module_imports().items():
        if module.startswith("trainrun.core"):
            outside = {t for t in targets if t.startswith(("trainrun.loggers", "trainrun.report", "trainrun.commands"))}
            assert not outside, f"{module} imports {sorted(outside)}"


def test_core_imports_no_config_task_data_model_or_output_code():
    """The trainer and its parts are given what they need: nothing in core reads the schema or a kind."""
    kinds = ("trainrun.schema", "trainrun.validation", "trainrun.tasks", "trainrun.data", "trainrun.models")
    kinds += ("trainrun.loggers", "trainrun.report", "trainrun.algorithms")
    for module, targets in module_imports().items():
        if module.startswith("trainrun.core"):
            outside = {t for t in targets if t.startswith(kinds)}
            assert not outside, f"{module} imports {sorted(outside)}"


MAX_FUNCTION_LINES, MAX_MODULE_LINES = 60, 450


def test_functions_and_modules_stay_short():
    """A function reads in one screen; a module does one job."""
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        source = path.read_text()
        name = path.relative_to(PACKAGE.parent)
        if len(source.splitlines()) > MAX_MODULE_LINES:
            long.append(f"{name}: {len(source.splitlines())} lines")
        for node in ast.walk(parse_python(source)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{name}:{node.lineno} {node.name}: {lines} lines")
    assert not long, f"over {MAX_FUNCTION_LINES} lines a function or {MAX_MODULE_LINES} a module:\n" + "\n".join(long)


def test_nothing_imports_the_entry_layer():
    """The commands call the rest of trainrun; nothing outside them calls a command."""
    importers = {
        module
        for module, targets in module_imports().items()
        if any(t == "trainrun.commands" or t.startswith("trainrun.commands.") for t in targets)
        and not module.startswith("trainrun.commands")
    }
    assert importers == {"trainrun.__main__"}


TASK_WORDS = re.compile(r"\bimages?\b|\btop-?[15]\b|\bclasses\b|num_classes|\blabels\b|\bpixels?\b", re.IGNORECASE)
TASK_AGNOSTIC = [
    "core/trainer.py", "core/checkpoint.py", "core/engine.py", "core/accounts.py", "loggers/console.py",
    "loggers/time_to_quality.py", "loggers/step_times.py", "commands/sweep.py", "core/bottleneck.py",
    "report/curves.py", "commands/report.py", "report/sections.py", "report/plots.py",
]  # fmt: skip


def test_the_loop_and_its_outputs_name_nothing_of_a_task():
    """Images, top-1 and classes belong to the image task; the trainer, checkpoints, loggers, sweeps
    and reports speak of the task's inputs, targets and quality metric."""
    for relative in TASK_AGNOSTIC:
        text = (PACKAGE / relative).read_text()
        found = sorted({match.group(0) for match in TASK_WORDS.finditer(text)})
        assert not found, f"{relative} names {found}"


def schema_default(config: type, keys: tuple[str, ...]) -> object:
    """The schema's default at ``keys`` under dataclass ``config`` (MISSING if it has none)."""
    value: object = config
    for key in keys:
        spec = {f.name: f for f in dataclasses.fields(value)}.get(key)
        if spec is None:
            return dataclasses.MISSING
        value = spec.default_factory() if spec.default_factory is not dataclasses.MISSING else spec.default
        if key != keys[-1] and not dataclasses.is_dataclass(value):
            return dataclasses.MISSING
    return value


def yaml_values(data: dict, prefix: tuple[str, ...] = ()):
    for key, value in data.items():
        if key == "defaults":
            continue
        if isinstance(value, dict) and value:
            yield from yaml_values(value, (*prefix, key))
        else:
            yield (*prefix, key), value


def test_every_default_is_written_once_in_the_schema():
    """conf/ options state only how they differ from the schema; config.yaml states no value at all.

    Recipes are exempt: each restates its published values so that it reads alone.
    """
    conf = PACKAGE.parent / "conf"
    primary = yaml.safe_load((conf / "config.yaml").read_text())
    assert set(primary) == {"defaults", "hydra"}, "conf/config.yaml sets values: they belong in the schema"
    restated = []
    for path in sorted(conf.rglob("*.yaml")):
        relative = path.relative_to(conf)
        if relative.parts[0] in ("recipe", "hydra") or len(relative.parts) == 1:
            continue
        group = relative.parts[0]
        for keys, value in yaml_values(yaml.safe_load(path.read_text()) or {}):
            if group == "algorithms":
                default = schema_default(SPECS[keys[0]].config, keys[1:]) if len(keys) > 1 else None
            else:
                default = schema_default(TrainConfig, (group, *keys))
            if value == default and not dataclasses.is_dataclass(default):
                restated.append(f"{relative}: {'.'.join(keys)} = {value!r}")
    assert not restated, "defaults written in conf/ as well as in the schema:\n" + "\n".join(restated)


def test_a_built_in_corpus_holds_out_what_write_text_holds_out():
    from trainrun.data.token_store import TEXT_VAL_FRACTION

    for path in (PACKAGE.parent / "conf" / "data").glob("*.yaml"):
        option = yaml.safe_load(path.read_text()) or {}
        if (option.get("text") or {}).get("corpus"):
            assert option["val_fraction"] == TEXT_VAL_FRACTION, path.name


# strings that look like keys and are not: file names, Hugging Face weight names, MLflow's names, attributes
NOT_KEYS = {
    "model.pt", "auto.json", "progress.json", "mlflow.json", "mlflow.db", "wandb.json", "mlflow.source.name",
    "model.layers", "model.norm.weight", "model.embed_tokens.weight", "model.blocks", "task.fields", "task.description",
    "model.safetensors", "model.safetensors.index.json",
    "mlflow.store.db.utils", "mlflow.utils.async_logging.async_logging_queue",
}  # fmt: skip


def _is_key(path: list[str]) -> bool:
    """Whether ``path`` (``["data", "shards", "tokenizer"]``) names a setting of the schema."""
    section: type = TrainConfig
    for depth, name in enumerate(path):
        if not dataclasses.is_dataclass(section) or name not in {field.name for field in dataclasses.fields(section)}:
            return False
        section = typing.get_type_hints(section)[name]
        if typing.get_origin(section) is dict:  # an open section (model.config): its keys are the user's
            return True
        if not dataclasses.is_dataclass(section):
            return depth == len(path) - 1
    return True


def test_every_key_a_message_names_exists():
    """A message that tells the user to set a key (``set data.shards.tokenizer``) names one the schema
    has: every dotted name under a config section in trainrun's strings (docstrings aside) resolves."""
    sections = sorted(field.name for field in dataclasses.fields(TrainConfig) if field.name != "algorithms")
    dotted = re.compile(rf"(?<![\w./-])((?:{'|'.join(sections)})(?:\.[a-z_][a-z0-9_]*)+)")
    named = set()
    for path in PACKAGE.rglob("*.py"):
        tree = parse_python(path.read_text())
        documented = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, documented) and ast.get_docstring(node)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                named |= {(match, path.name) for match in dotted.findall(node.value)}
    unknown = sorted((key, file) for key, file in named if key not in NOT_KEYS and not _is_key(key.split(".")))
    assert not unknown
    assert len(named) > 50  # the scan sees the messages
