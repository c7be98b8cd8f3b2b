"""What a model a user brings is found to have, read from its build on the meta device.

A shipped model declares what it offers the speed-up methods in its spec; a brought one (any of
timm's, any of transformers', a module of the user's own) cannot, so it is built once on the meta
device (:func:`empty_weights`: no weight is kept, a ViT-Huge in about a second) and read: convolutions
(channels-last), 2-D convolutions (the image methods' surgery), LayerNorms, ungated feed-forward
blocks (gated linear units), 2-D hidden matrices (Muon) and repeated blocks (FSDP2's units,
activation checkpointing's). A method that changes the model is tried on a copy of that build
(``trainrun.method_list``), so a method that would change nothing is refused before any process
starts, by what the model contains and never by its name.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from trainrun.core.parallel import repeated_blocks
from trainrun.kinds import Capability
from trainrun.models.glu import feed_forwards

# what the meta device says of an operation it cannot run (autocast has no meta dtype; an operation
# without a meta kernel: "'Meta' backend", "Meta tensors", "Cannot copy out of meta tensor"), not of
# the model; matched in lower case
META_LIMITS = ("meta", "scalartype")
_BUILT: dict[str, nn.Module] = {}  # a run's meta build, by its model settings and the facts it reads


def text_facts(config: Any):
    """The text facts a sequence model is built with before its data are read: the config's vocabulary
    and length (the build's shape, not its size, is what is read here); None for other batches."""
    from trainrun.data.interface import TextFacts
    from trainrun.kinds import task_spec

    if task_spec(config.task.name).batches not in ("token_windows", "masked_text"):
        return None
    return TextFacts(config.data.text.vocab_size, config.data.text.max_seq_len, None, separator=0)


@contextlib.contextmanager
def empty_weights() -> Iterator[None]:
    """Every parameter and buffer a module registers moved to the meta device as it is registered,
    while the builder's own arithmetic stays real. Written here because ``torch.device("meta")`` and
    accelerate's ``init_empty_weights(include_buffers=True)`` move every tensor a builder makes (timm's
    RegNet computes its widths with ``torch.unique``, which has no meta kernel), and accelerate's
    default leaves the buffers (BatchNorm's statistics) on the host, where a meta batch cannot meet them."""
    register_parameter, register_buffer = nn.Module.register_parameter, nn.Module.register_buffer

    def parameter_on_meta(module: nn.Module, name: str, parameter: nn.Parameter | None) -> None:
        register_parameter(module, name, parameter)
        if parameter is not None and not parameter.is_meta:
            module._parameters[name] = nn.Parameter(parameter.to("meta"), requires_grad=parameter.requires_grad)

    def buffer_on_meta(module: nn.Module, name: str, tensor: torch.Tensor | None, persistent: bool = True) -> None:
        register_buffer(module, name, None if tensor is None else tensor.to("meta"), persistent)

    nn.Module.register_parameter, nn.Module.register_buffer = parameter_on_meta, buffer_on_meta
    try:
        yield
    finally:
        nn.Module.register_parameter, nn.Module.register_buffer = register_parameter, register_buffer


def meta_model(config: Any) -> nn.Module:
    """``config.model`` built on the meta device, once a run's settings (a copy each time it is asked:
    a method's trial changes it): :func:`built_on_meta`."""
    from trainrun.registry import builder

    text = text_facts(config)
    key = json.dumps([dataclasses.asdict(config.model), config.task.name, text and dataclasses.asdict(text)],
                     sort_keys=True, default=str)  # fmt: skip
    if key not in _BUILT:
        _BUILT[key] = built_on_meta(lambda: builder("model", config.model.name)(config.model, text))
    return copy.deepcopy(_BUILT[key])


def built_on_meta(build: Callable[[], nn.Module]) -> nn.Module:
    """``build()``'s model with its weights on the meta device (:func:`empty_weights`); a model whose
    build computes with its weights, which the meta device cannot (timm's ViTamin), built on the host,
    as the run builds it, and then moved there."""
    try:
        with empty_weights():
            return build()
    except Exception as error:  # a model of any library raises what it raises
        if meta_failure(error) is not None:
            raise
    return build().to("meta")


def meta_failure(error: Exception) -> str | None:
    """The first line of ``error``, raised by a model on the meta device; None where it says the meta
    device cannot run an operation (:data:`META_LIMITS`), which the host can."""
    first = next((line.strip() for line in str(error).splitlines() if line.strip()), type(error).__name__)
    return None if any(word in first.lower() for word in META_LIMITS) else first


def capabilities(model: nn.Module) -> frozenset[Capability]:
    """What ``model``'s modules offer the methods."""
    found = set()
    if any(isinstance(module, nn.modules.conv._ConvNd) for module in model.modules()):
        found.add(Capability.CONVOLUTIONS)
    if any(isinstance(module, nn.Conv2d) for module in model.modules()):
        found.add(Capability.IMAGE_CONVNET)
    if any(isinstance(module, nn.LayerNorm) for module in model.modules()):
        found.add(Capability.LAYER_NORMS)
    if feed_forwards(model):
        found.add(Capability.FEED_FORWARDS)
    if len(repeated_blocks(model)) > 1:
        found.add(Capability.TRANSFORMER_BLOCKS)
    if hidden_matrices(model):
        found.add(Capability.HIDDEN_MATRICES)
    return frozenset(found)


def hidden_matrices(model: nn.Module) -> bool:
    """Whether Muon takes ``model``: its rule of roles (trainrun/optim/muon.py) finds 2-D matrices
    and no weight of more dimensions (a convolution's, a ViT's class token) that it could not take."""
    from trainrun.errors import ConfigError
    from trainrun.optim.muon import parameter_roles
    from trainrun.schema import MuonConfig

    try:
        return bool(parameter_roles(model, MuonConfig().head_modules)["matrices"])
    except ConfigError:
        return False


def found_capabilities(config: Any) -> frozenset[Capability]:
    """What the model ``config`` names offers, found in its meta build (a brought kind's ``finds``): an
    image model takes images of any side where it runs on twice the run's (a model built for one
    side, a ViT, takes no other; a smaller side could be too small for a convolutional network's)."""
    from trainrun.kinds import task_spec

    model = meta_model(config)
    found = capabilities(model)
    if task_spec(config.task.name).batches == "images":
        if meta_outputs(model, example_inputs(at_side(config, 2 * config.data.resolution)))[1] is None:
            found |= {Capability.ANY_IMAGE_SIDE}
    return frozenset(found)


def meta_outputs(model: nn.Module, inputs: Any) -> tuple[Any, str | None]:
    """``model``'s outputs (on the meta device) for ``inputs``, or the first line of the error it raises
    (outputs and error None where it stops at an operation the meta device cannot run: the first step
    runs it)."""
    try:
        return model(inputs), None
    except Exception as error:  # a model of any library raises what it raises
        return None, meta_failure(error)


def described(config: Any) -> str:
    """The model as a user names it: ``model=timm convnext_tiny``."""
    model = config.model
    return f"model={model.name} {model.arch or model.target or model.path or ''}".rstrip()


def example_inputs(config: Any, rows: int = 2) -> Any:
    """A batch of ``rows`` of the run's model inputs on the meta device, at the run's sizes: the task's
    example of what its loader gives, made into inputs as the task makes them."""
    from trainrun.tasks.base import BatchPlace, build_task

    task = build_task(config.task.name, config.data)
    inputs, _, _ = task.batch(task.example_batch(config, rows, text_facts(config)), BatchPlace(torch.device("meta")))
    return inputs


def expected_shape(config: Any, inputs: Any) -> tuple[tuple[int, ...], str]:
    """The output shape the run's task scores for ``inputs``, and what its dimensions are."""
    from trainrun.kinds import task_spec

    batches = task_spec(config.task.name).batches
    if batches == "images":
        return (len(inputs), config.model.num_classes), "(batch, classes)"
    if batches == "volumes":
        return (len(inputs), config.model.num_classes, *inputs.shape[2:]), "(batch, classes, *patch)"
    ids = inputs if batches == "token_windows" else inputs["input_ids"]
    return (*ids.shape, config.data.text.vocab_size), "(batch, sequence, vocabulary)"


def input_sides(config: Any, key: str) -> list[tuple[Any, str, str]]:
    """The runs whose inputs the model takes, each with the key that names it and what its inputs are:
    the training's, and an image run's evaluation's where its side (``data.eval_resolution``) differs."""
    from trainrun.kinds import task_spec

    sides = [(config, key, "the run's")]
    data = config.data
    if task_spec(config.task.name).batches == "images" and data.eval_resolution != data.resolution:
        sides.append((at_side(config, data.eval_resolution), "data.eval_resolution", "the evaluation's"))
    return sides


def at_side(config: Any, side: int) -> Any:
    """``config`` with its images at ``side`` pixels (``data.resolution``)."""
    return dataclasses.replace(config, data=dataclasses.replace(config.data, resolution=side))


def check_outputs(config: Any, key: str) -> None:
    """The model's output for a batch of the run's inputs, and of its evaluation's (on the meta device),
    has the shape the task scores; else one line naming ``key`` (``data.eval_resolution`` for the
    evaluation's), the shapes, or the model's own error."""
    from trainrun.errors import ConfigError

    model = meta_model(config)
    for side, named, whose in input_sides(config, key):
        inputs = example_inputs(side)
        outputs, failure = meta_outputs(model, inputs)
        if failure is not None:
            shape = tuple(inputs.shape) if isinstance(inputs, torch.Tensor) else tuple(inputs["input_ids"].shape)
            raise ConfigError(
                f"bad value for '{named}': {described(config)} fails on {whose} inputs {shape}: {failure}"
            )
        if outputs is None:
            continue
        shape, dimensions = expected_shape(config, inputs)
        found = tuple(outputs.shape) if isinstance(outputs, torch.Tensor) else type(outputs).__name__
        if found != shape:
            raise ConfigError(
                f"bad value for '{named}': {described(config)} returns {found} for {whose} inputs; task "
                f"{config.task.name} scores {shape} {dimensions}"
            )


def check_weights(config: Any) -> None:
    """``model.weights`` fits the model as built, before any process starts."""
    from trainrun.models.weights import check_weights_file

    if config.model.weights:
        check_weights_file(meta_model(config), config.model.weights)
