"""Unpadding (NVIDIA's MLPerf BERT, Mosaic BERT): no work on padding tokens outside attention.

A padded batch of ``B`` sequences of ``S`` tokens spends every projection, feed-forward layer,
LayerNorm and dropout on ``B·S`` rows, pads included. At INIT this switches trainrun's BERT to its
unpadded forward: the encoder keeps only the real tokens' rows (from ``attention_mask``) and
re-pads them only inside attention, whose kernel takes dense (batch, heads, sequence) tensors. The
outputs and gradients are the padded model's; the per-token work falls by the padding fraction,
which is large for documents padded to ``max_seq_len`` (``data.text.packing=pad``) and nil for packed
sequences. The weights stay Hugging Face BERT's own.
"""

from torch.nn import Module

from trainrun.core.engine import Algorithm
from trainrun.core.events import Event
from trainrun.core.state import State
from trainrun.errors import ConfigError
from trainrun.models.capabilities import Unpaddable


class Unpadding(Algorithm):
    name = "unpadding"
    events = frozenset({Event.INIT})

    def apply(self, event: Event, state: State) -> None:
        self.rebuild(state.raw_model)

    def rebuild(self, model: Module) -> None:
        if not isinstance(model, Unpaddable):
            raise ConfigError(f"algorithm 'unpadding' needs trainrun's BERT (model=bert_*), not {type(model).__name__}")
        model.use_unpadding()
