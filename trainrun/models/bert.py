"""BERT for masked-language-model pretraining: Hugging Face's ``BertForMaskedLM``, run by trainrun.

No weights are downloaded. The module tree and the weights are Hugging Face's own (``.bert`` is
the ``BertForMaskedLM``, which ``save_pretrained`` and ``transformers`` read as any other); the
forward pass is trainrun's, calling the same layers in the same order, so that

- with ``unpad`` (the unpadding method) every layer, attention included where the device has a
  variable-length kernel, runs on the real tokens only;
- Q, K and V come from one matrix product per layer;
- ALiBi's distance bias is applied inside the attention kernel (FlexAttention's ``score_mod``)
  rather than built as a (batch, heads, length, length) tensor where FlexAttention is chosen;
- a step reads nothing back from the device: the loader sends the real-token count per sequence
  (``lengths``, kept on the host) and the positions to predict (``predict_positions``).

Attention (``model.bert.attention``): ``sdpa`` is ``scaled_dot_product_attention`` on the padded
(batch, heads, length, length) layout with a padding mask (unpadded rows are re-padded for it);
``varlen`` is torch's variable-length Flash kernel on the packed real tokens (CUDA, fp16/bf16, no
attention dropout, no bias); ``flex`` is FlexAttention, compiled, with a document mask over the
packed tokens (or a padding mask) and ALiBi as a score modification (CUDA, no attention dropout).
``auto`` takes ``varlen`` for unpadded runs where it applies, else ``sdpa``: on an H100 (torch 2.11,
bf16, ``bench/bert.py``, docs/benchmarks.md) compiled FlexAttention ran BERT-Base's step 1.30x
slower than ``sdpa`` with ALiBi's materialised bias at 128 tokens and 1.31x slower than ``sdpa`` on
unpadded 512-token batches, so it runs only when asked for.
Why by hand: Hugging Face's BERT has no unpadded path, masks by materialised tensors and reads
``padding_mask.all()`` back from the device every forward.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend

from trainrun.data.interface import TextFacts
from trainrun.data.masked_text import predicted_slots, slots_of
from trainrun.errors import ConfigError
from trainrun.models.alibi import alibi_slopes
from trainrun.models.flex import flex_kernel
from trainrun.schema import BertConfig, ModelConfig

_HALF = (torch.float16, torch.bfloat16)


@dataclass
class Layout:
    """Where a batch's rows live: ``rows`` of (batch·length) are the real tokens (packed), or all
    of them (padded, ``rows`` None). Built on the host from the loader's ``lengths``."""

    batch: int
    length: int
    lengths: torch.Tensor  # (batch,) real tokens per sequence, on the device
    rows: torch.Tensor | None = None  # (tokens,) packed: the real tokens' flat positions
    cu_seqlens: torch.Tensor | None = None  # (batch + 1,) int32 packed: where each sequence starts
    documents: torch.Tensor | None = None  # (tokens,) packed: each real token's sequence
    longest: int = 0  # the longest sequence's real tokens

    @property
    def packed(self) -> bool:
        return self.rows is not None


@torch.compiler.disable
def make_layout(lengths: torch.Tensor, length: int, device: torch.device, packed: bool) -> Layout:
    """The batch's :class:`Layout` from ``lengths`` on the host (no device read-back; read as numbers,
    which trainrun estimate's fake tensors run with the loader's real lengths)."""
    lengths = lengths.cpu()  # a no-op for the loader's (host) lengths
    batch = len(lengths)
    on_device = lengths.to(device, non_blocking=True)
    if not packed:
        return Layout(batch, length, on_device)
    counts = np.asarray(lengths.tolist(), dtype=np.int64)
    rows = torch.from_numpy(slots_of(counts, length))  # each sequence's first ``length`` rows: its real tokens
    cu_seqlens = torch.from_numpy(np.concatenate([[0], np.cumsum(counts)]).astype(np.int32))
    documents = torch.from_numpy(np.repeat(np.arange(batch), counts))
    rows, cu_seqlens, documents = (tensor.to(device, non_blocking=True) for tensor in (rows, cu_seqlens, documents))
    return Layout(batch, length, on_device, rows, cu_seqlens, documents, longest=int(counts.max()))


