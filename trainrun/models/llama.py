"""Llama 3 (decoder-only transformer) for causal language modelling, in one readable file.

Meta's Llama 3 block: pre-norm RMSNorm, grouped-query attention (``kv_heads`` key/value heads
shared by ``heads / kv_heads`` query heads each, through SDPA's ``enable_gqa``), rotary positions
with Llama 3's base θ (500,000) and, where ``rope_factor`` is set, its frequency scaling for long
contexts (wavelengths beyond ``rope_original_positions / rope_low_freq_factor`` slowed by the
factor, those under ``/ rope_high_freq_factor`` kept, a smooth blend between), a SwiGLU MLP
(``down(silu(gate(x)) · up(x))``), no biases, an untied output head unless ``tie_head``. Rotary
rotates the two halves of each head (Hugging Face's layout), so the weights map one to one onto a
``transformers`` ``LlamaForCausalLM`` (:mod:`trainrun.models.llama_export`).

Every weight is drawn from its own generator, keyed to the run's seed and the weight's name, by
:meth:`Llama.initialise`: the same values whether the model is built whole on one rank or on the
meta device and materialised one weight at a time into each rank's shard under FSDP2 (no rank
ever holds the whole model), so 1 rank, DDP and FSDP start from the same weights. Written here,
not taken from transformers, so that every part is one readable line and the model builds on the
meta device.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from trainrun.data.interface import TextFacts
from trainrun.schema import LlamaConfig, ModelConfig

INIT_STD = 0.02  # every matrix's normal std (output projections: divided by sqrt(2 x layers))


def rotary_frequencies(config: LlamaConfig) -> torch.Tensor:
    """Each pair's angular frequency ``θ^(-2i/d)``, with Llama 3's scaling where ``rope_factor`` is set."""
    head_dim = config.width // config.heads
    frequencies = config.rope_theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    if config.rope_factor is None:
        return frequencies.float()
    wavelength = 2 * math.pi / frequencies
    original = config.rope_original_positions
    smooth = (original / wavelength - config.rope_low_freq_factor) / (
        config.rope_high_freq_factor - config.rope_low_freq_factor
    )
    blended = (1 - smooth) * frequencies / config.rope_factor + smooth * frequencies
    scaled = torch.where(wavelength > original / config.rope_low_freq_factor, frequencies / config.rope_factor, blended)
    return torch.where(wavelength < original / config.rope_high_freq_factor, frequencies, scaled).float()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each pair (x_i, x_{i + d/2}) of ``x`` (batch, heads, length, d) by its position's angle."""
    first, second = x.float().chunk(2, dim=-1)
    return torch.cat((first * cos - second * sin, first * sin + second * cos), dim=-1).type_as(x)


