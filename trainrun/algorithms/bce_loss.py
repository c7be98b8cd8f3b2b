"""Binary cross-entropy: one sigmoid per class in place of the softmax (Wightman et al., 2021).

At INIT the run's loss becomes BCE-with-logits on one-hot (or mixed / smoothed) targets, summed
over classes and divided by the batch size, as the published recipes compute it. With
``bias_init`` the classifier's bias starts at −ln(C), so every sigmoid starts near 1/C and the
first steps are not spent pushing 999 outputs down.
"""

from torch import nn

from trainrun.core.engine import Algorithm
from trainrun.core.events import Event
from trainrun.core.state import State
from trainrun.errors import ConfigError
from trainrun.models.initializers import linear_log_constant_bias
from trainrun.tasks.losses import binary_cross_entropy


def classifier(model: nn.Module) -> nn.Linear | None:
    """The model's last linear layer, if it has one."""
    linears = [module for module in model.modules() if isinstance(module, nn.Linear)]
    return linears[-1] if linears else None


class BCELoss(Algorithm):
    name = "bce_loss"
    events = frozenset({Event.INIT})

    def apply(self, event: Event, state: State) -> None:
        state.loss_fn = binary_cross_entropy
        if not self.config.bias_init:
            return
        linear = classifier(state.raw_model)
        if linear is None:
            model = type(state.raw_model).__name__
            raise ConfigError(f"algorithm 'bce_loss' with bias_init=true needs a linear classifier; {model} has none")
        linear_log_constant_bias(linear, state.num_classes)