@dataclass
class Attending:
    """What every layer's attention reads in one forward, built once outside any compiled region
    (the layout comes from host counts): tensors and sizes only, so that a compiled layer reads each
    batch's values instead of recompiling for them. ``path``: sdpa (with ``mask``), varlen, or flex
    (with ``block_mask`` and ``score_mod``)."""

    path: str
    layout: Layout
    mask: torch.Tensor | None = None
    block_mask: Any = None  # flex: FlexAttention's BlockMask
    score_mod: Callable | None = None  # flex: ALiBi's bias


def attended(qkv: torch.Tensor, attending: Attending, dropout: float) -> torch.Tensor:
    """(rows, heads, size) context of (rows, 3, heads, size) Q/K/V, the attention ``attending`` names."""
    layout = attending.layout
    if attending.path == "varlen":
        from torch.nn.attention.varlen import varlen_attn

        cu, longest = layout.cu_seqlens, layout.longest
        return varlen_attn(*qkv.unbind(1), cu, cu, longest, longest)
    if attending.path == "flex":
        shape = (1, -1) if layout.packed else (layout.batch, layout.length)
        q, k, v = qkv.reshape(*shape, *qkv.shape[1:]).permute(2, 0, 3, 1, 4)
        kernel = flex_kernel(dynamic=True)
        context = kernel(q, k, v, score_mod=attending.score_mod, block_mask=attending.block_mask)
        return context.transpose(1, 2).flatten(0, 1)
    batch, length = layout.batch, layout.length
    if layout.packed:  # re-pad the real rows once for Q, K and V together
        qkv = qkv.new_zeros(batch * length, *qkv.shape[1:]).index_copy(0, layout.rows, qkv)
    q, k, v = qkv.view(batch, length, *qkv.shape[1:]).permute(2, 0, 3, 1, 4)  # 3 x (batch, heads, length, size)
    context = F.scaled_dot_product_attention(q, k, v, attn_mask=attending.mask, dropout_p=dropout)
    context = context.transpose(1, 2).flatten(0, 1)
    return context.index_select(0, layout.rows) if layout.packed else context


def run_layer(layer: nn.Module, hidden: torch.Tensor, attending: Attending) -> torch.Tensor:
    """One Hugging Face BERT layer on ``hidden`` (rows, hidden size): Q, K and V in one product."""
    attention = layer.attention.self
    heads, size = attention.num_attention_heads, attention.attention_head_size
    projections = (attention.query, attention.key, attention.value)
    weight = torch.cat([p.weight for p in projections])
    bias = torch.cat([p.bias for p in projections]) if attention.query.bias is not None else None
    qkv = F.linear(hidden, weight, bias).view(len(hidden), 3, heads, size)
    context = attended(qkv, attending, attention.dropout.p if layer.training else 0.0)
    attended_rows = layer.attention.output(context.flatten(1), hidden)
    return layer.output(layer.intermediate(attended_rows), attended_rows)


@functools.cache
def trainrun_layer_class(base: type) -> type:
    """``base`` (Hugging Face's BertLayer) whose call with an :class:`Attending` runs :func:`run_layer`
    (any other call runs Hugging Face's forward). Each encoder layer of trainrun's BERT is of this
    class, so that a layer is a module call: FSDP2's unit and torch.compile's block, with Hugging
    Face's weights and names."""

    def forward(self, hidden, *args, **kwargs):
        if args and isinstance(args[0], Attending):
            return run_layer(self, hidden, args[0])
        return base.forward(self, hidden, *args, **kwargs)

    return type(base.__name__, (base,), {"forward": forward, "__module__": base.__module__})


