"""The masked-language-model head on the masked positions only (NVIDIA's ``dense_seq_output``).

BERT's output layer maps every position's hidden state to vocabulary logits, but the loss reads
only the masked positions, about ``mlm_probability`` of them. At AFTER_DATALOADER this method adds
``predict`` (the positions whose label is not -100) to the batch's inputs; the model then runs its
head on those rows alone and returns their logits, in the row-major order of the mask, which is
the order the loss takes the labels in. The loss, and so the gradient, is the full head's; the
head's work falls to the masked share (an eighth of it at the usual 15 %, less the padding).
Evaluation keeps the full head.
"""

from trainrun.core.engine import Algorithm
from trainrun.core.events import Event
from trainrun.core.state import State
from trainrun.data.masked_text import IGNORED
from trainrun.schema import MaskedHeadConfig


class MaskedHead(Algorithm):
    name = "masked_head"
    events = frozenset({Event.AFTER_DATALOADER})

    def apply(self, event: Event, state: State) -> None:
        state.inputs = {**state.inputs, "predict": state.targets != IGNORED}


def build(config: MaskedHeadConfig) -> MaskedHead:
    return MaskedHead()
