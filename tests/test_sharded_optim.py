"""FSDP2 at the size that matters, shown on 2 gloo ranks: gradients stay sharded while micro-batches
accumulate, every optimizer trains the shards, and norms of every kind skip weight decay."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.fsdp import FSDPModule

from trainrun.config import compose
from trainrun.core import checkpoint, parallel
from trainrun.core.sharded_checkpoint import ShardedCheckpoints
from trainrun.errors import ConfigError
from trainrun.models.llama import Llama
from trainrun.optim.optimizers import _param_groups, build_optimizer
from trainrun.schema import LlamaConfig, OptimizerConfig
from trainrun.tasks.causal_lm import next_token_cross_entropy
from trainrun.validation import validate

OPTIMIZERS = ("sgdw", "sgd", "adamw", "lamb", "radam")  # every optimizer but Muon, which fsdp refuses
BLOCKS = LlamaConfig(layers=4, heads=4, kv_heads=2, width=128, ffn_hidden=256, max_seq_len=16)
VOCAB = 64


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def gradient_bytes(model: torch.nn.Module) -> int:
    """Bytes of gradient a rank holds: its sharded gradients and any whole gradient FSDP2 keeps
    for a pass that did not reduce (``unsharded_accumulated_grad``)."""
    held = parallel.held_bytes(model, [])["gradients"]
    for module in model.modules():
        if isinstance(module, FSDPModule):
            group = module._get_fsdp_state()._fsdp_param_group
            for fsdp_param in group.fsdp_params if group else ():
                whole = getattr(fsdp_param, "unsharded_accumulated_grad", None)
                held += parallel.local_bytes(whole) if whole is not None else 0
    return held


def sharded_llama() -> torch.nn.Module:
    torch.manual_seed(0)
    with torch.device("meta"):
        model = Llama(BLOCKS, VOCAB)
    return parallel.prepare(model, parallel.Parallelism(name="fsdp"), None, torch.device("cpu"))


def micro_batch_passes(model: torch.nn.Module, passes: int) -> list[int]:
    """The gradient bytes a rank holds after each pass of one step, reduced as the trainer reduces them."""
    torch.manual_seed(dist.get_rank())
    held = []
    for index in range(passes):
        tokens = torch.randint(0, VOCAB, (2, 17))
        with parallel.pass_context(model, model, synchronises=index == passes - 1):
            next_token_cross_entropy(model(tokens[:, :-1]), tokens[:, 1:]).backward()
        held.append(gradient_bytes(model))
    return held


def rank_main(rank: int, port: int, folder: str, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    model = sharded_llama()
    results[("held", rank)] = micro_batch_passes(model, passes=3)
    results[("shard", rank)] = parallel.held_bytes(model, [])["weights"]
    results[("whole", rank)] = sum(p.numel() * p.element_size() for p in model.parameters())
    for name in OPTIMIZERS:
        model = sharded_llama()
        optimizer = build_optimizer(model, OptimizerConfig(name=name, lr=1e-2, weight_decay=1e-2), 8)
        before = [p.to_local().clone() for p in model.parameters()]
        micro_batch_passes(model, passes=2)
        optimizer.step()
        after = [p.to_local() for p in model.parameters()]
        moved = sum(not torch.equal(old, new) for old, new in zip(before, after, strict=True))
        results[(name, rank)] = (moved, len(after), all(bool(torch.isfinite(p).all()) for p in after))
    results[("async", rank)] = saved_in_the_background(model, optimizer, Path(folder) / "ep0-ba1")
    dist.destroy_process_group()


def saved_in_the_background(model: torch.nn.Module, optimizer, path: Path) -> bool:
    """An async sharded checkpoint is complete on disk (trainer.pt, renamed) once its shards are,
    before anything waits for it (the next save or the run's end)."""
    checkpoints = ShardedCheckpoints(dist.get_rank() == 0, 2, keep=2, asynchronous=True)
    checkpoints.save(path, model, optimizer, {"format": checkpoint.FORMAT})
    deadline = time.monotonic() + 60
    while dist.get_rank() == 0 and not (path / checkpoint.TRAINER_FILE).is_file() and time.monotonic() < deadline:
        time.sleep(0.05)
    complete = (path / checkpoint.TRAINER_FILE).is_file() or dist.get_rank() != 0
    checkpoints.finish()
    return complete and (path / ".metadata").is_file()


def hsdp_main(rank: int, port: int, results) -> None:
    """One of 4 ranks as 2 nodes of 2 (as torchrun names them): 3 AdamW steps of a global batch of 8."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="4")
    os.environ.update(LOCAL_RANK=str(rank % 2), LOCAL_WORLD_SIZE="2", GROUP_RANK=str(rank // 2), GROUP_WORLD_SIZE="2")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    model = sharded_llama()
    mesh = next(iter(model.parameters())).device_mesh
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, eps=1e-5)  # eps above float noise
    for tokens in global_batches():
        mine = tokens[2 * rank : 2 * rank + 2]
        next_token_cross_entropy(model(mine[:, :-1]), mine[:, 1:]).backward()
        optimizer.step()
        optimizer.zero_grad()
    whole = parallel.whole_state(model)
    results[("groups", rank)] = (mesh["shard"].mesh.tolist(), mesh["replicate"].mesh.tolist())
    if rank == 0:
        results["mesh"] = (tuple(mesh.shape), mesh.mesh_dim_names)
        results["weights"] = {name: value.clone() for name, value in whole.items()}
    dist.destroy_process_group()


@pytest.mark.parametrize(("ranks", "nodes"), [(4, 2), (8, 2), (6, 3), (4, 1)])
def test_the_sharding_mesh_shards_within_a_node_and_replicates_across_nodes(ranks, nodes):
    """The ranks of a node (launchers number them consecutively: node n holds n x per-node to the
    next) are one shard group; a rank's replicas are its places on the other nodes (rank 0 of a fake
    process group's view)."""
    from trainrun.estimate.memory import fake_world

    per_node = ranks // nodes
    with fake_world(ranks):
        mesh = parallel.sharding_mesh("cpu", ranks, nodes)
        layout = mesh.mesh.tolist()
        if nodes == 1:
            assert (layout, mesh.mesh_dim_names) == (list(range(ranks)), ("shard",))
            return
        assert mesh.mesh_dim_names == ("replicate", "shard")
        assert layout == [list(range(node * per_node, (node + 1) * per_node)) for node in range(nodes)]
        assert mesh["shard"].mesh.tolist() == list(range(per_node))
        assert mesh["replicate"].mesh.tolist() == list(range(0, ranks, per_node))


def global_batches() -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(7)
    return [torch.randint(0, VOCAB, (8, 17), generator=generator) for _ in range(3)]


@pytest.mark.slow
def test_several_nodes_shard_within_a_node_and_replicate_across_and_train_as_one_rank():
    results = mp.Manager().dict()
    mp.spawn(hsdp_main, args=(free_port(), results), nprocs=4)
    assert results["mesh"] == ((2, 2), ("replicate", "shard"))
    # each rank shards with the other rank of its node and replicates with its place on the other node
    assert [results[("groups", rank)] for rank in range(4)] == [
        ([0, 1], [0, 2]),
        ([0, 1], [1, 3]),
        ([2, 3], [0, 2]),
        ([2, 3], [1, 3]),
    ]
    torch.manual_seed(0)
    model = Llama(BLOCKS, VOCAB)  # one process, the same initial weights (each drawn from its own generator)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, eps=1e-5)  # eps above float noise
    for tokens in global_batches():
        next_token_cross_entropy(model(tokens[:, :-1]), tokens[:, 1:]).backward()
        optimizer.step()
        optimizer.zero_grad()
    for name, value in model.state_dict().items():
        torch.testing.assert_close(results["weights"][name], value, atol=2e-5, rtol=1e-4)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    results = mp.Manager().dict()
    mp.spawn(rank_main, args=(free_port(), str(tmp_path_factory.mktemp("checkpoints")), results), nprocs=2)
    return dict(results)


@pytest.mark.distributed
def test_gradients_stay_sharded_while_micro_batches_accumulate(two_ranks):
    for rank in (0, 1):
        shard, whole = two_ranks[("shard", rank)], two_ranks[("whole", rank)]
        assert shard < 0.55 * whole
        # after every pass, the first two included, a rank holds its shard's gradient, not the model's
        assert two_ranks[("held", rank)] == [shard, shard, shard]


@pytest.mark.distributed
def test_an_async_sharded_checkpoint_is_complete_as_soon_as_its_shards_are_written(two_ranks):
    assert two_ranks[("async", 0)] and two_ranks[("async", 1)]


@pytest.mark.distributed
@pytest.mark.parametrize("name", OPTIMIZERS)
def test_every_optimizer_trains_the_shards(two_ranks, name):
    for rank in (0, 1):
        moved, parameters, finite = two_ranks[(name, rank)]
        assert finite and moved == parameters, (name, rank, moved, parameters)


def test_muon_under_fsdp_is_refused_in_one_line():
    config = compose(["task=causal_lm", "data=stdlib_stream", "model=gpt_tiny", "optimizer=muon", "parallel=fsdp"])
    with pytest.raises(ConfigError, match="^bad value for 'optimizer.name': 'muon' does not run under parallel=fsdp"):
        validate(config, files=False)


def test_rms_norms_and_biases_are_exempt_from_weight_decay():
    model = Llama(BLOCKS, VOCAB)
    decayed, exempt = _param_groups(model, exclude_norm_and_bias=True)
    names = {id(p): name for name, p in model.named_parameters()}
    assert {names[id(p)] for p in exempt["params"]} == {n for n in names.values() if n.endswith("norm.weight")}
    assert all(p.dim() == 2 for p in decayed["params"]) and exempt["weight_decay"] == 0.0
