"""Random streams keyed to what they are for, so that no run needs to save one.

A sample's augmentation is keyed to (seed, epoch, sample) and a rank's draws in a training step
(MixUp and CutMix λ, stochastic depth, dropout, ...) to (seed, step, rank). A run resumed from a
checkpoint, on the same or another number of ranks, then draws what an uninterrupted run with
that many ranks draws, without any random state in the checkpoint.
"""

from __future__ import annotations

import random

import numpy as np
import torch


def keyed_seed(*keys: int) -> int:
    """A 64-bit seed mixed from ``keys`` by NumPy's ``SeedSequence`` (nearby keys, unrelated seeds)."""
    return int(np.random.SeedSequence([key % 2**64 for key in keys]).generate_state(1, np.uint64)[0])


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (all devices)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


STEP_STREAM = 1  # keeps the steps' seeds apart from the samples' (seed, epoch, sample)


def seed_step(seed: int, step: int, rank: int, device: torch.device) -> None:
    """Seed torch's CPU generator and ``device``'s (the streams a step draws from) for ``step`` on ``rank``.

    A host-side set of each generator's seed: nothing is read back from or waited for on the device.
    """
    value = keyed_seed(seed, STEP_STREAM, step, rank)
    torch.default_generator.manual_seed(value)
    if device.type == "cuda":  # a run's device has its index (distributed.select_device)
        torch.cuda.default_generators[device.index].manual_seed(value)


def draws_state(device: torch.device) -> list[torch.Tensor]:
    """The state of the generators a step draws from (torch's CPU one and ``device``'s)."""
    return [torch.get_rng_state(), *([torch.cuda.get_rng_state(device)] if device.type == "cuda" else [])]


def restore_draws(saved: list[torch.Tensor], device: torch.device) -> None:
    """The generators as :func:`draws_state` saved them."""
    torch.set_rng_state(saved[0])
    if device.type == "cuda":
        torch.cuda.set_rng_state(saved[1], device)
