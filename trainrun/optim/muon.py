"""Muon for a transformer's hidden matrices and Adam for the rest, as one optimizer.

Muon (Keller Jordan, 2024) runs as ``torch.optim.Muon``: momentum, Nesterov, five Newton-Schulz
steps that orthogonalise the update and the ``sqrt(max(1, rows / cols))`` scale are torch's. It
takes 2-D matrices only, so the parameters are split by a rule the config names
(``optimizer.muon``), as the GPT-2 speedrun splits them:

- ``embeddings``: every ``nn.Embedding``'s table (a tied output head is the token table) → Adam at
  ``muon.embedding_lr``;
- ``head``: parameters of a module named in ``muon.head_modules`` (the output projection) → Adam
  at ``muon.head_lr``;
- ``scalars``: every parameter below 2-D (norm gains, biases) → Adam at ``muon.scalar_lr``;
- ``matrices``: every other 2-D parameter → Muon at ``optimizer.lr`` with ``optimizer.momentum``,
  ``optimizer.nesterov`` and decoupled ``optimizer.weight_decay``.

Adam uses ``optimizer.betas`` and ``optimizer.eps`` and no weight decay. Muon's momentum warms
linearly from ``muon.momentum_start`` to ``optimizer.momentum`` over ``muon.momentum_warmup``
(the speedrun's 0.85 → 0.95 over 300 steps). Why a class here: torch has no optimizer that
applies two update rules to one model's groups, and one ``Optimizer`` keeps the schedule, the
gradient scaler and checkpoints as they are for every other optimizer.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from trainrun.errors import ConfigError
from trainrun.schema import MuonConfig, OptimizerConfig

ROLES = ("matrices", "embeddings", "head", "scalars")


def parameter_roles(model: nn.Module, head_modules: list[str]) -> dict[str, list[tuple[str, nn.Parameter]]]:
    """The trainable parameters of ``model`` by role (module docstring), each once (tied ones too)."""
    roles: dict[str, list[tuple[str, nn.Parameter]]] = {role: [] for role in ROLES}
    seen: set[int] = set()
    modules = sorted(model.named_modules(), key=lambda item: not isinstance(item[1], nn.Embedding))
    for module_name, module in modules:  # embeddings first: a tied head's weight is the token table
        for name, param in module.named_parameters(recurse=False):
            if not param.requires_grad or id(param) in seen:
                continue
            seen.add(id(param))
            full = f"{module_name}.{name}" if module_name else name
            if isinstance(module, nn.Embedding):
                role = "embeddings"
            elif module_name.rsplit(".", 1)[-1] in head_modules:
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


class MuonWithAdam(torch.optim.Optimizer):
    """``torch.optim.Muon`` over the ``matrices`` groups and ``torch.optim.Adam`` over the others;
    ``param_groups`` are theirs (shared dicts), so a schedule scales every group's learning rate."""

    def __init__(
        self,
        muon_groups: list[dict[str, Any]],
        adam_groups: list[dict[str, Any]],
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
        self.muon = torch.optim.Muon(muon_groups, momentum=first, nesterov=nesterov, weight_decay=weight_decay)
        self.adam = torch.optim.Adam(adam_groups, betas=betas, eps=eps, weight_decay=0.0, foreach=True)
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
    return MuonWithAdam(
        muon_groups,
        adam_groups,
        momentum=config.momentum,
        momentum_start=config.muon.momentum_start,
        momentum_warmup_steps=momentum_warmup_steps,
        nesterov=config.nesterov,
        weight_decay=config.weight_decay,
        betas=(config.betas[0], config.betas[1]),
        eps=config.eps,
    )
