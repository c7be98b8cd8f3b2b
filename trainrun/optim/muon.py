"""Muon for a transformer's hidden matrices and Adam for the rest, as one optimizer.

Muon (Keller Jordan, 2024) runs torch's update (``torch.optim.Muon``'s momentum, Nesterov, five
Newton-Schulz steps with its coefficients, and the ``sqrt(max(1, rows / cols))`` scale) in
:class:`MatrixMuon`, which adds what the speedrun's optimizer does and torch's does not: a matrix
that stacks several by rows (GPT's fused q, k, v: ``stacked_matrices()`` of the model) is
orthogonalised and scaled as its parts, each alone; the Newton-Schulz steps run batched over
matrices of one shape; and over several ranks (DDP: every rank holds the same averaged gradients)
each rank orthogonalises its share of the matrices and the updates are all-gathered, instead of
every rank orthogonalising every matrix. Momentum stays on every rank, so a checkpoint is rank 0's
as before. It takes 2-D matrices only, so the parameters are split by a rule the config names
(``optimizer.muon``), as the GPT-2 speedrun splits them:

- ``embeddings``: every ``nn.Embedding``'s table (a tied output head is the token table) → Adam at
  ``muon.embedding_lr``;
- ``head``: parameters of the output projection → Adam at ``muon.head_lr``: a module named in
  ``muon.head_modules``, or the one the model declares (transformers' ``get_output_embeddings()``,
  timm's ``get_classifier()``: a ConvNeXt's ``head.fc``, an EfficientNet's ``classifier``);
- ``scalars``: every parameter below 2-D (norm gains, biases) → Adam at ``muon.scalar_lr``;
- ``matrices``: every other 2-D parameter → Muon at ``optimizer.lr`` with ``optimizer.momentum``,
  ``optimizer.nesterov`` and decoupled ``optimizer.weight_decay``.

Adam uses ``optimizer.betas`` and ``optimizer.eps`` and no weight decay, in torch's fused kernel (one
pass over a parameter's gradient and state, as the speedrun's Adam; on FSDP2's shards too: the
kernel has a DTensor rule). Muon's momentum warms
linearly from ``muon.momentum_start`` to ``optimizer.momentum`` over ``muon.momentum_warmup``
(the speedrun's 0.85 → 0.95 over 300 steps). Why a class here: torch has no optimizer that
applies two update rules to one model's groups, and one ``Optimizer`` keeps the schedule, the
gradient scaler and checkpoints as they are for every other optimizer.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.optim._muon import DEFAULT_A, DEFAULT_B, DEFAULT_C, DEFAULT_NS_STEPS, EPS

from trainrun.errors import ConfigError
from trainrun.schema import MuonConfig, OptimizerConfig

ROLES = ("matrices", "embeddings", "head", "scalars")


def parameter_roles(model: nn.Module, head_modules: list[str]) -> dict[str, list[tuple[str, nn.Parameter]]]:
    """The trainable parameters of ``model`` by role (module docstring), each once (tied ones too)."""
    roles: dict[str, list[tuple[str, nn.Parameter]]] = {role: [] for role in ROLES}
    seen: set[int] = set()
    declared = declared_heads(model)
    modules = sorted(model.named_modules(), key=lambda item: not isinstance(item[1], nn.Embedding))
    for module_name, module in modules:  # embeddings first: a tied head's weight is the token table
        for name, param in module.named_parameters(recurse=False):
            if not param.requires_grad or id(param) in seen:
                continue
            seen.add(id(param))
            full = f"{module_name}.{name}" if module_name else name
            if isinstance(module, nn.Embedding):
                role = "embeddings"
            elif module_name.rsplit(".", 1)[-1] in head_modules or id(module) in declared:
                role = "head"
            elif param.ndim < 2:
                role = "scalars"
            elif param.ndim == 2:
                role = "matrices"
            else:
                raise ConfigError(
                    f"bad value for 'optimizer.name': 'muon' takes 2-D matrices, and {full} is "
                    f"{param.ndim}-D; use adamw or sgdw for this model"
                )
            roles[role].append((full, param))
    return roles


def declared_heads(model: nn.Module) -> set[int]:
    """The ids of the modules ``model`` (or a model inside it) declares as its output projection."""
    heads = set()
    for module in model.modules():
        for declaring in ("get_output_embeddings", "get_classifier"):
            head = getattr(module, declaring, None)
            head = head() if callable(head) else None
            if isinstance(head, nn.Module):
                heads.add(id(head))
    return heads


def check_head_modules(model: nn.Module, head_modules: list[str]) -> None:
    """Refuse a name a config gives in ``optimizer.muon.head_modules`` that is the last name of no
    module of ``model`` (the rule would move nothing to the head's rate, without a word). The
    default names GPT's head; on a model without one (BERT's tied decoder) it stays a no-op."""
    if list(head_modules) == MuonConfig().head_modules:
        return
    names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules() if name}
    for wanted in head_modules:
        if wanted not in names:
            known = ", ".join(sorted(n for n in names if not n.isdigit()))
            raise ConfigError(
                f"bad value for 'optimizer.muon.head_modules': '{wanted}' names no module of this model "
                f"(its modules are named: {known})"
            )


def orthogonalised(updates: torch.Tensor) -> torch.Tensor:
    """torch.optim.Muon's Newton-Schulz orthogonalisation (in bfloat16, a wide matrix's rows; five
    quintic steps) of a stack of matrices (count, rows, cols) at once."""
    x = updates.bfloat16()
    tall = x.size(-2) > x.size(-1)
    if tall:
        x = x.mT
    x = x / x.norm(dim=(-2, -1), keepdim=True).clamp(min=EPS)
    for _ in range(DEFAULT_NS_STEPS):
        gram = x @ x.mT
        x = torch.baddbmm(x, torch.baddbmm(gram, gram, gram, beta=DEFAULT_B, alpha=DEFAULT_C), x, beta=DEFAULT_A)
    return x.mT if tall else x


def shared_orthogonalised(stack: torch.Tensor) -> torch.Tensor:
    """:func:`orthogonalised` of ``stack``, each of the process group's ranks taking its share of the
    matrices and all-gathering the others' (every rank holds the same ``stack``)."""
    ranks = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    if ranks == 1:
        return orthogonalised(stack)
    share = math.ceil(len(stack) / ranks)
    missing = share * ranks - len(stack)
    padded = torch.cat([stack, stack.new_zeros(missing, *stack.shape[1:])]) if missing else stack
    mine = orthogonalised(padded[dist.get_rank() * share : (dist.get_rank() + 1) * share]).contiguous()
    gathered = mine.new_empty(share * ranks, *mine.shape[1:])
    dist.all_gather_into_tensor(gathered, mine)
    return gathered[: len(stack)]


