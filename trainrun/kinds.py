"""Tasks, models and data sources as specs: what a run needs to know of each kind before torch is imported.

Each kind has one spec beside its module: ``trainrun/tasks/specs/<module>.py`` for
``trainrun/tasks/<module>.py``, and the same under ``models/`` and ``data/``. A spec module holds
``SPECS``, the specs of the names its module builds (``resnet18`` … ``resnet101`` share one). A spec
says where its builder lives, what batches it gives or takes (a task, its data and its model agree
on them: :attr:`KindSpec.batches`), which :class:`Capability` it offers the speed-up methods, and its
own checks of a composed config and of the files it reads. The registry, the quality table and
validation read the specs; none of them names a kind. Adding a task, model or data source touches
its module, its spec and its ``conf/`` option.
"""

from __future__ import annotations

import functools
import importlib
import json
import pkgutil
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import yaml

from trainrun.errors import ConfigError
from trainrun.quality import Quality

KIND_ORDER = ("task", "data", "model")  # a run's kinds, in the order validation reads them
KIND_PACKAGES = {"task": "trainrun.tasks.specs", "model": "trainrun.models.specs", "data": "trainrun.data.specs"}


class Capability(str, Enum):
    """What a task, model or data source offers that a speed-up method may need (``MethodSpec.needs``)."""

    CLASS_IMAGES = "image batches with a class per image (mixing, augmenting, resizing, per-sample losses)"
    ANY_IMAGE_SIDE = "a model that takes images of any side, not one built for a single side (a ViT's)"
    IMAGE_CONVNET = "a 2-D convolutional network whose layers a method may replace (pooling, blocks, norms)"
    CONVOLUTIONS = "convolutions over dense tensors (channels-last memory format)"
    SEQUENCES = "token sequences a method may cut short (sequence-length warmup)"
    CAUSAL_SEQUENCES = "causal sequences a method may split into shorter ones (ALiBi's training lengths)"
    ALIBI = "attention that takes ALiBi's distance biases instead of position embeddings"
    ATTENTION_WINDOW = "a sliding attention window set per step"
    UNPADDING = "attention over the real tokens only (unpadded)"
    MASKED_HEAD = "an output head that scores the masked positions only"
    ENCODER_LAYERS = "Hugging Face encoder layers (fused blocks)"
    FEED_FORWARDS = "ungated feed-forward blocks, Linear, activation, Linear (gated linear units)"
    LAYER_NORMS = "LayerNorm layers (normalised in the autocast dtype)"
    HIDDEN_MATRICES = "hidden weights that are 2-D matrices (Muon)"
    TRANSFORMER_BLOCKS = "a list of repeated blocks (model.blocks): FSDP2's units, activation checkpointing's"
    META_INIT = "weights set one at a time after a build on the meta device (no rank holds the whole model)"
    FOLDS = "cases in cross-validation folds, predicted whole (trainrun sweep folds=, trainrun ensemble)"


Check = Callable[[Any], None]  # the run's TrainConfig -> raise ConfigError naming the key
# the keys under data that say where a data source's data come from and how it is cut: each data kind
# reads some (KindSpec.reads); one a run sets that its kind does not read is refused
DATA_SOURCE_KEYS = ("path", "train", "val", "text", "shards", "segmentation", "mix")


