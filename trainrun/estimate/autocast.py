"""A fake pass's calls in the precisions a GPU's autocast gives them (:class:`AsGpuAutocast`), so
that the operations the estimate times (:mod:`trainrun.estimate.operations`) move the bytes the
GPU's do, and in every precision a GPU's kernels take them (:class:`AsGpuGroupedProducts`). Written
here because torch's CPU autocast, which a fake pass runs under, follows the CPU's policy, not
CUDA's, and torch's fake grouped products refuse precisions its CUDA kernels run."""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

# torch's CUDA autocast policy (aten/src/ATen/autocast_mode.h), by the Python name a call reaches it
# through: these compute in float32 from lower-precision inputs cast first (FP32) or read as they are
# (SET_DTYPE: the kernel's dtype argument). CPU autocast, which the fake pass runs under, lists
# neither norms nor softmax, so without it a GPU's float32 LayerNorm would be timed at half its bytes.
GPU_AUTOCAST_FP32 = frozenset(
    "acos asin cosh erfinv exp expm1 log log10 log2 log1p reciprocal rsqrt sinh tan pow __pow__ __rpow__ "
    "softplus layer_norm group_norm norm cosine_similarity poisson_nll_loss cosine_embedding_loss nll_loss "
    "hinge_embedding_loss kl_div l1_loss smooth_l1_loss huber_loss mse_loss margin_ranking_loss "
    "multilabel_margin_loss soft_margin_loss triplet_margin_loss multi_margin_loss "
    "binary_cross_entropy_with_logits dist pdist cdist renorm logsumexp".split()
)
GPU_AUTOCAST_SET_DTYPE = frozenset("prod softmax log_softmax cumprod cumsum sum vector_norm matrix_norm".split())
GPU_AUTOCAST_FLOAT32 = GPU_AUTOCAST_FP32 | GPU_AUTOCAST_SET_DTYPE
LOWER_PRECISION = (torch.float16, torch.bfloat16)


class AsGpuAutocast(TorchFunctionMode):
    """A fake pass under CPU autocast given the GPU's autocast policy: the calls CUDA's autocast
    runs in float32 (:data:`GPU_AUTOCAST_FP32`, :data:`GPU_AUTOCAST_SET_DTYPE`) run in float32 here
    too, so their bytes (and the casts around them) are those the GPU moves."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", None)
        if name not in GPU_AUTOCAST_FLOAT32 or not torch.is_autocast_enabled("cpu"):
            return func(*args, **kwargs)
        leaves = pytree.tree_leaves((args, kwargs))
        if any(isinstance(leaf, torch.Tensor) and leaf.dtype in LOWER_PRECISION for leaf in leaves):
            if name in GPU_AUTOCAST_SET_DTYPE:
                kwargs = {**kwargs, "dtype": kwargs.get("dtype") or torch.float32}
            else:
                args, kwargs = pytree.tree_map_only(torch.Tensor, _as_float32, (args, kwargs))
        return func(*args, **kwargs)


def _as_float32(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.float() if tensor.dtype in LOWER_PRECISION else tensor


class AsGpuGroupedProducts(TorchDispatchMode):
    """Fake grouped matrix products (a mixture of experts' experts) in float32 and fp16 as well as bf16,
    as torch's CUDA kernel takes them (its grouped kernel for bf16 on Hopper and Blackwell, a loop of
    products otherwise). torch's fake kernel takes bf16 alone (fp16 only where cuBLASLt's grouped GEMM
    runs), so the pass takes its output's shape from a bf16 one, in the operands' precision. Entered
    just inside the fake mode: the modes above it see the products as they are."""

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func.overloadpacket is not torch.ops.aten._grouped_mm or args[0].dtype == torch.bfloat16:
            return func(*args, **kwargs)
        dtype = kwargs.pop("out_dtype", None) or args[0].dtype
        as_bf16 = pytree.tree_map_only(torch.Tensor, _as_bfloat16, (args, kwargs))
        return func(*as_bf16[0], **as_bf16[1]).to(dtype)


def _as_bfloat16(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to(torch.bfloat16) if tensor.is_floating_point() else tensor