class MatrixMuon(torch.optim.Optimizer):
    """torch.optim.Muon's update over 2-D matrices (module docstring), each matrix of ``stacked``
    taken as that many parts by rows."""

    def __init__(
        self,
        groups: list[dict[str, Any]],
        stacked: dict[nn.Parameter, int],
        *,
        momentum: float,
        nesterov: bool,
        weight_decay: float,
    ) -> None:
        super().__init__(groups, {"momentum": momentum, "nesterov": nesterov, "weight_decay": weight_decay})
        self.stacked_parts = {id(param): count for param, count in stacked.items()}

    @torch.no_grad()
    def step(self, closure=None):  # noqa: D102 - as torch.optim.Optimizer.step
        by_shape: dict[tuple[int, ...], list[tuple[nn.Parameter, dict[str, Any], torch.Tensor]]] = {}
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = self.state[param]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(param.grad)
                buffer = state["momentum_buffer"]
                buffer.lerp_(param.grad, 1 - group["momentum"])
                update = param.grad.lerp(buffer, group["momentum"]) if group["nesterov"] else buffer
                parts = update.view(self.stacked_parts.get(id(param), 1), -1, update.shape[-1])
                by_shape.setdefault(tuple(parts.shape[1:]), []).append((param, group, parts))
        for (rows, cols), entries in by_shape.items():
            done = shared_orthogonalised(torch.cat([parts for _, _, parts in entries])).split(
                [len(parts) for _, _, parts in entries]
            )
            for (param, group, _), update in zip(entries, done, strict=True):
                param.mul_(1 - group["lr"] * group["weight_decay"])
                param.add_(update.view_as(param), alpha=-group["lr"] * math.sqrt(max(1, rows / cols)))


