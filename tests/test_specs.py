"""What the method specs decide before any work starts, checked in-process (fast, no torch run)."""

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from trainrun.algorithms.specs import METHOD_ORDER, SPECS, MethodSpec, check_methods, discover_specs, sequence_limit
from trainrun.algorithms.specs.alibi import AlibiConfig
from trainrun.errors import ConfigError
from trainrun.kinds import Capability
from trainrun.validation import validate

CONF = Path(__file__).resolve().parent.parent / "conf"
LANGUAGE_ONLY = {
    "masked_head",
    "seq_length_warmup",
    "alibi",
    "unpadding",
    "gated_linear_units",
    "low_precision_layernorm",
    "fused_layers",
}
CAUSAL_ONLY = {"window_warmup"}
TEXT_RUN = {"task": {"name": "masked_lm"}, "data": {"name": "text", "text": {"corpus": "stdlib_docs"}}}
TEXT_RUN["model"] = {"name": "bert"}


def check(settings: dict) -> None:
    validate(OmegaConf.create(settings), files=False)


def refused(settings: dict, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        check(settings)
    assert str(error.value) == message


def test_the_methods_run_in_the_documented_order():
    assert METHOD_ORDER == (
        "stochastic_depth", "blurpool", "squeeze_excite", "ghost_batchnorm", "fixres", "progressive_resizing",
        "colout", "selective_backprop", "seq_length_warmup", "mixup", "cutmix", "randaugment", "trivialaugment",
        "label_smoothing", "sam", "gradient_clipping", "layer_freezing", "ema", "swa", "alibi", "window_warmup",
        "unpadding", "masked_head", "gated_linear_units", "low_precision_layernorm", "fused_layers", "channels_last",
    )  # fmt: skip
    found = discover_specs()  # each specs/<name>.py's SPEC, read again
    assert tuple(found) == METHOD_ORDER and all(isinstance(spec, MethodSpec) for spec in found.values())
    assert [spec.name for spec in found.values()] == list(METHOD_ORDER)


def test_a_method_of_another_task_is_refused_naming_the_methods_the_task_has():
    every = sorted(path.stem for path in (CONF / "algorithms").glob("*.yaml"))
    image = [name for name in every if name not in LANGUAGE_ONLY | CAUSAL_ONLY]
    refused(
        {"algorithms": {"alibi": {}}},
        "algorithm 'alibi' does not apply to task image_classification (it is for causal_lm, masked_lm); "
        f"choose from: {', '.join(image)}",
    )
    language = sorted(LANGUAGE_ONLY | {"ema", "gradient_clipping", "sam", "swa"})
    refused(
        {**TEXT_RUN, "algorithms": {"blurpool": {}}},
        "algorithm 'blurpool' does not apply to task masked_lm (it is for image_classification); "
        f"choose from: {', '.join(language)}",
    )
    check({**TEXT_RUN, "algorithms": {"ema": {}, "alibi": {}}})  # every task has EMA


@pytest.mark.parametrize(("pair", "why"), [
    (("mixup", "cutmix"), "both replace each batch with mixed images and targets; choose one"),
    (("cutmix", "mixup"), "both replace each batch with mixed images and targets; choose one"),
    (("randaugment", "trivialaugment"), "both draw random per-image augmentations; choose one"),
])  # fmt: skip
def test_methods_that_cannot_combine_are_refused_in_either_order(pair, why):
    first, second = sorted(pair)
    refused(
        {"algorithms": {pair[0]: {}, pair[1]: {}}}, f"algorithms '{first}' and '{second}' cannot run together: {why}"
    )
    for name in pair:
        check({"algorithms": {name: {}}})


def test_a_per_image_transform_needs_the_torch_loader():
    refused(
        {"data": {"loader": "ffcv"}, "algorithms": {"trivialaugment": {}}},
        "algorithm 'trivialaugment' transforms images in the torch DataLoader, which data.loader=ffcv does not use; "
        "choose a torch-loader data set (e.g. data=folder or data=digits)",
    )
    check({"data": {"loader": "ffcv"}, "algorithms": {"mixup": {}}})  # a batch method runs on either loader
    check({"algorithms": {"trivialaugment": {}}})


@pytest.mark.parametrize(("settings", "message"), [
    ({"algorithms": {"fixres": {"train_resolution": 8}}},
     "bad value for 'algorithms.fixres.train_resolution': 8 (must be below data.eval_resolution 8)"),
    ({"algorithms": {"progressive_resizing": {"delay": 0.6, "finetune": 0.5}}},
     "bad value for 'algorithms.progressive_resizing': delay + finetune must be <= 1"),
    ({"algorithms": {"selective_backprop": {"start": 0.6, "end": 0.5}}},
     "bad value for 'algorithms.selective_backprop': start must be <= end"),
    ({"algorithms": {"sam": {}}, "device_train_microbatch_size": "8"},
     "algorithm 'sam' cannot run with 'device_train_microbatch_size': its second pass needs the whole batch's "
     "gradient before any micro-batch can run it"),
])  # fmt: skip
def test_each_method_checks_its_own_values(settings, message):
    refused(settings, message)


@pytest.mark.parametrize("settings", [
    {"algorithms": {"fixres": {"train_resolution": 7}}},
    {"algorithms": {"progressive_resizing": {"delay": 0.5, "finetune": 0.5}}},
    {"algorithms": {"selective_backprop": {"start": 0.5, "end": 0.5}}},
    {"algorithms": {"sam": {}}},
])  # fmt: skip
def test_the_boundary_of_each_methods_check_is_allowed(settings):
    check(settings)


def test_alibi_bounds_the_sequence_length_instead_of_the_models_positions():
    assert sequence_limit({}) is None and sequence_limit({"ema": SPECS["ema"].config()}) is None
    limit = sequence_limit({"ema": SPECS["ema"].config(), "alibi": AlibiConfig(max_sequence_length=77)})
    assert limit == (77, "algorithms.alibi.max_sequence_length")
    short_positions = {**TEXT_RUN, "model": {"name": "bert", "bert": {"max_position_embeddings": 64}}}
    refused(
        short_positions,
        "bad value for 'data.text.max_seq_len': 128 is more than the model's 64 positions "
        "(model.bert.max_position_embeddings)",
    )
    check({**short_positions, "algorithms": {"alibi": {}}})
    refused(
        {**short_positions, "algorithms": {"alibi": {"max_sequence_length": 100}}},
        "bad value for 'data.text.max_seq_len': 128 is more than the model's 100 positions "
        "(algorithms.alibi.max_sequence_length)",
    )


def test_a_method_for_several_tasks_names_them_all_when_refused(monkeypatch):
    two_tasks = dataclasses.replace(SPECS["ema"], needs=frozenset({Capability.SEQUENCES}))
    monkeypatch.setitem(SPECS, "ema", two_tasks)
    run = SimpleNamespace(algorithms={"ema": SPECS["ema"].config()})
    run.task, run.data, run.model = (SimpleNamespace(name=name) for name in ("segmentation", "decathlon", "unet"))
    allowed = "channels_last, gradient_clipping, sam, swa"
    with pytest.raises(ConfigError, match=rf"\(it is for causal_lm, masked_lm\); choose from: {allowed}$"):
        check_methods(run)
