"""precision=fp8 as torchao intends it under FSDP2, checked for its structure on this CPU (no float8
matrix units here: the GPU run measures its speed): which layers convert, the float8 all-gather of
their weights, the scales precomputed after each optimizer step, and what selective checkpointing
keeps."""

from __future__ import annotations

import os

import pytest
import torch

from trainrun.core import parallel
from trainrun.core.precision import Precision
from trainrun.models.llama import Llama
from trainrun.schema import LlamaConfig

torchao = pytest.importorskip("torchao")


def converted(sharded: bool) -> tuple[Llama, Precision]:
    torch.manual_seed(0)
    model, precision = Llama(LlamaConfig(), 256), Precision("fp8", "cuda", torch.bfloat16, float8=True)
    precision.convert(model, sharded=sharded)
    return model, precision


def test_every_block_matrix_converts_and_the_head_stays_in_bf16():
    from torchao.float8.float8_linear import Float8Linear

    model, precision = converted(sharded=False)
    floated = {name for name, module in model.named_modules() if isinstance(module, Float8Linear)}
    names = {"attention.query", "attention.key", "attention.value", "attention.out", "mlp.gate", "mlp.up", "mlp.down"}
    assert floated == {f"blocks.{index}.{name}" for index in range(2) for name in names}
    assert type(model.head) is torch.nn.Linear and not precision.float8_gathers
    modules = dict(model.named_modules())
    unsharded = [modules[name].config.enable_fsdp_float8_all_gather for name in floated]
    assert len(unsharded) == 14 and not any(unsharded)  # not sharded: no float8 all-gather


def test_selective_checkpointing_keeps_float8_products_and_amax():
    assert torch.ops.aten._scaled_mm.default in parallel.KEPT_OPS
    assert torch.ops.aten.max.default in parallel.KEPT_OPS


def float8_rank(rank: int, port: int, results) -> None:
    """One of two gloo ranks: the fp8 Llama sharded; its weights' type, and the scales an optimizer
    step leaves precomputed."""
    import torch.distributed as dist
    from torchao.float8.fsdp_utils import WeightWithDynamicFloat8CastTensor

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    model, precision = converted(sharded=True)
    model = parallel.prepare(model, parallel.Parallelism("fsdp"), torch.bfloat16, torch.device("cpu"))
    query = model.blocks[0].attention.query.weight
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for parameter in model.parameters():
        parameter.grad = torch.zeros_like(parameter)
    before = getattr(query._local_tensor, "_precomputed_scale", None)
    precision.step(optimizer, model)
    scale = query._local_tensor._precomputed_scale
    results[rank] = (
        precision.float8_gathers,
        isinstance(query._local_tensor, WeightWithDynamicFloat8CastTensor),
        type(model.head.weight._local_tensor).__name__,
        before is None and scale is not None,
        float(scale),
    )
    dist.destroy_process_group()


@pytest.mark.slow
def test_under_fsdp2_float8_weights_gather_in_float8_with_scales_computed_after_each_step():
    import torch.multiprocessing as mp

    from trainrun.launch import free_port

    results = mp.Manager().dict()
    mp.spawn(float8_rank, args=(free_port(), results), nprocs=2)
    for rank in range(2):
        gathers, float8_weight, head, precomputed, _ = results[rank]
        assert gathers and float8_weight and head == "Tensor" and precomputed, results[rank]
    assert results[0][4] == results[1][4]  # one scale over the whole weight, agreed by both ranks
