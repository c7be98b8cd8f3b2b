"""Tasks, models and data sources as specs: each kind has one home, and nothing else names it."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.util
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from trainrun import kinds
from trainrun.algorithms.specs import SPECS
from trainrun.errors import ConfigError
from trainrun.kinds import Capability, KindSpec, TaskSpec
from trainrun.python_parsing import parse_python
from trainrun.validation import validate

PACKAGE = Path(__file__).resolve().parent.parent / "trainrun"
KINDS = ("task", "model", "data")


def test_every_spec_is_a_spec_of_its_kind_and_builds_from_a_module_of_its_own_package():
    for kind in KINDS:
        package = kinds.KIND_PACKAGES[kind].removesuffix(".specs")
        for name, spec in kinds.specs(kind).items():
            assert isinstance(spec, TaskSpec if kind == "task" else KindSpec) and spec.name == name
            module = spec.builder.partition(":")[0]
            assert module.startswith(package + "."), (kind, name, module)
            assert importlib.util.find_spec(module) is not None, (kind, name, module)


def test_every_task_has_data_and_a_model_that_speak_its_batches_and_every_data_and_model_a_task():
    tasks = {spec.batches for spec in kinds.specs("task").values()}
    for kind in ("data", "model"):
        spoken = {spec.batches for spec in kinds.specs(kind).values()}
        assert spoken == tasks, (kind, spoken ^ tasks)


def test_every_capability_is_offered_by_some_kind_and_needed_by_some_method_or_check():
    offered = set().union(*(spec.offers for kind in KINDS for spec in kinds.specs(kind).values()))
    assert offered == set(Capability)
    needed = set().union(*(spec.needs for spec in SPECS.values()))
    # alibi's and sample's; Muon's; parallel.activation_checkpointing's; a sharded run's meta-device
    # build; sweep folds= and ensemble
    read_elsewhere = {
        Capability.CAUSAL_SEQUENCES,
        Capability.HIDDEN_MATRICES,
        Capability.TRANSFORMER_BLOCKS,
        Capability.META_INIT,
        Capability.FOLDS,
    }
    assert needed | read_elsewhere == set(Capability)


def test_a_method_applies_where_the_run_offers_what_it_needs():
    image = OmegaConf.create({})
    gpt = OmegaConf.create({"task": {"name": "causal_lm"}, "data": {"name": "token_stream"}, "model": {"name": "gpt"}})
    assert kinds.offers(validate(image, files=False)) >= {Capability.CLASS_IMAGES, Capability.CONVOLUTIONS}
    assert SPECS["window_warmup"].applies_to(kinds.offers(validate(gpt, files=False)))
    language, dense = kinds.tasks_offering({Capability.ALIBI}), kinds.tasks_offering({Capability.CONVOLUTIONS})
    assert {"causal_lm", "masked_lm"} <= set(language) and "image_classification" not in language
    assert {"image_classification", "segmentation"} <= set(dense) and "masked_lm" not in dense
    assert kinds.tasks_offering(set()) == list(kinds.specs("task"))


def test_a_method_the_task_has_but_the_model_does_not_names_what_it_needs(monkeypatch):
    no_convnet = dataclasses.replace(kinds.specs("model")["resnet_small"], offers=frozenset())
    monkeypatch.setitem(kinds.specs("model"), "resnet_small", no_convnet)
    with pytest.raises(ConfigError) as error:
        validate(OmegaConf.create({"algorithms": {"blurpool": {}}}), files=False)
    assert str(error.value).startswith(
        f"algorithm 'blurpool' needs {Capability.IMAGE_CONVNET.value}, which data=digits with model=resnet_small "
        "does not offer; choose from: colout, cutmix, ema,"
    )


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"data": {"name": "text"}}, "bad value for 'task.name': 'image_classification' (with data=text it must be"),
        ({"model": {"name": "gpt"}}, "bad value for 'task.name': 'image_classification' (with model=gpt it must be"),
        (
            {"task": {"name": "causal_lm"}, "data": {"name": "text"}},
            "bad value for 'data.name': 'text' "
            "(with task=causal_lm it must be token_stream or token_mix or token_shards)",
        ),
        (
            {"task": {"name": "segmentation"}, "model": {"name": "unet"}},
            "bad value for 'data.name': 'digits' (with task=segmentation it must be synthetic_brats or decathlon)",
        ),
    ],
)
def test_the_kind_the_user_chose_is_the_one_the_others_must_suit(settings, message):
    with pytest.raises(ConfigError) as error:
        validate(OmegaConf.create(settings), files=False)
    assert str(error.value).startswith(message)


def registered_names() -> dict[str, dict[str, set[str]]]:
    """Each registered name and the files allowed to name it: its spec's module and its builder's."""
    found: dict[str, dict[str, set[str]]] = {}
    for kind in KINDS:
        package = kinds.KIND_PACKAGES[kind]
        for module in Path(importlib.import_module(package).__path__[0]).glob("[!_]*.py"):
            for spec in importlib.import_module(f"{package}.{module.stem}").SPECS:
                home = {
                    str(module.relative_to(PACKAGE.parent)),
                    spec.builder.partition(":")[0].replace(".", "/") + ".py",
                }
                found.setdefault(spec.name, {}).setdefault(kind, set()).update(home)
    return found


def branches_on(tree: ast.AST) -> set[str]:
    """The strings a module compares a ``.name`` with (``x.name == "gpt"``, ``x.name in ("a", "b")``)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        if not any(isinstance(side, ast.Attribute) and side.attr == "name" for side in sides):
            continue
        for side in sides:
            for constant in ast.walk(side):
                if isinstance(constant, ast.Constant) and isinstance(constant.value, str):
                    found.add(constant.value)
    return found


