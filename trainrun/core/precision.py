"""Numeric precision of the forward pass: fp32, amp (fp16 + loss scaling) or bf16."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from dataclasses import dataclass

import torch


@dataclass
class Precision:
    """Autocast settings and, for fp16, the gradient scaler."""

    name: str
    device_type: str
    dtype: torch.dtype | None = None
    scaler: torch.amp.GradScaler | None = None

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """Step ``optimizer``: through the gradient scaler (which skips a step whose gradients
        overflowed, and updates its scale) under fp16, directly otherwise."""
        if self.scaler is None:
            optimizer.step()
            return
        self.scaler.step(optimizer)
        self.scaler.update()

    def autocast(self) -> contextlib.AbstractContextManager:
        """Context for the forward pass and the loss."""
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)


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


def resolve_precision(name: str, device: torch.device) -> tuple[Precision, list[str]]:
    """The precision to run ``name`` with on ``device``, and notes to show once."""
    if name == "fp32":
        return Precision(name, device.type), []
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