@dataclass(frozen=True)
class KindSpec:
    """One registered name of a kind: its builder, the batches it speaks, what it offers and checks."""

    name: str  # the config's task.name / model.name / data.name
    builder: str  # "module:function"
    batches: str  # the batch format a data source gives, its task reads and its model takes
    offers: frozenset[Capability] = frozenset()
    check: Check | None = None  # its own rules for a composed config
    check_files: Check | None = None  # the files it reads exist and are what it reads (runs only)
    # a language model's vocabulary as published (its tokenizer's), which trainrun estimate sizes
    # the model with where the run names no data to read it from
    # (a model a user brings: read from its config, ``published_vocab(config)``)
    published_vocab: int | Callable[[Any], int] | None = None
    # a language model's settings (model.<name>.*) from a published folder's config.json, for
    # model.shape_from_weights
    published_shape: Callable[[dict], dict] | None = None
    # a sequence model's longest sequence under a run's settings and the key that sets it (None where
    # its settings set none: ALiBi's positions); validation holds data.text.max_seq_len to it, or to
    # the bound a chosen method gives instead (a method's spec says which of its settings does)
    positions: Callable[[Any], tuple[int, str] | None] | None = None
    # a model's architecture family as trainrun's table of measured rates names it (trainrun/estimate/readings.yaml)
    family: str | None = None
    # a data kind: the settings its files name (key: (value, what names it)), set as the config is
    # composed (kinds.fill_from_data); {} where the files are not there to read
    fills: Callable[[Any], dict[str, tuple[Any, str]]] | None = None
    # a data kind: which of DATA_SOURCE_KEYS it reads (a key, a section, or a section's key:
    # "text.max_seq_len"); a run that sets another under data is refused
    reads: tuple[str, ...] = ()
    # a model a user brings (timm's, transformers', their own): what it offers is found in its build on
    # the meta device (trainrun/models/found.py) for a run's config, not declared; ``offers`` is unused
    finds: Callable[[Any], frozenset[Capability]] | None = None
    # a model a user brings that takes other batch formats besides ``batches`` (a module of their own)
    also_speaks: tuple[str, ...] = ()

    def speaks(self, batches: str) -> bool:
        """Whether this kind gives, reads or takes ``batches``."""
        return batches == self.batches or batches in self.also_speaks

    def offered(self, config: Any) -> frozenset[Capability]:
        """What this kind offers in ``config``'s run: declared, or found in the built model."""
        return self.finds(config) if self.finds is not None else self.offers

    def reads_key(self, key: str) -> bool:
        """Whether this data kind reads ``key`` (under data: ``shards.tokenizer``)."""
        return any(key == read or key.startswith(f"{read}.") for read in self.reads)


@dataclass(frozen=True, kw_only=True)
class TaskSpec(KindSpec):
    """A task: besides the above, the quality metric its runs are measured in and the ``loss``
    settings it trains with (``trains_with`` says what they are, for the line that refuses another)."""

    quality: Quality
    losses: tuple[str, ...] = ("soft_ce",)
    trains_with: str = "cross-entropy, soft_ce"


@functools.cache
def specs(kind: str) -> Mapping[str, KindSpec]:
    """Every spec of ``kind`` (task, model or data), by name, in the order of their modules' names."""
    package = importlib.import_module(KIND_PACKAGES[kind])
    found: dict[str, KindSpec] = {}
    for module in sorted(pkgutil.iter_modules(package.__path__), key=lambda module: module.name):
        for spec in importlib.import_module(f"{package.__name__}.{module.name}").SPECS:
            if spec.name in found:
                raise ValueError(f"{kind} '{spec.name}' is registered twice")
            found[spec.name] = spec
    return found


def names(kind: str) -> tuple[str, ...]:
    """The names a config may give a ``kind``."""
    return tuple(specs(kind))


def spec_of(kind: str, name: str) -> KindSpec:
    return specs(kind)[name]


def task_spec(name: str) -> TaskSpec:
    spec = specs("task")[name]
    assert isinstance(spec, TaskSpec)
    return spec


def chosen(config: Any) -> dict[str, KindSpec]:
    """The run's task, data source and model specs, keyed by kind."""
    return {kind: spec_of(kind, getattr(config, kind).name) for kind in KIND_ORDER}


def offers(config: Any) -> frozenset[Capability]:
    """What the run's task, data source and model offer together."""
    return frozenset().union(*(spec.offered(config) for spec in chosen(config).values()))


