"""The masked-language-model head on the masked positions only (NVIDIA's ``dense_seq_output``).

BERT's output layer maps every position's hidden state to vocabulary logits, but the loss reads
only the masked positions, about ``mlm_probability`` of them. At INIT this switches trainrun's
BERT to run its head on the batch's ``predict_positions`` alone (sent by the loader, padded per
batch to a few slots more than the most any sequence has) and return their logits; the loss
scores them against the slots' labels. The loss, and so the gradient, is the full head's; the
head's work falls to the masked share (about an eighth of it at the usual 15 %, less the padding).
Evaluation always runs the head on the predicted positions alone, with or without this method.
"""

from torch.nn import Module

from trainrun.core.engine import Algorithm
from trainrun.core.events import Event
from trainrun.core.state import State
from trainrun.errors import ConfigError
from trainrun.models.capabilities import MaskedPositionsHead


class MaskedHead(Algorithm):
    name = "masked_head"
    events = frozenset({Event.INIT})

    def apply(self, event: Event, state: State) -> None:
        self.rebuild(state.raw_model)

    def rebuild(self, model: Module) -> None:
        if not isinstance(model, MaskedPositionsHead):
            raise ConfigError(
                f"algorithm 'masked_head' needs trainrun's BERT (model=bert_*), not {type(model).__name__}"
            )
        model.use_masked_head()
