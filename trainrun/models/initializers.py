"""Weight initialisers of the published ResNet-50 recipes."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

from torch import nn

from trainrun.errors import ConfigError
from trainrun.schema import INITIALIZERS as DEFAULT_INITIALIZERS


def kaiming_normal(module: nn.Module, num_classes: int) -> bool:
    """He-normal weights (fan-in) for every convolution and linear layer."""
    if isinstance(module, nn.Conv2d | nn.Linear):
        nn.init.kaiming_normal_(module.weight)
        return True
    return False


def bn_uniform(module: nn.Module, num_classes: int) -> bool:
    """BatchNorm scale drawn from U(0, 1), shift zero."""
    if isinstance(module, nn.modules.batchnorm._BatchNorm):
        nn.init.uniform_(module.weight)
        nn.init.zeros_(module.bias)
        return True
    return False


def linear_log_constant_bias(module: nn.Module, num_classes: int) -> bool:
    """Linear biases at -ln(num_classes), so sigmoid outputs start near 1 / num_classes."""
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.constant_(module.bias, -math.log(num_classes))
        return True
    return False


INITIALIZERS: dict[str, Callable[[nn.Module, int], bool]] = {
    "kaiming_normal": kaiming_normal,
    "bn_uniform": bn_uniform,
    "linear_log_constant_bias": linear_log_constant_bias,
}


def initialize(model: nn.Module, names: Iterable[str], num_classes: int) -> None:
    """Apply each named initialiser to every module, in the order given. One a config names that
    finds no module to initialise is refused naming it (it would change nothing, without a word);
    the default list is the ResNet-50 recipes', whose BatchNorm initialiser a GroupNorm model lacks."""
    given = list(names) != list(DEFAULT_INITIALIZERS)
    for name in names:
        if not sum(INITIALIZERS[name](module, num_classes) for module in model.modules()) and given:
            raise ConfigError(
                f"bad value for 'model.initializers': '{name}' finds no layer to initialise in this model"
            )
