"""A GPT (decoder-only transformer) for causal language modelling, in one readable file.

The block is nanoGPT's GPT-2 (pre-norm, causal self-attention, 4x MLP, tied head, residual
projections initialised with std 0.02 / sqrt(2 x layers)); each of the speedrun's changes is a
switch under ``model.gpt``: ``positions`` learned, rotary (RoPE, base 10,000, on the two halves of
each head) or alibi (no position table; each head's scores biased by ``-m_h · (i - j)``, the causal
form of the alibi method's slopes: any length runs), ``norm`` LayerNorm or RMSNorm, ``qk_norm``
(queries and keys RMS-normalised per head before attention), ``mlp`` GELU or ReLU² (``relu(x)²``),
``tie_head``, ``logit_softcap`` (``c · tanh(logits / c)``), ``zero_init`` (attention and MLP output
projections and an untied head start at zero), ``value_embeddings`` (k extra token tables; the first
k blocks and the last k, in the same order, mix theirs into the attention values as
``v = a·v + b·table[token]``, a and b learned per block from 0.5: the speedrun's), ``dropout``
(GPT-2's: on the embeddings, the attention weights and each residual branch), ``document_mask``
(no token attends to another document's: a document ends at the store's separator, which belongs
to it; in llm.c's shards a delimiter begins a document and belongs to that one) and ``window``
(each token attends to itself and the ``window - 1`` tokens before it). Attention is
``F.scaled_dot_product_attention(is_causal=True)``: Flash or memory-efficient kernels on a GPU, the
math kernel on a CPU (with ALiBi, the causal bias as its additive mask). With a document mask or a
window, a GPU attends through FlexAttention (compiled; block-sparse, so masked blocks cost nothing,
ALiBi as its score modification) and a CPU through SDPA with the mask written out; one mask
serves every layer of a batch. Written here, not taken
from transformers, so that every switch is one readable line (nanoGPT's reason); a model with
GPT-2's shape has GPT-2's parameters.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.flex_attention import BlockMask

from trainrun.data.interface import TextFacts
from trainrun.models.alibi import alibi_slopes
from trainrun.models.flex import attends_through_flex, flex_kernel
from trainrun.schema import GPTConfig, ModelConfig

VOCAB_MULTIPLE = 64  # the embedding and head are padded to a multiple of this (nanoGPT's 50304)


def padded_vocabulary(vocab_size: int) -> int:
    return math.ceil(vocab_size / VOCAB_MULTIPLE) * VOCAB_MULTIPLE


def rotary_tables(length: int, head_dim: int, base: float = 10_000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of angle ``p · base^(-2i/d)`` for position p and pair i, each (length, head_dim / 2)."""
    frequencies = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(length, dtype=torch.float32), frequencies)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each pair (x_i, x_{i + d/2}) of ``x`` (batch, heads, length, d) by its position's angle."""
    first, second = x.float().chunk(2, dim=-1)
    rotated = torch.cat((first * cos - second * sin, first * sin + second * cos), dim=-1)
    return rotated.type_as(x)


def norm_layer(kind: str, size: int) -> nn.Module:
    return nn.RMSNorm(size) if kind == "rmsnorm" else nn.LayerNorm(size)


@dataclass
class Attend:
    """How a batch's queries see its keys, built once per forward and read by every layer: plain
    causal (nothing set), SDPA's ``mask`` (boolean, or additive with ALiBi), or FlexAttention's
    ``block_mask`` with ALiBi's ``score_mod``."""

    mask: torch.Tensor | None = None
    block_mask: BlockMask | None = None
    score_mod: Callable | None = None


def document_ids(tokens: torch.Tensor, separator: int, begins: bool = False) -> torch.Tensor:
    """(batch, length): each position's document within its window, counted from its first; a
    separator belongs to the document it ends (trainrun's stores), or with ``begins`` to the one it
    begins (llm.c's shards, where modded-nanogpt counts ``(tokens == separator).cumsum()``)."""
    separators = tokens == separator
    return separators.cumsum(1) if begins else separators.cumsum(1) - separators.long()


def visible_keys(
    length: int, window: torch.Tensor | int | None, documents: torch.Tensor | None, device: torch.device
) -> torch.Tensor:
    """(batch or 1, 1, length, length) bool: key j visible to query i (not after it, fewer than
    ``window`` tokens back, in its document)."""
    position = torch.arange(length, device=device)
    back = position[:, None] - position[None, :]
    visible = (back >= 0) & (back < window) if window is not None else back >= 0
    visible = visible[None, None]
    return visible & (documents[:, None, :, None] == documents[:, None, None, :]) if documents is not None else visible


FLEX_BLOCK = 128  # FlexAttention's block of queries and of keys


