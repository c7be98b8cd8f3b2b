"""A convolution's memory layout as the GPU runs it, for the estimate's operations.

cuDNN's tensor-core convolutions compute channels-last (NHWC). Given a half-precision operand laid
out channels-first (NCHW, torch's default), cuDNN transposes it to NHWC before its kernel and the
result back after it: NVIDIA's convolution performance guide, and the reason the channels_last method
exists (Composer's method card). A fake pass's tensors carry their strides, so the operation log
knows which convolutions pay it (:func:`channels_first`): each operand and result read and written
once more. A depthwise convolution runs its own kernels, channels-first too. A compiled
graph's convolutions are laid out by inductor (:func:`inductor_lays_out_channels_last`), where no
transposes are left.

Channels-last, a grouped convolution runs on the tensor cores only where their kernels tile its
groups (:func:`off_tensor_cores`), as CUTLASS's grouped implicit GEMMs do
(cutlass/conv/device/implicit_gemm_convolution.h, ``can_implement``): a tile of output channels
within one group (a group's channels a multiple of the tile's) or several whole groups in one (the
tile's a multiple of a group's), a tile being a power of two of at least :data:`TILE_CHANNELS`
channels. Other group widths (RegNet's 24 channels a group) run as a float32 run's products, on the
CUDA cores: timm's channels-last RegNets of 24 channels a group run slower than their channels-first
ones on an RTX 3090 in torch 2.4, those of 16 faster (results/benchmark-infer-amp-*-pt240-cu124-rtx3090.csv).
Written here because no library says what layout a step's kernels run in without a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trainrun.algorithms.channels_last import memory_format_for

TRANSPOSE = "layout transpose"  # the kind of cuDNN's transposes around a channels-first convolution
CUDA_CORES = "grouped convolution, CUDA cores"  # the kind of a channels-last one whose groups no tile fits
# the narrowest tile of output channels a grouped tensor-core convolution runs: not 16, as a group of 112
# channels (7 of 16) ran 31 times slower channels-last (torch/_inductor/graph.py, decide_layout_opt's note)
TILE_CHANNELS = 32
# inductor's measured time of a convolution laid out channels-last over channels-first, by its kind,
# which weighs an inference graph's choice (torch/_inductor/graph.py, decide_layout_opt)
INDUCTOR_CHANNELS_LAST_COST = {"grouped": 1.358, "small": 0.783, "in_out": 0.725, "default": 0.823}
SMALL_CHANNELS = 64  # inductor's small convolution: this many input and output channels or fewer


@dataclass(frozen=True)
class Convolution:
    """A compiled graph's convolution as inductor's layout choice reads it: its weight's shape
    (output channels, input channels a group, the kernel's height and width), its groups and its FLOPs."""

    weight: tuple[int, ...]
    groups: int
    flops: float

    @property
    def grouped(self) -> bool:
        """Several groups of more than one input channel (a depthwise convolution is not)."""
        return self.groups > 1 and self.weight[1] > 1

    @property
    def small(self) -> bool:
        return self.weight[0] <= SMALL_CHANNELS and self.weight[1] <= SMALL_CHANNELS

    @property
    def narrowing(self) -> bool:
        """At least twice as many input channels a group as output channels, with a kernel wider than one."""
        return self.weight[0] * 2 <= self.weight[1] and self.weight[2] > 1

    def kind(self) -> str:
        """Its kind for inductor's measured costs (:data:`INDUCTOR_CHANNELS_LAST_COST`), in inductor's order."""
        if self.grouped:
            return "grouped"
        if self.small:
            return "small"
        return "in_out" if self.narrowing else "default"


def channels_first(tensor: torch.Tensor, weight: torch.Tensor, stride: list[int]) -> bool:
    """Whether cuDNN transposes the operands of a 2-D convolution of input ``tensor``: in half
    precision, neither it nor the weight laid out channels-last (torch runs a convolution channels-last
    where either is; a tensor of one position a channel is both), under a kernel of several taps or
    strides (a pointwise one is a matrix product of each image's channels-first rows)."""
    pointwise = weight.shape[2:].numel() == 1 and all(step == 1 for step in stride)
    return tensor.dim() == 4 and _half(tensor) and not pointwise and not laid_out_last(tensor, weight)


def laid_out_last(tensor: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether torch runs a convolution of input ``tensor`` and ``weight`` channels-last: either is."""
    return any(_channels_last(item) for item in (tensor, weight))


def off_tensor_cores(tensor: torch.Tensor, weight: torch.Tensor, groups: int) -> bool:
    """Whether a half-precision grouped convolution's groups fit no tile of the tensor cores'
    kernels where it runs channels-last (module docstring): a group's output channels neither a
    multiple of :data:`TILE_CHANNELS` nor a power of two below it."""
    width = weight.shape[0] // groups
    return groups > 1 and _half(tensor) and width % TILE_CHANNELS != 0 and TILE_CHANNELS % width != 0


def _half(tensor: torch.Tensor) -> bool:
    return tensor.dtype in (torch.float16, torch.bfloat16)


def _channels_last(tensor: torch.Tensor) -> bool:
    """Laid out channels-last (NHWC, NDHWC), and not channels-first as well."""
    last = torch.channels_last if tensor.dim() == 4 else torch.channels_last_3d
    return tensor.dim() in (4, 5) and tensor.is_contiguous(memory_format=last) and not tensor.is_contiguous()


def batch_format(model: torch.nn.Module) -> torch.memory_format:
    """The memory format of a run's batches: its model's (the channels_last method lays out both)."""
    laid_out_last = any(_channels_last(parameter) for parameter in model.parameters())
    return memory_format_for(model) if laid_out_last else torch.contiguous_format


def inductor_lays_out_channels_last(convolutions: list[Convolution], inference: bool) -> bool:
    """inductor's layout optimization of a compiled graph with ``convolutions``
    (torch/_inductor/graph.py, decide_layout_opt): an inference graph's channels-last where its
    measured costs, weighted by the convolutions' FLOPs, make it no slower; a training graph's unless
    a convolution is grouped or narrowing, or all are small."""
    if not convolutions:
        return False
    if inference:
        weighted = sum(INDUCTOR_CHANNELS_LAST_COST[item.kind()] * item.flops for item in convolutions)
        return weighted <= sum(item.flops for item in convolutions)
    kept_first = any(item.grouped or item.narrowing for item in convolutions)
    return not kept_first and not all(item.small for item in convolutions)


def laid_out_channels_last(operations: list, untiled: set[int]) -> list:
    """A compiled graph's ``operations`` once inductor lays it out channels-last: its convolutions'
    transposes gone, and its grouped convolutions at the positions ``untiled`` (those whose groups
    no tile fits) on the CUDA cores."""
    return [
        item._replace(kind=CUDA_CORES) if index in untiled else item
        for index, item in enumerate(operations)
        if not (item.kind == TRANSPOSE and item.compiled)
    ]
