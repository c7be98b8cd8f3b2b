"""Numeric precision of the forward pass: fp32, amp (fp16 + loss scaling) or bf16."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Optional

import torch


@dataclass
class Precision:
    """Autocast settings and, for fp16, the gradient scaler."""

    name: str
    device_type: str
    dtype: Optional[torch.dtype] = None
    scaler: Optional[torch.amp.GradScaler] = None

    def autocast(self) -> contextlib.AbstractContextManager:
        """Context for the forward pass and the loss."""
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)


def resolve_precision(name: str, device: torch.device) -> tuple[Precision, Optional[str]]:
    """The precision to run ``name`` with on ``device``, and a note to show once if it differs."""
    if name == "fp32":
        return Precision(name, device.type), None
    if name == "bf16":
        return Precision(name, device.type, torch.bfloat16), None
    if device.type == "cuda":
        return Precision(name, device.type, torch.float16, torch.amp.GradScaler("cuda")), None
    note = "precision=amp needs CUDA for fp16 loss scaling; on this CPU it runs bf16 autocast instead"
    return Precision(name, device.type, torch.bfloat16), note
