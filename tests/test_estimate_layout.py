"""The layout a step's convolutions run in: cuDNN's transposes of channels-first operands, inductor's
choice of layout for a compiled graph (trainrun/estimate/layout.py)."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from trainrun.estimate.layout import TRANSPOSE, Convolution, inductor_lays_out_channels_last
from trainrun.estimate.operations import OperationLog


def logged(layer: torch.nn.Module, x: torch.Tensor, backward: bool = False) -> list:
    """The operations of ``layer`` on ``x`` (its backward's alone where ``backward``), as the log has them."""
    log = OperationLog()
    with FakeTensorMode(allow_non_fake_inputs=True):
        x = x.detach().requires_grad_(backward)
        if not backward:
            with log:
                layer(x)
            return log.operations
        y = layer(x)
        with log:
            y.backward(torch.ones_like(y))
    return log.operations


@pytest.mark.parametrize(
    ("layer", "dtype", "channels_last", "transposed"),
    [
        (torch.nn.Conv2d(16, 32, 3, padding=1), torch.float16, False, True),
        (torch.nn.Conv2d(16, 32, 1, stride=2), torch.bfloat16, False, True),  # strided: not a plain product
        (torch.nn.Conv2d(16, 32, 3, padding=1), torch.float16, True, False),
        (torch.nn.Conv2d(16, 32, 1), torch.float16, False, False),  # pointwise: each image's rows as they lie
        (torch.nn.Conv2d(16, 16, 3, padding=1, groups=16), torch.float16, False, False),  # depthwise: its own kernels
        (torch.nn.Conv2d(16, 32, 3, padding=1), torch.float32, False, False),
    ],
)
def test_a_channels_first_convolution_pays_cudnns_transposes_of_what_it_reads_and_writes(
    layer, dtype, channels_last, transposed
):
    """A half-precision convolution of several taps or strides on a channels-first input: each tensor its
    kernel reads and writes read and written once more, forward and for each gradient's product; none
    channels-last, pointwise, depthwise or in float32."""
    layer = layer.to(dtype)
    x = torch.randn(2, 16, 8, 8, dtype=dtype)
    if channels_last:
        layer, x = layer.to(memory_format=torch.channels_last), x.to(memory_format=torch.channels_last)
    for backward in (False, True):
        operations = logged(layer, x, backward)
        products = [op for op in operations if op.flops]
        moved = sorted(op.moved for op in operations if op.kind == TRANSPOSE)
        assert moved == (sorted(2 * op.moved for op in products) if transposed else []), (backward, layer)


def inductors_choice(model: torch.nn.Module, inference: bool) -> bool:
    """inductor's own layout optimization on ``model``'s graph (its CPU rule for mkldnn off)."""
    from torch._inductor.graph import GraphLowering
    from torch.fx.experimental.proxy_tensor import make_fx

    graph = make_fx(model, tracing_mode="fake", _allow_non_fake_inputs=True)(torch.randn(2, 3, 32, 32))
    with torch.backends.mkldnn.flags(enabled=False):
        return GraphLowering.decide_layout_opt(graph, is_inference=inference)


def convolutions_of(model: torch.nn.Module) -> list[Convolution]:
    """``model``'s convolutions as the operation log notes a compiled one's."""
    from torch.utils.flop_counter import FlopCounterMode

    shapes, x = [], torch.randn(2, 3, 32, 32)
    for layer in model:
        with FlopCounterMode(display=False) as counter:
            x = layer(x)
        if isinstance(layer, torch.nn.Conv2d):
            shapes.append(Convolution(tuple(layer.weight.shape), layer.groups, counter.get_total_flops()))
    return shapes


def stack(*layers: tuple[int, int, int, int]) -> torch.nn.Sequential:
    """Convolutions of (input channels, output channels, kernel, groups), padded to keep their size."""
    return torch.nn.Sequential(*(torch.nn.Conv2d(i, o, k, padding=k // 2, groups=g) for i, o, k, g in layers))


MODELS = {
    "dense": stack((3, 96, 3, 1), (96, 128, 3, 1), (128, 128, 1, 1)),
    "grouped": stack((3, 96, 3, 1), (96, 128, 3, 1), (128, 128, 3, 4)),
    "narrowing": stack((3, 96, 3, 1), (96, 128, 3, 1), (128, 32, 3, 1)),
    "small": stack((3, 16, 3, 1), (16, 32, 3, 1)),
    "depthwise": stack((3, 96, 3, 1), (96, 128, 3, 1), (128, 128, 3, 128)),
    "grouped heavy": stack((3, 96, 3, 1), (96, 96, 3, 2), (96, 96, 3, 2), (96, 96, 3, 2)),
}


@pytest.mark.parametrize("inference", [True, False])
def test_inductor_lays_out_a_compiled_graphs_convolutions_as_its_own_layout_optimization_decides(inference):
    """The estimate's rules give inductor's own answer on graphs of dense, grouped, narrowing, small
    and depthwise convolutions, in inference and in training; both answers occur."""
    choices = {}
    for name, model in MODELS.items():
        choices[name] = inductor_lays_out_channels_last(convolutions_of(model), inference)
        assert choices[name] == inductors_choice(model, inference), (name, inference)
    assert set(choices.values()) == {True, False}


def test_a_run_under_the_channels_last_method_pays_no_transposes_and_one_without_it_does():
    """The estimate's pass runs the model and its batches laid out as the run's methods lay them out."""
    from trainrun.config import compose
    from trainrun.estimate import sized_task
    from trainrun.estimate.memory import pass_operations
    from trainrun.validation import validate

    base = ["model=resnet_small", "data=synthetic", "data.resolution=32", "precision=amp", "hardware=1xrtx3090"]
    transposed = {}
    for algorithms in ("[]", "[channels_last]"):
        config = validate(compose([*base, f"algorithms={algorithms}"]), files=False)
        operations = pass_operations(config, sized_task(config), None, 4)
        transposed[algorithms] = sum(op.kind == TRANSPOSE for op in operations)
    assert transposed["[]"] > 0 and transposed["[channels_last]"] == 0