def test_no_module_branches_on_another_kinds_name():
    """A task, model or data source's name is compared with only in its own module and spec: what
    a run does for a kind is read from the kind's spec, never from a test of its name elsewhere."""
    homes = registered_names()
    spelled = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = str(path.relative_to(PACKAGE.parent))
        for name in branches_on(parse_python(path.read_text())) & set(homes):
            if not any(relative in files for files in homes[name].values()):
                spelled.append(f"{relative} branches on '{name}'")
    assert not spelled, "\n".join(spelled)


def test_the_name_check_catches_a_branch_on_a_kind():
    assert branches_on(parse_python('if config.model.name == "gpt": pass')) == {"gpt"}
    assert branches_on(parse_python('if data.name in ("text", "token_stream"): pass')) == {"text", "token_stream"}
    assert branches_on(parse_python('record.get("text")')) == set()  # a JSON field of that spelling is no branch


def test_each_model_implements_the_protocols_of_what_its_spec_offers():
    """The spec's ``offers`` (read by validation) and the model's protocols (called by the methods) agree."""
    from trainrun.data.interface import TextFacts
    from trainrun.models.capabilities import PROTOCOLS, offered
    from trainrun.registry import builder
    from trainrun.schema import ModelConfig

    text = TextFacts(vocab_size=64, max_seq_len=16, tokenizer_file=Path("unused"), separator=1)
    declaring = [spec for spec in kinds.specs("model").values() if spec.finds is None]  # not a brought model's
    one_per_module = {spec.builder: spec for spec in declaring}.values()
    for spec in one_per_module:
        model = builder("model", spec.name)(ModelConfig(name=spec.name), text)
        assert offered(model) == spec.offers & set(PROTOCOLS), spec.name


def test_a_method_that_changes_the_models_structure_rebuilds_it_for_a_reload():
    """``trainrun sample`` builds a fresh model and asks the run's methods to change it as they did."""
    from trainrun.algorithms import build_algorithms
    from trainrun.data.interface import TextFacts
    from trainrun.registry import builder
    from trainrun.schema import ModelConfig

    text = TextFacts(vocab_size=64, max_seq_len=16, tokenizer_file=Path("unused"), separator=1)
    trained = builder("model", "gpt")(ModelConfig(name="gpt"), text)
    (alibi,) = build_algorithms({"alibi": SPECS["alibi"].config()})
    alibi.rebuild(trained)
    fresh = builder("model", "gpt")(ModelConfig(name="gpt"), text)
    assert set(fresh.state_dict()) != set(trained.state_dict())  # the position table is gone
    alibi.rebuild(fresh)
    fresh.load_state_dict(trained.state_dict())  # strict: the same parameters and buffers


