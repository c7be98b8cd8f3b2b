"""Learning-rate schedules as pure functions of the optimizer step, applied every batch.

Times may be written in any unit. The timeline's scale-schedule ratio stretches every time written
in ``ep``/``ba``/``sp`` (the warmup too, unless ``scale_warmup`` is off, as Composer had it when
the published recipe points were measured); ``dur`` times follow the already-scaled run length.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from trainrun.core.time import Timeline
from trainrun.schema import SchedulerConfig


def multiplier(
    batch: int,
    *,
    shape: str,
    warmup: int,
    total: int,
    alpha_f: float = 0.0,
    step_size: int = 1,
    gamma: float = 0.1,
    milestones: Sequence[int] = (),
    cooldown: float = 1.0,
    power: float = 1.0,
    fraction: Callable[[int], float] | None = None,
) -> float:
    """LR multiplier after ``batch`` steps: linear warmup 0→1 over ``warmup``, then ``shape``.

    The decay follows ``fraction(step)``, the share of the run done (``step / total`` unless
    given: a budgeted run's comes from its re-planned timeline). ``step`` multiplies by ``gamma``
    every ``step_size`` steps, ``multistep`` at each of ``milestones`` reached; ``wsd`` holds 1
    until the last ``cooldown`` share of the decay, then falls linearly to ``alpha_f``; ``poly``
    falls as ``(1 - done) ** power``.
    """
    if batch < warmup:
        return batch / warmup
    if shape == "constant":
        return 1.0
    if shape == "step":
        return gamma ** (batch // max(step_size, 1))
    if shape == "multistep":
        return gamma ** sum(batch >= milestone for milestone in milestones)
    if fraction is None:
        tau = (batch - warmup) / max(total - warmup, 1)
    else:
        start = fraction(warmup)
        tau = (fraction(batch) - start) / (1.0 - start) if start < 1.0 else 1.0
    tau = min(max(tau, 0.0), 1.0)
    if shape == "cosine":
        return alpha_f + (1 - alpha_f) * (1 + math.cos(math.pi * tau)) / 2
    if shape == "linear":
        return 1.0 + (alpha_f - 1.0) * tau
    if shape == "poly":  # nnU-Net's PolyLRScheduler (stepped per epoch there, per step here)
        return alpha_f + (1.0 - alpha_f) * (1.0 - tau) ** power
    if shape == "wsd":  # warmup-stable-decay: constant, then linear to alpha_f over the last ``cooldown``
        return 1.0 + (alpha_f - 1.0) * max(0.0, tau - (1.0 - cooldown)) / cooldown
    raise ValueError(f"unknown schedule '{shape}'")


def warmup_batches(config: SchedulerConfig, timeline: Timeline) -> int:
    """Steps of linear warmup in this run."""
    return timeline.stretched_batches(config.t_warmup) if config.scale_warmup else timeline.to_batches(config.t_warmup)


def schedule_function(config: SchedulerConfig, timeline: Timeline) -> Callable[[int], float]:
    """The multiplier of ``config`` as a function of the step, for this run.

    Steps are converted when it is called, so a budgeted run's re-planned timeline applies.
    """

    def at(batch: int) -> float:
        return multiplier(
            batch,
            shape=config.name,
            warmup=warmup_batches(config, timeline),
            total=timeline.max_batches,
            alpha_f=config.alpha_f,
            step_size=timeline.stretched_batches(config.step_size),
            gamma=config.gamma,
            milestones=[timeline.stretched_batches(milestone) for milestone in config.milestones],
            cooldown=config.cooldown,
            power=config.power,
            fraction=timeline.fraction,
        )

    return at


def build_scheduler(
    optimizer: torch.optim.Optimizer, config: SchedulerConfig, timeline: Timeline
) -> torch.optim.lr_scheduler.LambdaLR:
    """A ``LambdaLR`` stepped once per optimizer step."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, schedule_function(config, timeline))
