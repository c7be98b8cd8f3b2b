"""Every key a user can set reaches the code that uses it: a generated check.

Tiny runs of each task train in this process while every read of a config field is recorded
(reads by ``dataclasses`` and ``copy``, which touch every field, do not count; validation runs
before the recording starts). A key that a dataset or builder never forwards, using a default of
its own instead, is never read and fails here, naming the key. Each run must read every key of
the sections its kinds own and every generic key, except:

- the keys read around a run rather than by it (:data:`READ_AROUND_A_RUN`, each with where), and
- the keys read only under some setting (:data:`READ_UNDER`): some run here makes that setting,
  and that run must read them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Iterator

import pytest
from PIL import Image

from trainrun.config import check
from trainrun.schema import TrainConfig

READ_AROUND_A_RUN = {
    "launcher": "trainrun/launch.py starts the processes from it",
    "auto": "recipe=auto and -o1 decide the run's overrides before it starts (trainrun/choose/)",
    "hardware": "trainrun report prices a run from its config.yaml",
    "mlflow": "the MLflow logger, with loggers=[mlflow] (tests/test_mlflow.py)",
    "wandb": "the W&B logger, with loggers=[wandb] (tests/test_wandb.py)",
    "name": "trainrun report labels a run from its config.yaml",
    "accuracy_targets": "validation reads it as quality_targets",
    "data.train": "data=beton and data=token_shards (tests/test_ffcv.py, tests/test_token_shards.py train on them)",
    "data.val": "data=beton and data=token_shards (tests/test_ffcv.py, tests/test_token_shards.py train on them)",
    "data.shards": "data=token_shards (tests/test_token_shards.py trains on llm.c shards)",
    "data.mix": "data=token_mix (tests/test_token_mix.py trains on two stores mixed)",
    "model.shape_from_weights": "read as the config is composed (kinds.fill_from_files), before the run",
    "data.samples": "trainrun estimate turns epochs into steps with it (tests/test_estimate.py)",
    "target_samples": "trainrun estimate's time to stop_at (tests/test_estimate.py)",
}
READ_AROUND_A_RUN |= {  # a brought model's settings: model=timm, transformers and module build from them
    key: "a model a user brings (tests/test_brought_models.py trains each kind)"
    for key in ("model.arch", "model.kwargs", "model.config", "model.path", "model.target", "model.head")
}
READ_AROUND_A_RUN["model.image_size"] = "model=timm: a ViT's side (tests/test_brought_models.py)"
SECTIONS = ("model.resnet_small", "model.bert", "model.gpt", "model.llama", "model.unet", "data.ffcv", "data.text")
SECTIONS += ("data.segmentation", "optimizer.muon")
READ_UNDER = {  # key: the run here that makes the setting it is read under
    "data.crop_scale": "folder",  # a folder's random-resized crops
    "data.crop_ratio": "folder",
    "data.decode": "folder",
    "data.eval_resize": "folder",
    "data.num_classes": "folder",  # checked against a folder's class count
    "data.path": "folder",
    "data.prefetch_factor": "folder",  # with loader workers (data.num_workers > 0)
    "data.num_samples": "synthetic",
    "data.val_samples": "synthetic",
    "data.cache_dir": "masked_lm",  # where a built-in corpus or .beton is written once
    "data.val_fraction": "image",  # built-in sets and corpora
    "data.split_seed": "image",
    "data.text.mlm_probability": "masked_lm",
    "data.text.eval_mlm_probability": "masked_lm",
    "data.text.packing": "masked_lm",
    "data.text.val_tokens": "causal_lm",  # the token stream's validation cap (masked LM refuses it)
    "data.mean": "image",  # images: the image task normalises
    "data.std": "image",
    "data.hflip": "image",
    "data.random_crop_padding": "image",
    "data.eval_resolution": "image",
    "model.initializers": "image",  # the ResNets
    "optimizer.dampening": "image",  # SGD (momentum: Muon's too)
    "optimizer.momentum": "image",
    "optimizer.nesterov": "image",
    "optimizer.exclude_norm_and_bias": "image",
    "optimizer.betas": "synthetic",  # Adam, LAMB and Muon's Adam
    "optimizer.eps": "synthetic",
    "optimizer.max_grad_norm": "folder",  # optimizer=lamb
    "optimizer.reference_batch_size": "folder",  # optimizer.lr_scaling=linear
    "algorithms.blurpool.replace_maxpools": "folder",  # a model with max-pooling (resnet18)
}
OWNS = {  # each run's sections (its kinds', its optimizer's)
    "image": {"model.resnet_small"},
    "masked_lm": {"model.bert", "data.text"},
    "causal_lm": {"model.gpt", "data.text", "optimizer.muon"},
    "segmentation": {"model.unet", "data.segmentation"},
    "llama": {"model.llama", "data.text"},
    "folder": set(),
    "synthetic": {"model.resnet_small"},
}
SHORT = ["max_duration=2ba", "eval_interval=2ba", "progress=false", "checkpoint.interval=1ba", "checkpoint.keep=1"]
RUNS = {
    "image": ["data=digits", "model.resnet_small.width=8", "train_batch_size=16", "algorithms=[ema,blurpool]"],
    "masked_lm": ["task=masked_lm", "data=stdlib_docs", "model=bert_tiny", "train_batch_size=8", "eval_batch_size=64"],
    "causal_lm": [
        "task=causal_lm", "data=stdlib_stream", "model=gpt_tiny", "data.text.max_seq_len=32", "optimizer=muon",
        "scheduler=wsd", "train_batch_size=8",
    ],
    "llama": [
        "task=causal_lm", "data=stdlib_stream", "model=llama_tiny", "data.text.max_seq_len=32", "optimizer=adamw",
        "train_batch_size=8", "model.llama.rope_factor=8.0", "parallel=fsdp",
        "parallel.activation_checkpointing=selective", "checkpoint.async_save=true",
    ],
    "segmentation": [
        "task=segmentation", "data=synthetic_brats", "model=unet2d", "model.unet.filters=[8,16,32]",
        "model.unet.strides=[1,2,2]", "data.segmentation.patch_size=[16,16]",
        "data.segmentation.synthetic_shape=[8,24,24]", "data.segmentation.synthetic_cases=10",
        "train_batch_size=8", "eval_batch_size=2",
    ],
    "folder": [
        "data=folder", "data.path={images}", "data.num_classes=2", "model=resnet18", "model.num_classes=2",
        "data.resolution=32", "data.eval_resolution=32", "data.num_workers=1", "train_batch_size=4",
        "eval_batch_size=4", "optimizer=lamb", "optimizer.max_grad_norm=1.0", "optimizer.lr_scaling=linear",
        "algorithms=[blurpool]",
    ],
    "synthetic": [
        "data=synthetic", "data.num_samples=32", "data.val_samples=16", "model.resnet_small.width=8",
        "train_batch_size=16", "optimizer=adamw",
    ],
}  # fmt: skip


def keys_of(instance: object, prefix: str = "") -> dict[tuple[type, str], str]:
    """Each field of the config tree, as (its dataclass, its name): its dotted key."""
    keys: dict[tuple[type, str], str] = {}
    for field in dataclasses.fields(instance):
        value, key = getattr(instance, field.name), f"{prefix}{field.name}"
        if dataclasses.is_dataclass(value):
            keys |= keys_of(value, f"{key}.")
        elif field.name == "algorithms" and isinstance(value, dict):
            for name, settings in value.items():
                keys |= keys_of(settings, f"algorithms.{name}.")
        else:
            keys[type(instance), field.name] = key
    return keys


@contextlib.contextmanager
def recorded_reads(classes: set[type]) -> Iterator[set[tuple[type, str]]]:
    """The (class, field) reads of instances of ``classes`` while the block runs."""
    read: set[tuple[type, str]] = set()

    def traced(self: object, name: str, get=object.__getattribute__) -> object:
        if not name.startswith("__") and not sys._getframe(1).f_code.co_filename.endswith(
            ("dataclasses.py", "copy.py")
        ):
            read.add((type(self), name))
        return get(self, name)

    for cls in classes:
        cls.__getattribute__ = traced
    try:
        yield read
    finally:
        for cls in classes:
            del cls.__getattribute__


def around_a_run(key: str) -> bool:
    return any(key == prefix or key.startswith(f"{prefix}.") for prefix in READ_AROUND_A_RUN)


def section_of(key: str) -> str | None:
    return next((section for section in SECTIONS if key.startswith(f"{section}.")), None)


@pytest.fixture(scope="module")
def unread(tmp_path_factory) -> dict[str, set[str]]:
    """For each run of :data:`RUNS`, trained here for two steps, the keys it never read."""
    from trainrun.run import train

    images = tmp_path_factory.mktemp("images")
    for split in ("train", "val"):
        for label in range(2):
            (images / split / f"class{label}").mkdir(parents=True)
            for index in range(4):
                Image.new("RGB", (40, 36), (200 * label, 30 * index, 90)).save(
                    images / split / f"class{label}" / f"{index}.jpg"
                )
    found = {}
    for name, overrides in RUNS.items():
        run_dir = tmp_path_factory.mktemp(name)
        config: TrainConfig = check(
            [*(o.format(images=images) for o in overrides), *SHORT, f"hydra.run.dir={run_dir}"]
        )[0]
        keys = keys_of(config)
        with recorded_reads({cls for cls, _ in keys}) as read:
            train(config, run_dir, "")
        found[name] = {key for field, key in keys.items() if field not in read}
    return found


@pytest.mark.slow
@pytest.mark.parametrize("run", list(RUNS))
def test_a_run_reads_every_key_of_its_kinds_and_every_generic_key(run, unread):
    missed = sorted(
        key
        for key in unread[run]
        if not around_a_run(key)
        and READ_UNDER.get(key) not in RUNS.keys() - {run}
        and (section_of(key) is None or section_of(key) in OWNS[run])
    )
    assert missed == [], f"run '{run}' never reads {missed}: a builder or dataset does not forward them"


@pytest.mark.slow
def test_every_key_read_under_a_setting_is_read_by_the_run_that_makes_it(unread):
    assert set(READ_UNDER.values()) <= RUNS.keys()
    assert sorted(key for key, run in READ_UNDER.items() if key in unread[run]) == []


@pytest.mark.slow
def test_every_key_of_a_section_is_read_by_the_run_that_owns_it(unread):
    owners = {section: {run for run, owned in OWNS.items() if section in owned} for section in SECTIONS}
    assert sorted(s for s, runs in owners.items() if not runs) == ["data.ffcv"]  # the .beton loader: tests/test_ffcv.py
    keys = set.union(*unread.values())  # a key some run did not read: one of its section's owners did
    missed = sorted(
        key for key in keys if section_of(key) and all(key in unread[run] for run in owners[section_of(key)])
    )
    assert [key for key in missed if not key.startswith("data.ffcv.")] == []


def test_the_recorder_sees_a_key_that_is_not_forwarded():
    """The check's own check: a builder that reads one key and not the other is caught."""
    from trainrun.schema import SegmentationDataConfig

    settings = SegmentationDataConfig(foreground_oversampling=0.9)
    with recorded_reads({SegmentationDataConfig}) as read:
        _ = settings.patch_size  # forwarded; foreground_oversampling is not
        assert dataclasses.asdict(settings)["foreground_oversampling"] == 0.9  # copying every field reads none
    keys = keys_of(settings)
    assert {keys[field] for field in read} == {"patch_size"}
