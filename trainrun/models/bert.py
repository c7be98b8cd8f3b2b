"""BERT for masked-language-model pretraining: Hugging Face's ``BertForMaskedLM``, built from a config.

No weights are downloaded. Attention runs through ``torch.nn.functional.scaled_dot_product_attention``
(``attn_implementation="sdpa"``), which picks the fused Flash or memory-efficient kernel where the
device has one. :class:`MaskedLanguageModel` gives the trainer the ``model(inputs) -> outputs``
interface every task uses; ``.bert`` is the Hugging Face model itself, which
``save_pretrained`` and ``transformers`` read as any other.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend

from trainrun.schema import ModelConfig


class MaskedLanguageModel(nn.Module):
    """A Hugging Face masked-language model taking the batch's ``input_ids`` and ``attention_mask``."""

    def __init__(self, bert: nn.Module) -> None:
        super().__init__()
        self.bert = bert
        # set by the alibi algorithm: one slope per head (a buffer, so it moves with the model)
        self.register_buffer("alibi_slopes", None, persistent=False)
        self._alibi_biases: dict[tuple[int, torch.dtype, torch.device], torch.Tensor] = {}
        self.unpad = False  # set by the unpadding algorithm: no work on padding outside attention

    def attention_mask(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """The batch's (batch, sequence) mask, or with ALiBi the additive (batch, heads, query,
        key) mask: ``-slope * |i - j|`` plus the dtype's minimum at padding keys, in the dtype
        attention computes in (``scaled_dot_product_attention`` wants the query's)."""
        mask = inputs["attention_mask"]
        if self.alibi_slopes is None:
            return mask
        device = mask.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else torch.float32
        padding = torch.where(mask[:, None, None, :].bool(), 0.0, torch.finfo(dtype).min).to(dtype)
        return self._alibi_bias(mask.shape[1], dtype, mask.device)[None] + padding

    def _alibi_bias(self, length: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """(heads, length, length) ``-slope * |i - j|``, built once per length, dtype and device."""
        key = (length, dtype, device)
        if key not in self._alibi_biases:
            positions = torch.arange(length, device=device)
            distance = (positions[:, None] - positions[None, :]).abs().to(dtype)
            self._alibi_biases[key] = -self.alibi_slopes.to(device, dtype)[:, None, None] * distance
        return self._alibi_biases[key]

    def attention_kernels(self, length: int, dtype: torch.dtype, device: torch.device, alibi: bool) -> str:
        """Which kernel ``scaled_dot_product_attention`` picks for this model's training attention
        at ``length`` tokens, as torch's dispatcher chooses it, with and without padding: Flash
        needs no dropout (on some devices) and no additive mask; ALiBi's biases are one."""
        attention = self.bert.base_model.encoder.layer[0].attention.self
        heads, size = attention.num_attention_heads, attention.attention_head_size
        query = torch.empty(2, heads, length, size, dtype=dtype, device=device)
        padding = torch.ones(2, 1, 1, length, dtype=torch.bool, device=device)
        masks = {"unpadded batches": None, "padded batches": padding}
        if alibi:
            masks = {"ALiBi biases": torch.zeros(2, heads, length, length, dtype=dtype, device=device)}
        chosen = {}
        for case, mask in masks.items():
            choice = torch._fused_sdp_choice(query, query, query, mask, attention.dropout.p, False)
            chosen[case] = SDPBackend(choice).name.lower().replace("_attention", "")
        return ", ".join(f"{kernel} ({case})" for case, kernel in chosen.items())

    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """Logits (batch, sequence, vocabulary); with a boolean ``predict`` (batch, sequence) in the
        inputs, only those positions' logits (positions, vocabulary), in row-major order."""
        if self.unpad:
            return self._forward_unpadded(inputs)
        if "predict" not in inputs:
            return self.bert(input_ids=inputs["input_ids"], attention_mask=self.attention_mask(inputs)).logits
        hidden = self.bert.base_model(
            input_ids=inputs["input_ids"], attention_mask=self.attention_mask(inputs)
        ).last_hidden_state
        return self.bert.cls(hidden[inputs["predict"]])

    def _forward_unpadded(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """The same outputs, with every per-token layer (projections, feed-forward, LayerNorm,
        dropout) run on the real tokens only: the embeddings run padded, then the encoder keeps the
        rows of ``attention_mask``, re-padding only inside attention (SDPA takes dense tensors)."""
        ids, mask = inputs["input_ids"], inputs["attention_mask"]
        batch, length = ids.shape
        tokens = mask.flatten().nonzero().squeeze(1)  # the real tokens' rows, row-major
        encoder_model = self.bert.base_model
        hidden = encoder_model.embeddings(input_ids=ids).flatten(0, 1)[tokens]
        attention_mask = self.attention_mask(inputs)
        if attention_mask.dim() == 2:
            attention_mask = attention_mask.bool()[:, None, None, :]
        for layer in encoder_model.encoder.layer:
            hidden = _unpadded_layer(layer, hidden, tokens, (batch, length), attention_mask, self.training)
        if "predict" in inputs:
            return self.bert.cls(hidden[inputs["predict"].flatten()[tokens]])
        padded = hidden.new_zeros(batch * length, hidden.shape[-1]).index_copy(0, tokens, hidden)
        return self.bert.cls(padded.view(batch, length, -1))


def _unpadded_layer(
    layer: nn.Module,
    hidden: torch.Tensor,
    tokens: torch.Tensor,
    shape: tuple[int, int],
    attention_mask: torch.Tensor,
    training: bool,
) -> torch.Tensor:
    """One Hugging Face BERT layer on ``hidden`` (real tokens, hidden size), attention re-padded."""
    attention = layer.attention.self
    heads, size = attention.num_attention_heads, attention.attention_head_size
    batch, length = shape

    def padded(projected: torch.Tensor) -> torch.Tensor:
        dense = projected.new_zeros(batch * length, projected.shape[-1]).index_copy(0, tokens, projected)
        return dense.view(batch, length, heads, size).transpose(1, 2)

    context = F.scaled_dot_product_attention(
        padded(attention.query(hidden)),
        padded(attention.key(hidden)),
        padded(attention.value(hidden)),
        attn_mask=attention_mask,
        dropout_p=attention.dropout.p if training else 0.0,
    )
    context = context.transpose(1, 2).reshape(batch * length, heads * size)[tokens]
    attended = layer.attention.output(context, hidden)
    return layer.output(layer.intermediate(attended), attended)


def build_bert(config: ModelConfig, vocab_size: int) -> MaskedLanguageModel:
    from transformers import BertConfig, BertForMaskedLM

    settings = BertConfig(
        vocab_size=vocab_size,
        hidden_size=config.hidden_size,
        num_hidden_layers=config.layers,
        num_attention_heads=config.heads,
        intermediate_size=config.intermediate_size,
        max_position_embeddings=config.max_position_embeddings,
        hidden_dropout_prob=config.hidden_dropout,
        attention_probs_dropout_prob=config.attention_dropout,
        attn_implementation="sdpa",
    )
    return MaskedLanguageModel(BertForMaskedLM(settings))
