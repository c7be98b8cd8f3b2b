"""What a model offers the methods that change it: one small protocol per model
:class:`~trainrun.kinds.Capability`.

A model's spec declares what it offers (``offers``), so validation refuses a method before any
process starts; the model implements the protocol, which the method calls instead of reaching into
the model's attributes. A test builds every registered model and checks that the two agree.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from trainrun.kinds import Capability


@runtime_checkable
class AlibiAttention(Protocol):
    def use_alibi(self, max_sequence_length: int) -> None:
        """Drop the learned positions and attend with ALiBi's distance bias, for sequences up to
        ``max_sequence_length`` tokens."""


@runtime_checkable
class WindowedAttention(Protocol):
    def set_window(self, tokens: int) -> None:
        """Attend through a sliding window of ``tokens`` (itself and ``tokens - 1`` before it)."""


@runtime_checkable
class Unpaddable(Protocol):
    def use_unpadding(self) -> None:
        """Run every layer but attention on the real tokens only."""


@runtime_checkable
class MaskedPositionsHead(Protocol):
    def use_masked_head(self) -> None:
        """Score only the positions a training batch predicts."""


PROTOCOLS: dict[Capability, type] = {
    Capability.ALIBI: AlibiAttention,
    Capability.ATTENTION_WINDOW: WindowedAttention,
    Capability.UNPADDING: Unpaddable,
    Capability.MASKED_HEAD: MaskedPositionsHead,
}


def offered(model: object) -> frozenset[Capability]:
    """The capabilities with a protocol that ``model`` implements."""
    return frozenset(capability for capability, protocol in PROTOCOLS.items() if isinstance(model, protocol))