def test_every_package_is_shipped_in_the_wheel():
    """setup.cfg lists packages by hand: a new specs/ package missing there breaks installed runs."""
    import configparser

    setup = configparser.ConfigParser()
    setup.read(PACKAGE.parent / "setup.cfg")
    listed = set(setup["options"]["packages"].split())
    found = {".".join(path.parent.relative_to(PACKAGE.parent).parts) for path in PACKAGE.rglob("__init__.py")}
    assert found <= listed, sorted(found - listed)


# each data source key, and keys of its sections
SOURCE_KEYS = ("path", "train", "val", "text.corpus", "text.max_seq_len", "shards.tokenizer", "shards.val_tokens")
SOURCE_KEYS += ("segmentation.fold", "segmentation.patch_size")


def test_a_data_source_key_the_chosen_data_kind_does_not_read_is_refused_naming_the_kind():
    """Over every data option and every source key: a key its kind does not read is one line naming
    the key, the option as the user chose it and the keys it does read; a key it reads passes."""
    from trainrun.config import compose
    from trainrun.validation import refuse_unread_keys

    conf = PACKAGE.parent / "conf" / "data"
    options = {path.stem: compose([f"data={path.stem}"]) for path in conf.glob("*.yaml")}
    refused = 0
    for option, composed in options.items():
        spec = kinds.specs("data")[composed.data.name]
        for key in SOURCE_KEYS:
            job = [f"data.{key}"]
            if spec.reads_key(key):
                refuse_unread_keys(job, composed, {"data": option})
                continue
            with pytest.raises(ConfigError) as refusal:
                refuse_unread_keys(job, composed, {"data": option})
            message = str(refusal.value)
            assert message.startswith(f"bad key 'data.{key}': data={option} does not read it (it reads "), message
            assert all(f"data.{read}" in message for read in spec.reads) and "\n" not in message
            refused += 1
    assert refused > 80 and len(options) >= 15
    reads = {name: spec.reads for name, spec in kinds.specs("data").items()}
    assert reads["token_shards"] == ("train", "val", "shards", "text.max_seq_len") and reads["digits"] == ()


def test_a_section_of_another_choice_than_the_runs_is_refused_naming_the_choice():
    """model.<name>.* is read under model=<name> only, optimizer.muon.* under optimizer=muon,
    data.ffcv.* under data.loader=ffcv: over every model and optimizer option and both loaders, a key
    of another choice's section is one line naming the key, the choice and the section's."""
    from trainrun.config import compose
    from trainrun.schema import TrainConfig
    from trainrun.validation import SELECTORS, refuse_unread_keys

    conf, refused = PACKAGE.parent / "conf", 0
    for parent, selector in SELECTORS.items():
        section_type = type(getattr(TrainConfig(), parent))
        fields = {field.name: field for field in dataclasses.fields(section_type)}
        sections = [name for name in fields[selector].metadata["choices"] if name in fields]
        group = parent if selector == "name" else f"{parent}.{selector}"
        choices = [path.stem for path in (conf / parent).glob("*.yaml")] if selector == "name" else ["torch", "ffcv"]
        for choice in choices:
            composed = compose([f"{group}={choice}"])
            chosen = composed[parent][selector]
            for section in sections:
                first = dataclasses.fields(type(getattr(getattr(TrainConfig(), parent), section)))[0].name
                key = f"{parent}.{section}.{first}"
                if section == chosen:
                    refuse_unread_keys([key], composed, {parent: choice})
                    continue
                with pytest.raises(ConfigError) as refusal:
                    refuse_unread_keys([key], composed, {parent: choice})
                assert str(refusal.value) == (
                    f"bad key '{key}': {group}={choice} does not read it ({parent}.{section}.* is read under "
                    f"{group}={section})"
                )
                refused += 1
    assert refused > 50