def block_visibility(
    length: int, window: torch.Tensor | int | None, documents: torch.Tensor | None, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Which key blocks of :data:`FLEX_BLOCK` tokens each query block sees (any of it, then all of it),
    each (batch or 1, 1, blocks, blocks) bool, from block positions and each block's first and last
    document (documents only grow along a window): O(blocks²) per window, not O(length²)."""
    blocks = -(-length // FLEX_BLOCK)
    index = torch.arange(blocks, device=device)
    apart = (index[:, None] - index[None, :]) * FLEX_BLOCK  # query block start - key block start
    whole = (index + 1) * FLEX_BLOCK <= length  # a block cut by the end is never run without the mask
    any_visible, all_visible = apart >= 0, (apart > 0) & whole[:, None] & whole[None, :]
    if window is not None:  # nearest pair (query block start, key block end), farthest (end, start)
        any_visible = any_visible & (apart - (FLEX_BLOCK - 1) < window)
        all_visible = all_visible & (apart + (FLEX_BLOCK - 1) < window)
    any_visible, all_visible = any_visible[None, None], all_visible[None, None]
    if documents is not None:
        first = documents[:, index * FLEX_BLOCK]
        last = documents[:, torch.clamp(index * FLEX_BLOCK + FLEX_BLOCK - 1, max=length - 1)]
        any_visible = any_visible & (last[:, None, None, :] >= first[:, None, :, None])
        one_document = first == last
        same = one_document[:, :, None] & one_document[:, None, :] & (first[:, :, None] == first[:, None, :])
        all_visible = all_visible & same[:, None]
    return any_visible, all_visible


def ordered_blocks(visible: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """FlexAttention's (counts, indices) of a (batch, heads, query blocks, key blocks) bool: each query
    block's visible key blocks first, in order."""
    counts = visible.sum(-1, dtype=torch.int32)
    indices = torch.argsort((~visible).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    return counts, indices


def flex_attend(
    length: int,
    window: torch.Tensor | int | None,
    documents: torch.Tensor | None,
    slopes: torch.Tensor | None,
    device: torch.device,
) -> Attend:
    """The same rule as :func:`visible_keys` as a FlexAttention block mask (and ALiBi's bias as its
    score modification), built from :func:`block_visibility` (fully visible blocks run without the
    mask; partly visible ones apply it), not by evaluating the rule at every query and key as
    ``create_block_mask`` does (a batch x length x length pass every forward)."""

    def visible(batch, head, query, key):
        keep = query >= key
        if window is not None:
            keep = keep & (query - key < window)
        if documents is not None:
            keep = keep & (documents[batch, query] == documents[batch, key])
        return keep

    def alibi(score, batch, head, query, key):
        return score - slopes[head] * (query - key)

    any_visible, all_visible = block_visibility(length, window, documents, device)
    block_mask = BlockMask.from_kv_blocks(
        *ordered_blocks(any_visible & ~all_visible),
        *ordered_blocks(all_visible),
        BLOCK_SIZE=FLEX_BLOCK,
        mask_mod=visible,
        seq_lengths=(length, length),
    )
    return Attend(block_mask=block_mask, score_mod=alibi if slopes is not None else None)


def value_tables(count: int, layers: int) -> list[int | None]:
    """Each block's value-embedding table: 0..count-1 for the first ``count`` blocks and again for
    the last ``count``, None between (the speedrun's 3 tables over 12 blocks: 0 1 2 - - - - - - 0 1 2)."""
    tables: list[int | None] = [None] * layers
    for table in range(count):
        tables[table] = tables[layers - count + table] = table
    return tables


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig, mixes_values: bool = False) -> None:
        super().__init__()
        self.heads, self.head_dim = config.heads, config.width // config.heads
        self.qkv = nn.Linear(config.width, 3 * config.width, bias=config.bias)
        self.proj = nn.Linear(config.width, config.width, bias=config.bias)
        self.qk_norm = config.qk_norm
        self.dropout = config.dropout
        # (a, b) of v = a·v + b·value embedding, in the blocks a value-embedding table serves
        self.value_mix = nn.Parameter(torch.full((2,), 0.5)) if mixes_values else None

    def forward(
        self,
        x: torch.Tensor,
        rotary: tuple[torch.Tensor, torch.Tensor] | None,
        attend: Attend,
        value_embedding: torch.Tensor | None = None,
    ) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(x).view(batch, length, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        if value_embedding is not None:
            extra = value_embedding.view(batch, length, self.heads, self.head_dim).transpose(1, 2)
            v = self.value_mix[0] * v + self.value_mix[1] * extra
        if self.qk_norm:
            q, k = F.rms_norm(q, (self.head_dim,)), F.rms_norm(k, (self.head_dim,))
        if rotary is not None:
            q, k = apply_rotary(q, *rotary), apply_rotary(k, *rotary)
        dropout = self.dropout if self.training else 0.0
        if attend.block_mask is not None:
            kernel = flex_kernel(dynamic=False, compiled=q.is_cuda)
            context = kernel(q, k, v, score_mod=attend.score_mod, block_mask=attend.block_mask)
        elif attend.mask is None:
            context = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)
        else:
            mask = attend.mask if attend.mask.dtype == torch.bool else attend.mask.to(q.dtype)
            context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout)
        return self.proj(context.transpose(1, 2).reshape(batch, length, width))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.up = nn.Linear(config.width, 4 * config.width, bias=config.bias)
        self.proj = nn.Linear(4 * config.width, config.width, bias=config.bias)
        self.relu_squared = config.mlp == "relu2"
        self.approximate = "tanh" if config.mlp == "gelu_tanh" else "none"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.up(x)
        hidden = F.relu(hidden).square() if self.relu_squared else F.gelu(hidden, approximate=self.approximate)
        return self.proj(hidden)