def tasks_offering(needs: Iterable[Capability]) -> list[str]:
    """The tasks some run of which offers every capability in ``needs`` (with a data source and model
    that speak the task's batches)."""
    needed, found = set(needs), []
    for task in specs("task").values():
        data, models = (
            [spec_of(kind, name).offers for name in serving(kind, task.batches)] for kind in ("data", "model")
        )
        if any(needed <= task.offers | source | model for source in data for model in models):
            found.append(task.name)
    return found


def serving(kind: str, batches: str) -> list[str]:
    """The names of ``kind`` that speak ``batches``."""
    return [name for name, spec in specs(kind).items() if spec.speaks(batches)]


def config_dir() -> Path:
    """``conf/`` inside the installed package, or beside the package in a source checkout."""
    installed = Path(__file__).resolve().parent / "conf"
    return installed if installed.is_dir() else Path(__file__).resolve().parent.parent / "conf"


def option_names(kind: str, default: str) -> dict[str, str]:
    """Each ``conf/<kind>/`` option and the registered name it chooses, following its defaults list
    (presets share a name: ``stdlib_stream`` is ``token_stream`` reading a built-in corpus);
    ``default``: the name an option that sets none keeps."""
    folder, found = config_dir() / kind, {}
    for path in sorted(folder.glob("*.yaml")):
        option = yaml.safe_load(path.read_text()) or {}
        option = option.get(kind, option) if kind == "task" else option  # task options are global
        while "name" not in option and option.get("defaults"):
            parent = next(entry for entry in option["defaults"] if isinstance(entry, str) and entry != "_self_")
            option = yaml.safe_load((folder / f"{parent}.yaml").read_text()) or {}
        found[path.stem] = option.get("name", default)
    return found


def fill_from_files(composed: Any, given: set[str]) -> None:
    """The settings a run's files name, read into the composed config before it is validated: a
    model's published shape (:func:`fill_published_shape`) and what its data's files name
    (:func:`fill_from_data`; ``given``: the keys the command line sets)."""
    fill_published_shape(composed)
    fill_from_data(composed, given)


def fill_from_data(composed: Any, given: set[str]) -> None:
    """What the data kind's files name (``KindSpec.fills``: ``data=decathlon``'s channels and
    classes from dataset.json) set into the composed config, so that the run, its config.yaml and
    whatever reads that later agree with the files; one line where the command line sets another."""
    from omegaconf import OmegaConf

    spec = specs("data").get((composed.get("data") or {}).get("name"))
    if spec is None or spec.fills is None:
        return
    for key, (value, named) in spec.fills(composed).items():
        if key in given and (set_to := OmegaConf.select(composed, key)) != value:
            raise ConfigError(f"bad value for '{key}': {set_to}, but {named}")
        OmegaConf.update(composed, key, value, merge=False)


def fill_published_shape(composed: Any) -> None:
    """``model.shape_from_weights`` (``model=llama``, ``model=gpt``): the model's settings read from
    ``model.weights``' ``config.json`` into the composed config, so that the run, its config.yaml and
    whatever reads that later build the published shape; one line where there is none to read."""
    from omegaconf import OmegaConf

    model = composed.get("model") or {}
    if not model.get("shape_from_weights"):
        return
    spec = specs("model").get(model.get("name"))
    if spec is None or spec.published_shape is None:
        name = model.get("name")
        raise ConfigError(f"bad value for 'model.shape_from_weights': model={name} reads no published shape")
    folder = Path(str(model.get("weights") or "")).expanduser()
    if not model.get("weights") or not (folder / "config.json").is_file():
        raise ConfigError(
            f"bad value for 'model.weights': '{model.get('weights')}' has no config.json to read "
            f"model={model.get('name')}'s shape from (a Hugging Face save_pretrained folder)"
        )
    try:
        published = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as error:
        raise ConfigError(f"bad value for 'model.weights': '{folder / 'config.json'}' is not JSON ({error})") from None
    for key, value in spec.published_shape(published).items():
        OmegaConf.update(composed, f"model.{spec.name}.{key}", value, merge=False)