class MaskedLanguageModel(nn.Module):
    """A Hugging Face masked-language model taking the batch's ``input_ids`` and ``attention_mask``
    (and, from trainrun's loader, ``lengths`` and ``predict_positions``)."""

    def __init__(self, bert: nn.Module, attention: str = "auto") -> None:
        super().__init__()
        self.bert = bert
        self.attention = attention
        # set by use_alibi: one slope per head (a buffer, so it moves with the model)
        self.register_buffer("alibi_slopes", None, persistent=False)
        self.unpad = False  # use_unpadding (the unpadding method): no work on padding
        self.masked_head = (
            False  # use_masked_head (the masked_head method): training logits at predicted positions only
        )
        for layer in self.blocks:
            layer.__class__ = trainrun_layer_class(type(layer))

    @property
    def blocks(self) -> nn.ModuleList:
        """The encoder layers, each called as a module (FSDP2's units, torch.compile's blocks)."""
        return self.bert.base_model.encoder.layer

    def use_unpadding(self) -> None:
        """Run every layer but attention on the real tokens only (the unpadding method)."""
        self.unpad = True

    def use_masked_head(self) -> None:
        """Score only the masked positions of a training batch (the masked_head method)."""
        self.masked_head = True

    def use_alibi(self, max_sequence_length: int) -> None:
        """Attend with ALiBi's symmetric distance bias (the alibi method calls this at INIT): the
        learned position embeddings become a frozen zero table of ``max_sequence_length`` rows, with
        position and default segment ids to match, so no position is learned."""
        embeddings = self.bert.bert.embeddings
        device = embeddings.position_embeddings.weight.device
        zeros = nn.Embedding(max_sequence_length, embeddings.position_embeddings.embedding_dim, device=device)
        nn.init.zeros_(zeros.weight)
        zeros.weight.requires_grad_(False)
        embeddings.position_embeddings = zeros
        positions = torch.arange(max_sequence_length, device=device).expand((1, -1))
        embeddings.register_buffer("position_ids", positions, persistent=False)
        if hasattr(embeddings, "token_type_ids"):  # one (zero) segment id per position, sized as the table
            embeddings.register_buffer("token_type_ids", torch.zeros_like(positions), persistent=False)
        self.bert.config.max_position_embeddings = max_sequence_length
        self.alibi_slopes = alibi_slopes(self.bert.config.num_attention_heads).to(device)

    # ---------------------------------------------------------------------------------- attention
    def attention_path(self, device: torch.device, dtype: torch.dtype) -> str:
        """The attention this model runs now (training or not) on ``device`` in ``dtype``."""
        dropout = self.bert.config.attention_probs_dropout_prob if self.training else 0.0
        alibi = self.alibi_slopes is not None
        usable = {
            "sdpa": True,
            "varlen": device.type == "cuda"
            and dtype in _HALF
            and dropout == 0
            and not alibi
            and self.unpad
            and has_varlen_attention(),
            "flex": device.type == "cuda" and dropout == 0,
        }
        if self.attention != "auto":
            if not usable[self.attention]:
                raise ConfigError(
                    f"bad value for 'model.bert.attention': '{self.attention}' needs a CUDA device, "
                    "no attention dropout"
                    + (", fp16/bf16, unpadding and no ALiBi" if self.attention == "varlen" else "")
                )
            return self.attention
        return "varlen" if usable["varlen"] else "sdpa"

    def attention_kernels(self, length: int, dtype: torch.dtype, device: torch.device) -> str:
        """What training attention runs for batches padded to ``length`` tokens, for the start-up
        banner; for ``sdpa``, the kernel torch's dispatcher picks (Flash needs no mask)."""
        path = self.attention_path(device, dtype)
        if path == "varlen":
            return "varlen_attn (Flash) on the real tokens only"
        if path == "flex":
            where = "on the real tokens only" if self.unpad else "on batches padded to their length"
            return f"FlexAttention (compiled) {where}" + (
                ", ALiBi in its score_mod" if self.alibi_slopes is not None else ""
            )
        attention = self.bert.base_model.encoder.layer[0].attention.self
        query = torch.empty(2, attention.num_attention_heads, length, attention.attention_head_size, dtype=dtype)
        mask = self._dense_mask(Layout(2, length, torch.full((2,), length)), dtype)
        dropout = attention.dropout.p if self.training else 0.0
        query, mask = query.to(device), mask.to(device)
        choice = torch._fused_sdp_choice(query, query, query, mask, dropout, False)
        kernel = SDPBackend(choice).name.lower().replace("_attention", "")
        return f"scaled_dot_product_attention ({kernel}) on batches padded to their length"

    def _dense_mask(self, layout: Layout, dtype: torch.dtype) -> torch.Tensor:
        """sdpa's mask: (batch, 1, 1, length) keys to attend, or with ALiBi the additive (batch,
        heads, length, length) ``-slope·|i - j|`` with the dtype's minimum at padding keys."""
        keys = torch.arange(layout.length, device=layout.lengths.device)[None, :] < layout.lengths[:, None]
        if self.alibi_slopes is None:
            return keys[:, None, None, :]
        positions = torch.arange(layout.length, device=keys.device)
        distance = (positions[:, None] - positions[None, :]).abs().to(dtype)
        bias = -self.alibi_slopes.to(keys.device, dtype)[:, None, None] * distance
        return bias[None] + torch.where(keys[:, None, None, :], 0.0, torch.finfo(dtype).min).to(dtype)

    def _attending(self, layout: Layout, path: str, dtype: torch.dtype) -> Attending:
        """What this batch's layers attend with (:class:`Attending`)."""
        if path == "varlen":
            return Attending(path, layout)
        if path == "flex":
            block_mask, score_mod = self._flex_attention(layout)
            return Attending(path, layout, block_mask=block_mask, score_mod=score_mod)
        return Attending(path, layout, mask=self._dense_mask(layout, dtype))

    def _flex_attention(self, layout: Layout) -> tuple[Any, Callable | None]:
        """FlexAttention's block mask and score modification for this batch (closures over tensors
        only, so that a compiled layer reads them as inputs instead of recompiling for each batch)."""
        from torch.nn.attention.flex_attention import create_block_mask

        slopes, documents, lengths = self.alibi_slopes, layout.documents, layout.lengths
        if layout.packed:  # one sequence of every real token; a token attends within its own document
            tokens = len(layout.rows)

            def keep(b, h, q, k):
                return documents[q] == documents[k]

            blocks = create_block_mask(keep, 1, None, tokens, tokens, device=lengths.device)
        else:

            def keep(b, h, q, k):
                return k < lengths[b]

            blocks = create_block_mask(keep, layout.batch, None, layout.length, layout.length, device=lengths.device)

        def alibi(score, b, h, q, k):
            return score - slopes[h] * (q - k).abs()

        return blocks, alibi if slopes is not None else None

    # ---------------------------------------------------------------------------------- forward
    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """Logits (batch, sequence, vocabulary); with ``predict_positions`` (batch, slots) in the
        inputs, in evaluation or with ``masked_head``, only those positions' logits (predictions,
        vocabulary) in row-major order: the first ``predict_counts`` slots of each sequence, or
        every slot without counts."""
        ids = inputs["input_ids"]
        batch, length = ids.shape
        lengths = inputs.get("lengths")
        if lengths is None:  # a caller without trainrun's loader: counted here (a read-back on a GPU)
            lengths = inputs["attention_mask"].sum(1)
        layout = make_layout(lengths, length, ids.device, self.unpad)
        model = self.bert.base_model
        hidden = model.embeddings(input_ids=ids).flatten(0, 1)
        if layout.packed:
            hidden = hidden.index_select(0, layout.rows)
        device_type = ids.device.type
        autocast = torch.amp.is_autocast_available(device_type) and torch.is_autocast_enabled(device_type)
        dtype = torch.get_autocast_dtype(device_type) if autocast else hidden.dtype
        attending = self._attending(layout, self.attention_path(ids.device, dtype), dtype)
        for layer in self.blocks:
            hidden = layer(hidden, attending)
        positions = inputs.get("predict_positions")
        if positions is not None and (self.masked_head or not self.training):
            first = layout.cu_seqlens[:-1].long() if layout.packed else torch.arange(batch, device=ids.device) * length
            rows = (first[:, None] + positions).flatten()
            if "predict_counts" in inputs:  # the real slots only
                rows = rows.index_select(0, predicted_slots(inputs["predict_counts"], positions.shape[1], ids.device))
            return self.bert.cls(hidden.index_select(0, rows))
        if layout.packed:
            hidden = hidden.new_zeros(batch * length, hidden.shape[-1]).index_copy(0, layout.rows, hidden)
        return self.bert.cls(hidden.view(batch, length, -1))


@functools.cache
def has_varlen_attention() -> bool:
    """Whether this torch has ``torch.nn.attention.varlen`` (torch 2.9 and later)."""
    return importlib.util.find_spec("torch.nn.attention.varlen") is not None


def build_bert(config: BertConfig, vocab_size: int) -> MaskedLanguageModel:
    from transformers import BertConfig as HuggingFaceBertConfig
    from transformers import BertForMaskedLM

    settings = HuggingFaceBertConfig(
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
    return MaskedLanguageModel(BertForMaskedLM(settings), config.attention)


def build(config: ModelConfig, text: TextFacts | None = None) -> MaskedLanguageModel:
    """``model=bert_*``: a BERT of ``model.bert``'s shape over the token store's vocabulary."""
    if text is None:
        raise ConfigError(
            "model.name=bert needs text data (data=text or data=stdlib_docs): its vocabulary sizes the model"
        )
    return build_bert(config.bert, text.vocab_size)
