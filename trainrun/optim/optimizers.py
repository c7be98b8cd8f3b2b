"""SGD with decoupled weight decay (Loshchilov & Hutter, 2019), and the optimizer factory
(torch's AdamW; timm's LAMB, which behaves as NVIDIA's FusedLAMB that MLPerf BERT runs; Muon with
Adam, trainrun/optim/muon.py).

torch's ``SGD`` adds ``weight_decay * w`` to the gradient, so the decay is scaled by the learning
rate and by momentum. Here the decay is applied to the weights directly and follows the
schedule's *multiplier* (``lr / peak_lr``), not the LR's peak value: ``weight_decay=5e-4`` means
the same regularisation at lr 0.1 and at lr 2.048.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from trainrun.core import parallel
from trainrun.core.time import Timeline
from trainrun.optim.muon import build_muon
from trainrun.schema import OptimizerConfig


class DecoupledSGDW(torch.optim.SGD):
    """``torch.optim.SGD`` whose weight decay is decoupled from the gradient and the LR peak.

    The update runs in torch's fused SGD kernel, which takes the gradient scaler's ``found_inf``
    and ``grad_scale`` on the device: under fp16 ``GradScaler.step`` reads nothing back to the
    host, and a step it skips leaves the weights (decay included) untouched. FSDP2's shards
    (DTensors) take torch's foreach path instead (``fused=False``): the fused kernel has no DTensor
    rule, and fp16 loss scaling does not run under ``parallel=fsdp``.

    The momentum buffers are made here, zero, before a parameter's first step: torch's fused path
    makes them with ``empty_like`` and fills them in the kernel, which returns early on a skipped
    step, so an fp16 run whose first step overflowed (the usual start, from a scale of 2^16)
    carried uninitialised memory as momentum into its first real step (weights of 1e25, NaN
    batch-norm statistics: every ResNet-50 recipe under ``precision=amp`` on an H200, 2026-11-25).
    A group's first step runs without dampening, so the buffer is the gradient, as in torch (with
    ``dampening`` d > 0 and that first step skipped, the first step taken keeps (1 - d) of it).
    """

    def __init__(self, params: Iterable, lr: float, weight_decay: float = 0.0, fused: bool = True, **kwargs) -> None:
        super().__init__(params, lr=lr, weight_decay=0.0, fused=fused, foreach=not fused, **kwargs)
        for group in self.param_groups:
            group["decoupled_weight_decay"] = group.pop("decoupled_weight_decay", weight_decay)
            group["peak_lr"] = group["lr"]

    @torch.no_grad()
    def step(self, closure=None):  # noqa: D102 - as torch.optim.SGD.step
        found_inf = getattr(self, "found_inf", None)  # set by GradScaler.step for the fused kernel
        first_steps = []
        for group in self.param_groups:
            decay = group["decoupled_weight_decay"] * group["lr"] / group["peak_lr"]
            params = [p for p in group["params"] if p.grad is not None]
            if decay and params:
                # skipped steps (found_inf = 1) do not decay either, decided on the device
                torch._foreach_mul_(params, 1.0 - decay if found_inf is None else 1.0 - decay * (1.0 - found_inf))
            fresh = [p for p in params if group["momentum"] and "momentum_buffer" not in self.state[p]]
            for param in fresh:
                self.state[param]["momentum_buffer"] = torch.zeros_like(param)
            if fresh and len(fresh) == len(params):
                first_steps.append((group, group["dampening"]))
                group["dampening"] = 0.0
        try:
            return super().step(closure)
        finally:
            for group, dampening in first_steps:
                group["dampening"] = dampening


# the normalisation layers whose gains ``exclude_norm_and_bias`` leaves undecayed: batch, instance,
# group, layer and RMS norms (Llama's, the GPT's rmsnorm)
NORMS = (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm, nn.RMSNorm)


def _param_groups(model: nn.Module, exclude_norm_and_bias: bool) -> list[dict]:
    if not exclude_norm_and_bias:
        return [{"params": [p for p in model.parameters() if p.requires_grad]}]
    decayed, exempt, seen = [], [], set()
    for module in model.modules():
        is_norm = isinstance(module, NORMS)
        for name, param in module.named_parameters(recurse=False):
            if param.requires_grad and id(param) not in seen:  # tied weights are registered in two modules
                seen.add(id(param))
                (exempt if is_norm or name == "bias" else decayed).append(param)
    return [{"params": decayed}, {"params": exempt, "decoupled_weight_decay": 0.0, "weight_decay": 0.0}]


def build_optimizer(
    model: nn.Module, config: OptimizerConfig, global_batch_size: int, timeline: Timeline | None = None
) -> torch.optim.Optimizer:
    """Decoupled SGDW, torch's SGD, AdamW, timm's LAMB, torch's RAdam or Muon with Adam over the model's trainable
    parameters (``timeline`` converts Muon's momentum warmup to steps; none: no warmup).

    LAMB applies its trust ratio only where weight decay is on, so with ``exclude_norm_and_bias``
    norm and bias parameters get neither, as the MLPerf reference has it.

    With ``lr_scaling=linear`` the learning rate is ``lr · global_batch_size / reference_batch_size``.
    """
    factor = global_batch_size / config.reference_batch_size if config.lr_scaling == "linear" else 1.0
    if config.name == "muon":
        warmup = timeline.stretched_batches(config.muon.momentum_warmup) if timeline is not None else 0
        return build_muon(model, config, factor, warmup)
    lr = config.lr * factor
    groups = _param_groups(model, config.exclude_norm_and_bias)
    if config.name in ("sgdw", "sgd"):
        sgd = {"lr": lr, "weight_decay": config.weight_decay, "momentum": config.momentum}
        sgd |= {"dampening": config.dampening, "nesterov": config.nesterov}
        if config.name == "sgdw":
            return DecoupledSGDW(groups, **sgd, fused=not parallel.is_sharded(model))
        # L2 weight decay, scaled by the lr and by momentum: nnU-Net's. foreach, not the fused
        # kernel: GradScaler skips an overflowing step before it runs
        return torch.optim.SGD(groups, **sgd, foreach=True)
    if config.name == "lamb":
        from timm.optim import Lamb

        return Lamb(
            groups,
            lr=lr,
            betas=tuple(config.betas),
            eps=config.eps,
            weight_decay=config.weight_decay,
            max_grad_norm=config.max_grad_norm,
        )
    if config.name == "radam":  # L2 weight decay, torch's default, as Composer's UNet recipe ran it
        return torch.optim.RAdam(
            groups, lr=lr, betas=tuple(config.betas), eps=config.eps, weight_decay=config.weight_decay, foreach=True
        )
    return torch.optim.AdamW(  # fused on FSDP2's shards too: its kernel has a DTensor rule
        groups, lr=lr, betas=tuple(config.betas), eps=config.eps, weight_decay=config.weight_decay, fused=True
    )