class Block(nn.Module):
    def __init__(self, config: GPTConfig, mixes_values: bool = False) -> None:
        super().__init__()
        self.attention_norm, self.mlp_norm = (
            norm_layer(config.norm, config.width),
            norm_layer(config.norm, config.width),
        )
        self.attention, self.mlp = CausalSelfAttention(config, mixes_values), MLP(config)
        self.residual_dropout = nn.Dropout(config.dropout)

    def forward(
        self,
        x: torch.Tensor,
        rotary: tuple[torch.Tensor, torch.Tensor] | None,
        attend: Attend,
        value_embedding: torch.Tensor | None = None,
    ) -> torch.Tensor:
        x = x + self.residual_dropout(self.attention(self.attention_norm(x), rotary, attend, value_embedding))
        return x + self.residual_dropout(self.mlp(self.mlp_norm(x)))


class LogitTail(nn.Module):
    """The head's logits as the model returns them: the padding's columns left out and soft-capped
    (``c · tanh(logits / c)``), element-wise work over the step's largest tensor that a compiled run
    fuses into one kernel (:func:`~trainrun.core.compiled.compiled_regions`). No parameters: the
    model's state is the same with or without it."""

    def __init__(self, vocab_size: int, cap: float | None) -> None:
        super().__init__()
        self.vocab_size, self.cap = vocab_size, cap

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        if logits.shape[-1] > self.vocab_size:  # in a copy: the model returns no view (FSDP2's root hooks its output)
            logits = logits[..., : self.vocab_size].contiguous()
        # in the logits' dtype: the loss takes them to float32 a chunk at a time
        return self.cap * torch.tanh(logits / self.cap) if self.cap else logits