class MuonWithAdam(torch.optim.Optimizer):
    """:class:`MatrixMuon` over the ``matrices`` groups and ``torch.optim.Adam`` over the others;
    ``param_groups`` are theirs (shared dicts), so a schedule scales every group's learning rate."""

    def __init__(
        self,
        muon_groups: list[dict[str, Any]],
        adam_groups: list[dict[str, Any]],
        stacked: dict[nn.Parameter, int],
        *,
        momentum: float,
        momentum_start: float,
        momentum_warmup_steps: int,
        nesterov: bool,
        weight_decay: float,
        betas: tuple[float, float],
        eps: float,
    ) -> None:
        self.momentum, self.momentum_start, self.momentum_warmup_steps = momentum, momentum_start, momentum_warmup_steps
        self.steps = 0
        first = self.momentum_at(0)  # Muon's groups always hold the momentum of the next step
        self.muon = MatrixMuon(muon_groups, stacked, momentum=first, nesterov=nesterov, weight_decay=weight_decay)
        self.adam = torch.optim.Adam(adam_groups, betas=betas, eps=eps, weight_decay=0.0, fused=True)
        super().__init__([*self.muon.param_groups, *self.adam.param_groups], {})

    @property
    def parts(self) -> tuple[torch.optim.Optimizer, ...]:
        """The optimizers that hold the state (what a memory count reads)."""
        return self.muon, self.adam

    def momentum_at(self, step: int) -> float:
        """Muon's momentum at optimizer step ``step``: linear from the start value to the final one."""
        if step >= self.momentum_warmup_steps:
            return self.momentum
        share = step / self.momentum_warmup_steps
        return self.momentum_start + (self.momentum - self.momentum_start) * share

    @torch.no_grad()
    def step(self, closure=None):  # noqa: D102 - as torch.optim.Optimizer.step
        self.muon.step()
        self.adam.step()
        self.steps += 1
        for group in self.muon.param_groups:
            group["momentum"] = self.momentum_at(self.steps)

    def state_dict(self) -> dict[str, Any]:  # noqa: D102 - both optimizers' states and the step count
        return {"muon": self.muon.state_dict(), "adam": self.adam.state_dict(), "steps": self.steps}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:  # noqa: D102
        self.muon.load_state_dict(state_dict["muon"])
        self.adam.load_state_dict(state_dict["adam"])
        self.steps = state_dict["steps"]
        self.param_groups = [*self.muon.param_groups, *self.adam.param_groups]


def build_muon(model: nn.Module, config: OptimizerConfig, lr_factor: float, momentum_warmup_steps: int) -> MuonWithAdam:
    """:class:`MuonWithAdam` over ``model``'s parameters split by ``config.muon``'s rule."""
    roles = parameter_roles(model, list(config.muon.head_modules))
    rates = {"embeddings": config.muon.embedding_lr, "head": config.muon.head_lr, "scalars": config.muon.scalar_lr}
    adam_groups = [
        {"params": [param for _, param in roles[role]], "lr": rate * lr_factor, "role": role}
        for role, rate in rates.items()
        if roles[role]
    ]
    muon_groups = [
        {"params": [param for _, param in roles["matrices"]], "lr": config.lr * lr_factor, "role": "matrices"}
    ]
    if not roles["matrices"]:
        raise ConfigError("bad value for 'optimizer.name': 'muon' found no 2-D hidden matrices in this model")
    check_head_modules(model, config.muon.head_modules)
    parts = model.stacked_matrices() if hasattr(model, "stacked_matrices") else {}
    stacked = {param: parts[name] for name, param in roles["matrices"] if name in parts}
    return MuonWithAdam(
        muon_groups,
        adam_groups,
        stacked,
        momentum=config.momentum,
        momentum_start=config.muon.momentum_start,
        momentum_warmup_steps=momentum_warmup_steps,
        nesterov=config.nesterov,
        weight_decay=config.weight_decay,
        betas=(config.betas[0], config.betas[1]),
        eps=config.eps,
    )
