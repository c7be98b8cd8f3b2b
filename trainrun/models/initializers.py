"""Weight initialisers of the published ResNet-50 recipes."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

from torch import nn


def kaiming_normal(module: nn.Module, num_classes: int) -> None:
    """He-normal weights (fan-in) for every convolution and linear layer."""
    if isinstance(module, nn.Conv2d | nn.Linear):
        nn.init.kaiming_normal_(module.weight)


def bn_uniform(module: nn.Module, num_classes: int) -> None:
    """BatchNorm scale drawn from U(0, 1), shift zero."""
    if isinstance(module, nn.modules.batchnorm._BatchNorm):
        nn.init.uniform_(module.weight)
        nn.init.zeros_(module.bias)


def linear_log_constant_bias(module: nn.Module, num_classes: int) -> None:
    """Linear biases at -ln(num_classes), so sigmoid outputs start near 1 / num_classes."""
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.constant_(module.bias, -math.log(num_classes))


INITIALIZERS: dict[str, Callable[[nn.Module, int], None]] = {
    "kaiming_normal": kaiming_normal,
    "bn_uniform": bn_uniform,
    "linear_log_constant_bias": linear_log_constant_bias,
}


def initialize(model: nn.Module, names: Iterable[str], num_classes: int) -> None:
    """Apply each named initialiser to every module, in the order given."""
    for name in names:
        model.apply(lambda module, init=INITIALIZERS[name]: init(module, num_classes))