class GPT(nn.Module):
    """Token ids (batch, length) to next-token logits (batch, length, vocabulary), in the compute
    dtype (bfloat16 under autocast)."""

    transformers_class = "GPT2LMHeadModel"  # what export_pretrained writes

    def __init__(
        self, config: GPTConfig, vocab_size: int, separator: int | None = None, separator_begins: bool = False
    ) -> None:
        super().__init__()
        if config.document_mask and separator is None:
            raise ValueError("a document mask needs the token store's separator")
        self.config, self.vocab_size, self.separator = config, vocab_size, separator
        self.separator_begins = separator_begins  # the data's rule: text.separator_begins
        padded = padded_vocabulary(vocab_size)
        self.embed = nn.Embedding(padded, config.width)
        self.positions = nn.Embedding(config.max_seq_len, config.width) if config.positions == "learned" else None
        self.embedding_dropout = nn.Dropout(config.dropout)
        self.value_tables = value_tables(config.value_embeddings, config.layers)
        self.blocks = nn.ModuleList(Block(config, table is not None) for table in self.value_tables)
        self.value_embeds = nn.ModuleList(nn.Embedding(padded, config.width) for _ in range(config.value_embeddings))
        self.final_norm = norm_layer(config.norm, config.width)
        self.head = nn.Linear(config.width, padded, bias=False)
        self.logit_tail = LogitTail(vocab_size, config.logit_softcap)
        if config.tie_head:
            self.head.weight = self.embed.weight
        if config.positions == "rotary":
            cos, sin = rotary_tables(config.max_seq_len, config.width // config.heads)
            self.register_buffer("rotary_cos", cos, persistent=False)
            self.register_buffer("rotary_sin", sin, persistent=False)
        self.register_buffer("alibi_slopes", None, persistent=False)  # one per head, with ALiBi
        self.register_buffer("window", None, persistent=False)  # tokens each query sees, with a sliding window
        if config.window is not None:
            self.set_window(config.window)
        if config.positions == "alibi":
            self.use_alibi()
        self._initialise()

    def use_alibi(self, max_sequence_length: int | None = None) -> None:
        """Attend with ALiBi's causal distance bias instead of a position table (the alibi method
        calls this at INIT; ``positions: alibi`` at construction). The bias is built for each batch's
        length, so no ``max_sequence_length`` bounds it (taken for the alibi method's one hook)."""
        self.positions = None
        self.alibi_slopes = alibi_slopes(self.config.heads).to(self.embed.weight.device)

    def set_window(self, tokens: int) -> None:
        """Attend through a sliding window of ``tokens`` (itself and ``tokens - 1`` before it); the
        window_warmup method calls this as the window grows. A tensor, so that a compiled forward
        reads the new size instead of recompiling for it; a float, so that EMA's average of a
        constant window is that window (it truncates integer buffers)."""
        if self.window is None:
            self.window = torch.tensor(float(tokens), device=self.embed.weight.device)
        else:
            self.window.fill_(tokens)

    def causal_bias(self, length: int) -> torch.Tensor:
        """(heads, length, length): ``-m_h · (i - j)`` where key j is not after query i, -inf after."""
        positions = torch.arange(length, device=self.alibi_slopes.device)
        distance = (positions[:, None] - positions[None, :]).float()
        bias = -self.alibi_slopes[:, None, None] * distance
        return bias.masked_fill(distance < 0, float("-inf"))

    def attend(self, tokens: torch.Tensor, flex: bool) -> Attend:
        """How this batch's queries see its keys (``flex``: through FlexAttention, which has no dropout)."""
        length, window = tokens.shape[1], self.window
        documents = document_ids(tokens, self.separator, self.separator_begins) if self.config.document_mask else None
        if documents is None and window is None:
            return Attend(self.causal_bias(length) if self.alibi_slopes is not None else None)
        if flex:
            return flex_attend(length, window, documents, self.alibi_slopes, tokens.device)
        visible = visible_keys(length, window, documents, tokens.device)
        if self.alibi_slopes is None:
            return Attend(visible)
        return Attend(self.causal_bias(length).masked_fill(~visible, float("-inf")))

    def _initialise(self) -> None:
        """nanoGPT's: normal(0, 0.02) weights, zero biases, output projections at 0.02 / sqrt(2 x
        layers) (with ``zero_init`` they and an untied head start at zero, as the speedrun's)."""
        residual_std = 0.02 / math.sqrt(2 * self.config.layers)
        for name, module in self.named_modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                std = residual_std if name.endswith(".proj") else 0.02
                nn.init.normal_(module.weight, mean=0.0, std=std)
                if self.config.zero_init and (name.endswith(".proj") or (name == "head" and not self.config.tie_head)):
                    nn.init.zeros_(module.weight)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)

    def stacked_matrices(self) -> dict[str, int]:
        """Weights that stack several matrices by rows, and how many: each block's fused q, k and v
        (Muon orthogonalises and scales them as three, as the speedrun's separate matrices)."""
        return {f"blocks.{index}.attention.qkv.weight": 3 for index in range(len(self.blocks))}

    def published_state(self, source: Path) -> dict[str, torch.Tensor]:
        """This model's state dict from a published ``GPT2LMHeadModel`` folder (``model.weights``)."""
        from trainrun.models.gpt2_export import gpt2_state

        return gpt2_state(self, source)

    def export_pretrained(self, tokenizer_file: Path, separator: int, directory: Path) -> str | None:
        """Write ``directory`` as a ``GPT2LMHeadModel`` and its tokenizer; or say why it cannot hold this GPT."""
        from trainrun.models.gpt2_export import export_gpt2, gpt2_mismatch

        mismatch = gpt2_mismatch(self)
        if mismatch:
            return f"GPT2LMHeadModel cannot hold this GPT: {mismatch}"
        export_gpt2(self, tokenizer_file, separator, directory)
        return None

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        x = self.embed(tokens)
        if self.positions is not None:
            x = x + self.positions(torch.arange(length, device=tokens.device))
        rotary = (self.rotary_cos[:length], self.rotary_sin[:length]) if self.config.positions == "rotary" else None
        x = self.embedding_dropout(x)
        attend = self.attend(tokens, flex=attends_through_flex(tokens) and not (self.training and self.config.dropout))
        values = [table(tokens) for table in self.value_embeds]
        for block, table in zip(self.blocks, self.value_tables, strict=True):
            x = block(x, rotary, attend, values[table] if table is not None else None)
        return self.logit_tail(self.head(self.final_norm(x)))


def build(config: ModelConfig, text: TextFacts | None = None) -> GPT:
    """``model=gpt_*``: a GPT over the data's vocabulary (padded to a multiple of 64)."""
    if text is None:
        raise ValueError("a GPT needs the token store's vocabulary size")
    return GPT(config.gpt, text.vocab_size, text.separator, text.separator_begins)
