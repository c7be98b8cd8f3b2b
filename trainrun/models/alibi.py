"""ALiBi's per-head slopes (Press et al., 2021), which trainrun's BERT and GPT attend with once
the alibi method (or ``model.gpt.positions=alibi``) asks them to."""

from __future__ import annotations

import math

import torch


def alibi_slopes(heads: int) -> torch.Tensor:
    """The per-head slopes of Press et al. (their reference rule for any number of heads)."""
    power = 2 ** math.floor(math.log2(heads))
    slopes = [2 ** (-8 * k / power) for k in range(1, power + 1)]
    # the rest: the odd-indexed slopes 2^(-8k / 2·power), k = 1, 3, 5, ... of the set for twice the power
    slopes += [2 ** (-8 * k / (2 * power)) for k in range(1, 2 * (heads - power), 2)]
    return torch.tensor(slopes)
