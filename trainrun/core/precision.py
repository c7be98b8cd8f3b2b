"""Numeric precision of the forward pass: fp32, amp (fp16 + loss scaling), bf16, or fp8 (bf16
with torchao's float8 linear layers: each matrix product in float8 with dynamic per-tensor scales,
the output head left in bf16, as torchtitan and torchao's recipes do)."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import signal
import subprocess
import sys
from dataclasses import dataclass

import torch
from torch import nn

from trainrun.errors import ConfigError

FLOAT8_CAPABILITY = (8, 9)  # the first GPUs with float8 matrix units: Ada (L4, L40S), then Hopper, Blackwell


@dataclass
class Precision:
    """Autocast settings and, for fp16, the gradient scaler."""

    name: str
    device_type: str
    dtype: torch.dtype | None = None
    scaler: torch.amp.GradScaler | None = None
    float8: bool = False  # the linear layers' matrix products in float8 (torchao)
    float8_gathers: bool = False  # set by convert: FSDP2 gathers the float8 layers' weights in float8

    def convert(self, model: nn.Module, sharded: bool = False) -> None:
        """Under fp8, swap ``model``'s eligible linear layers for torchao's float8 training layers. A
        model FSDP2 will shard (``sharded``) gathers their weights in float8, half the bytes of a bf16
        gather, each cast once on its owner rank, with the scales of all of them computed together
        after every optimizer step (:meth:`step`), as torchao's and torchtitan's FSDP2 recipe does."""
        if self.float8:
            from torchao.float8 import Float8LinearConfig, convert_to_float8_training

            config = Float8LinearConfig(enable_fsdp_float8_all_gather=sharded)
            convert_to_float8_training(model, config=config, module_filter_fn=float8_eligible)
            self.float8_gathers = sharded

    def step(self, optimizer: torch.optim.Optimizer, model: nn.Module | None = None) -> None:
        """Step ``optimizer``: through the gradient scaler (which skips a step whose gradients
        overflowed, and updates its scale) under fp16, directly otherwise; then, where ``model``'s
        float8 weights are gathered in float8, their next scales (one all-reduce for all of them)."""
        if self.scaler is None:
            optimizer.step()
        else:
            self.scaler.step(optimizer)
            self.scaler.update()
        if self.float8_gathers and model is not None:
            from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

            precompute_float8_dynamic_scale_for_fsdp(model)

    def __post_init__(self) -> None:
        if self.dtype is not None:  # once a process, not at every forward
            autocast_grouped_products(self.device_type)

    def autocast(self) -> contextlib.AbstractContextManager:
        """Context for the forward pass and the loss: torch's autocast, with its rule for grouped matrix
        products (:func:`autocast_grouped_products`, given when the precision is made)."""
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)


# operations torch's autocast has no rule for that multiply matrices: the grouped products a mixture
# of experts runs its experts with (transformers' grouped_mm experts; pytorch/pytorch#174763). Without
# one, an expert's product reads the float32 weights autocast keeps and runs in float32: on a GPU,
# torch's fallback loop of float32 products instead of its bf16 grouped kernel.
AUTOCAST_PRODUCTS = ("_grouped_mm",)


@functools.cache
def autocast_grouped_products(device_type: str) -> torch.library.Library:
    """Give :data:`AUTOCAST_PRODUCTS` autocast's rule for matrix products on ``device_type``, once a
    process: their floating-point operands cast to autocast's dtype, as every other product's are.
    torch.library's ``register_autocast`` casts to one dtype fixed when it is registered; a process's
    runs may autocast to bf16 or fp16, so the kernel reads the dtype as it runs. A rule torch has of
    its own is kept."""
    key = "Autocast" + torch._C._dispatch_key_for_device(device_type)
    excluded = torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, key))
    library = torch.library.Library("aten", "IMPL")
    for name in AUTOCAST_PRODUCTS:
        if torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name}", key):
            continue
        operation = getattr(torch.ops.aten, name).default

        def kernel(_: object, *args: object, operation: torch._ops.OpOverload = operation) -> torch.Tensor:
            dtype = torch.get_autocast_dtype(device_type)
            cast = [
                value.to(dtype) if torch.is_tensor(value) and value.is_floating_point() else value for value in args
            ]
            with torch._C._ExcludeDispatchKeyGuard(excluded):
                return operation(*cast)

        library.impl(name, kernel, key, with_keyset=True)
    return library  # kept: the registration lasts as long as its library


_BF16_PROBE = (
    "import torch\n"
    "with torch.autocast('cpu', dtype=torch.bfloat16):\n"
    "    torch.nn.Linear(32, 10)(torch.randn(64, 32))\n"
)


def _limit_cpu_isa_if_amx_faults() -> str | None:
    """Some virtual machines advertise AMX but fault on it (SIGILL in oneDNN's bf16 kernels).

    Probe once in a child process; if it dies that way, keep oneDNN to AVX512-BF16 kernels for
    this process (the variable is read when the first oneDNN kernel is created).
    """
    if "ONEDNN_MAX_CPU_ISA" in os.environ:
        return None
    probe = subprocess.run([sys.executable, "-c", _BF16_PROBE], capture_output=True)
    if probe.returncode != -signal.SIGILL:
        return None
    os.environ["ONEDNN_MAX_CPU_ISA"] = "AVX512_CORE_BF16"
    return "this CPU faults on AMX bf16 kernels; limited oneDNN to AVX512_CORE_BF16 (ONEDNN_MAX_CPU_ISA)"


def float8_eligible(module: nn.Module, name: str) -> bool:
    """A linear layer whose sides float8 kernels take (multiples of 16), other than the output head."""
    return isinstance(module, nn.Linear) and name != "head" and module.in_features % 16 == module.out_features % 16 == 0


def check_float8(name: str, device_name: str) -> None:
    """precision=fp8 where it runs: a GPU of compute capability 8.9 or newer, with torchao installed;
    one line naming what is missing otherwise (checked before any process starts)."""
    if name != "fp8":
        return
    if device_name == "cpu" or not torch.cuda.is_available():
        raise ConfigError(
            "bad value for 'precision': 'fp8' needs a GPU with float8 matrix units (compute capability 8.9 or newer: "
            "L4, L40S, H100, H200, B200); this run has none (use precision=bf16)"
        )
    capability = torch.cuda.get_device_capability()
    if capability < FLOAT8_CAPABILITY:
        raise ConfigError(
            f"bad value for 'precision': 'fp8' needs compute capability 8.9 or newer; {torch.cuda.get_device_name()} "
            f"has {capability[0]}.{capability[1]} (use precision=bf16)"
        )
    if importlib.util.find_spec("torchao") is None:
        raise ConfigError(
            "bad value for 'precision': 'fp8' trains through torchao's float8 layers: pip install torchao"
        )


# Measured (docs/benchmarks.md, 2026-11-26): Llama 3.2 1B's step on an H200, 2 x 4,096 tokens.
FP8_EAGER = (
    "precision=fp8 without compile=true runs torchao's float8 casts as separate kernels: slower than bf16 "
    "(0.44x of its tokens/s for Llama 3.2 1B on an H200); add compile=true"
)


def resolve_precision(name: str, device: torch.device, compiled: bool = False) -> tuple[Precision, list[str]]:
    """The precision to run ``name`` with on ``device`` (a model ``compiled`` or not), and notes to show once."""
    if name == "fp32":
        return Precision(name, device.type), []
    if name == "fp8":
        check_float8(name, device.type)
        eager = [] if compiled else [FP8_EAGER]
        return Precision(name, device.type, torch.bfloat16, float8=True), eager
    if device.type == "cuda":
        if name == "bf16" and torch.cuda.is_bf16_supported(including_emulation=False):
            return Precision(name, device.type, torch.bfloat16), []
        fp16 = Precision("amp", device.type, torch.float16, torch.amp.GradScaler("cuda"))
        if name == "bf16":  # V100, T4: no bf16 tensor cores
            return fp16, [f"{torch.cuda.get_device_name(device)} has no bf16 arithmetic: precision=bf16 runs fp16 amp"]
        return fp16, []
    notes = [note] if (note := _limit_cpu_isa_if_amx_faults()) else []
    if name == "amp":
        notes.append("precision=amp needs CUDA for fp16 loss scaling; on this CPU it runs bf16 autocast instead")
    return Precision(name, device.type, torch.bfloat16), notes