class Attention(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = config.heads, config.kv_heads, config.width // config.heads
        self.query = nn.Linear(config.width, config.heads * self.head_dim, bias=False)
        self.key = nn.Linear(config.width, config.kv_heads * self.head_dim, bias=False)
        self.value = nn.Linear(config.width, config.kv_heads * self.head_dim, bias=False)
        self.out = nn.Linear(config.heads * self.head_dim, config.width, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        q = self.query(x).view(batch, length, self.heads, self.head_dim).transpose(1, 2)
        k = self.key(x).view(batch, length, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.value(x).view(batch, length, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        context = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.kv_heads != self.heads)
        return self.out(context.transpose(1, 2).reshape(batch, length, -1))


class SwiGLU(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.gate = nn.Linear(config.width, config.ffn_hidden, bias=False)
        self.up = nn.Linear(config.width, config.ffn_hidden, bias=False)
        self.down = nn.Linear(config.ffn_hidden, config.width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.attention_norm = nn.RMSNorm(config.width, eps=config.norm_eps)
        self.attention = Attention(config)
        self.mlp_norm = nn.RMSNorm(config.width, eps=config.norm_eps)
        self.mlp = SwiGLU(config)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.mlp(self.mlp_norm(x))


def rows_of_rank(parameter, count: int) -> tuple[int, int]:  # noqa: ANN001
    """(first, end) of the rows of a dimension-0-sharded DTensor that this rank holds (``count`` of
    them): torch.chunk's cut, which FSDP2 shards by (chunks of ceil(rows / ranks), the last shorter)."""
    rows, ranks = parameter.shape[0], parameter.device_mesh.size()
    first = min(parameter.device_mesh.get_local_rank() * -(-rows // ranks), rows)
    return first, first + count


class Llama(nn.Module):
    """Token ids (batch, length) to next-token logits (batch, length, vocabulary), in the compute
    dtype (bfloat16 under autocast: the loss takes them to float32 a chunk at a time)."""

    transformers_class = "LlamaForCausalLM"  # what export_pretrained writes
    starting_weights: Mapping[str, torch.Tensor] | None = None  # model.weights, kept until initialise sets them

    def __init__(self, config: LlamaConfig, vocab_size: int) -> None:
        super().__init__()
        self.config, self.vocab_size = config, vocab_size
        # the weights' seed: one draw from the seeded generator, on the host whatever the device
        self.weight_seed = int(torch.randint(2**62, (), device="cpu"))
        self.embed = nn.Embedding(vocab_size, config.width)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.layers))
        self.final_norm = nn.RMSNorm(config.width, eps=config.norm_eps)
        self.head = nn.Linear(config.width, vocab_size, bias=False)
        if config.tie_head:
            self.head.weight = self.embed.weight
        self.register_buffer("rotary_cos", torch.empty(0), persistent=False)
        self.register_buffer("rotary_sin", torch.empty(0), persistent=False)
        if self.embed.weight.device.type != "meta":
            self.initialise()

    def initial_value(self, name: str, parameter: torch.Tensor) -> torch.Tensor:
        """Weight ``name``'s starting value, whole, on the host: RMSNorm scales at one, matrices
        normal(0, 0.02) (output projections 0.02 / sqrt(2 x layers)), from the weight's own generator."""
        if name.endswith("norm.weight"):
            return torch.ones(parameter.shape)
        residual = name.endswith(("attention.out.weight", "mlp.down.weight"))
        std = INIT_STD / math.sqrt(2 * self.config.layers) if residual else INIT_STD
        generator = torch.Generator().manual_seed((self.weight_seed + zlib.crc32(name.encode())) % 2**63)
        return torch.empty(parameter.shape).normal_(0.0, std, generator=generator)

    @torch.no_grad()
    def initialise(self, weights: Mapping[str, torch.Tensor] | None = None) -> None:
        """Set every weight (each rank's shard of it under FSDP2) and the rotary tables, one weight at
        a time: the way a model built on the meta device is materialised after ``to_empty``. With
        ``weights`` (a whole state dict, or a published folder's tensors, of which each rank reads
        only its rows), or the :attr:`starting_weights` ``model.weights`` gave a model on the meta
        device, from them instead of the initial values."""
        from torch.distributed.tensor import DTensor, Shard, distribute_tensor

        weights, self.starting_weights = weights if weights is not None else self.starting_weights, None
        if self.config.tie_head and self.head.weight is not self.embed.weight:  # to_empty unties them
            self.head.weight = self.embed.weight
        for name, parameter in self.named_parameters():
            if isinstance(parameter, DTensor) and hasattr(weights, "rows") and parameter.placements == (Shard(0),):
                local = parameter.to_local()  # this rank's rows of a published tensor, read alone
                local.copy_(weights.rows(name, *rows_of_rank(parameter, local.shape[0])))
                continue
            value = weights[name] if weights is not None else self.initial_value(name, parameter)
            if isinstance(parameter, DTensor):
                shard = distribute_tensor(value, parameter.device_mesh, parameter.placements, src_data_rank=None)
                parameter.to_local().copy_(shard.to_local())
            else:
                parameter.copy_(value)
        angles = torch.outer(
            torch.arange(self.config.max_seq_len, dtype=torch.float32), rotary_frequencies(self.config)
        )
        device = self.final_norm.weight.device
        self.rotary_cos, self.rotary_sin = angles.cos().to(device), angles.sin().to(device)

    def published_state(self, source: Path) -> dict[str, torch.Tensor]:
        """This model's state dict from a published ``LlamaForCausalLM`` folder (``model.weights``)."""
        from trainrun.models.llama_export import llama_state

        return llama_state(self, source)

    def export_pretrained(self, tokenizer_file: Path, separator: int, directory: Path) -> str | None:
        """Write ``directory`` as a ``LlamaForCausalLM`` and its tokenizer (every Llama fits one)."""
        from trainrun.models.llama_export import export_llama

        export_llama(self, tokenizer_file, separator, directory)
        return None

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        cos, sin = self.rotary_cos[:length], self.rotary_sin[:length]
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, cos, sin)
        return self.head(self.final_norm(x))


def build(config: ModelConfig, text: TextFacts | None = None) -> Llama:
    """``model=llama*``: a Llama over the data's vocabulary, on the current default device (the meta
    device when the run shards it: :mod:`trainrun.core.parallel` materialises it)."""
    if text is None:
        raise ValueError("a Llama needs the token store's vocabulary size")
    return Llama(config.llama, text.vocab_size)
