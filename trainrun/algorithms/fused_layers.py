"""Fused transformer layers: each layer's per-token blocks compiled into fused kernels.

MLPerf BERT-Large's fast submissions fuse the memory-bound work around each matmul by hand:
bias + dropout + residual add + LayerNorm after the attention and feed-forward projections
(FusedDropoutAddLayerNorm), and bias + GeLU after the first feed-forward matmul
(FusedDenseGeLuDense). Here ``torch.compile`` writes those kernels: at INIT each encoder layer's
attention-output block, intermediate block (dense + activation, or the GLU of
``gated_linear_units``) and output block is compiled in place, with dynamic row counts so
``unpadding``'s varying token counts do not recompile. Only these regions are compiled, so a run
keeps eager attention dispatch (SDPA picks Flash or memory-efficient kernels itself), Hugging
Face's Python around them, and seconds of compile time instead of minutes. Parameter names and
the saved model are unchanged. ``torch.compile`` rather than hand-written kernels because it
fuses whatever the block holds after surgery (GLU, low-precision LayerNorm) on CPU and GPU alike.
"""

from __future__ import annotations

from torch import nn

from trainrun.algorithms.base import ModelSurgery

BLOCKS = ("attention.output", "intermediate", "output")  # a Hugging Face encoder layer's per-token blocks


def fuse_layers(model: nn.Module) -> int:
    """Compile the per-token blocks of every encoder layer of ``model`` in place; return how many."""
    count = 0
    for layer in list(model.modules()):
        blocks = [layer.get_submodule(name) for name in BLOCKS if _has(layer, name)]
        if len(blocks) == len(BLOCKS):
            for block in blocks:
                block.compile(dynamic=True)
            count += len(blocks)
    return count


def _has(module: nn.Module, name: str) -> bool:
    try:
        module.get_submodule(name)
    except AttributeError:
        return False
    return True


class FusedLayers(ModelSurgery):
    name = "fused_layers"
    surgery = staticmethod(lambda model, config: fuse_layers(model))
    finds = "transformer encoder layers"
