"""The layout a step's convolutions run in: cuDNN's transposes of channels-first operands, a
channels-last grouped convolution whose groups no tensor-core tile fits on the CUDA cores, inductor's
choice of layout for a compiled graph (trainrun/estimate/layout.py)."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from trainrun.estimate.layout import (
    CUDA_CORES,
    TRANSPOSE,
    Convolution,
    inductor_lays_out_channels_last,
    laid_out_channels_last,
)
from trainrun.estimate.operations import GROUPED, InsideRegions, Operation, OperationLog


def logged(layer: torch.nn.Module, x: torch.Tensor, backward: bool = False, log: OperationLog | None = None) -> list:
    """The operations of ``layer`` on ``x`` (its backward's alone where ``backward``), as ``log`` (a
    new one by default) has them."""
    log = log or OperationLog()
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


@pytest.mark.parametrize(
    ("channels", "groups", "dtype", "channels_last", "kind"),
    [
        (96, 4, torch.float16, True, CUDA_CORES),  # 24 channels a group (RegNetY-1.6GF's): no tile fits them
        (96, 2, torch.bfloat16, True, CUDA_CORES),  # 48: a multiple of 16, not of a 32-channel tile
        (224, 2, torch.float16, True, CUDA_CORES),  # 112: inductor's example of a 31x slower channels-last one
        (128, 4, torch.float16, True, GROUPED),  # 32: one tile a group
        (128, 16, torch.float16, True, GROUPED),  # 8: four groups a tile (ResNeXt's widths)
        (128, 2, torch.float16, True, GROUPED),  # 64: two tiles a group
        (96, 4, torch.float16, False, GROUPED),  # channels-first: cuDNN's transposes and its products
        (96, 4, torch.float32, True, GROUPED),  # float32 runs on the CUDA cores anyway
    ],
)
def test_a_channels_last_grouped_convolution_whose_groups_no_tile_fits_runs_on_the_cuda_cores(
    channels, groups, dtype, channels_last, kind
):
    """Its forward's and each gradient's products, where a group's output channels are neither a
    multiple of a 32-channel tile nor a power of two below it, in half precision, channels-last."""
    layer = torch.nn.Conv2d(channels, channels, 3, padding=1, groups=groups).to(dtype)
    x = torch.randn(2, channels, 8, 8, dtype=dtype)
    if channels_last:
        layer, x = layer.to(memory_format=torch.channels_last), x.to(memory_format=torch.channels_last)
    for backward in (False, True):
        products = [op.kind for op in logged(layer, x, backward) if op.flops]
        assert products == [kind] * (2 if backward else 1), (backward, channels, groups)


def test_a_compiled_grouped_convolution_runs_on_the_cuda_cores_once_inductor_lays_it_out_channels_last():
    """Logged channels-first in a compiled region, its products are noted; laid out channels-last by
    inductor, they run on the CUDA cores and their transposes are gone."""
    layer = torch.nn.Conv2d(96, 96, 3, padding=1, groups=4).half()
    log = OperationLog(regions=InsideRegions([layer]))
    operations = logged(layer, torch.randn(2, 96, 8, 8, dtype=torch.float16), log=log)
    assert [op.kind for op in operations] == [GROUPED, TRANSPOSE] and log.untiled == {0}
    assert [op.kind for op in laid_out_channels_last(operations, log.untiled)] == [CUDA_CORES]


def test_a_kernel_on_the_cuda_cores_is_timed_at_the_float32_peak_at_its_products_share():
    """As a float32 run's products: the float32 peak at the generation's matrix share, less for its
    shape; the run precision's peak where the datasheet states no float32 one."""
    from trainrun.estimate.device import Device, generation_of

    ampere = generation_of("ampere")
    operation = Operation(1e12, 1.0, CUDA_CORES, (1 << 16, 24, 216))
    shape = (1 << 16) / ((1 << 16) + ampere.half_dimension) * 24 / (24 + ampere.half_dimension)
    shape *= 216 / (216 + ampere.half_dimension)
    stated = Device(71e12, 936.0, ampere, full_rate_flops=142e12, cuda_core_flops=35.6e12)
    assert stated.operation_seconds(operation) == pytest.approx(1e12 / (35.6e12 * ampere.matmul * shape))
    unstated = Device(71e12, 936.0, ampere, full_rate_flops=142e12)
    assert unstated.operation_seconds(operation) == pytest.approx(1e12 / (71e12 * ampere.matmul * shape))
