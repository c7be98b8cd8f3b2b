"""How the ranks share a model: a whole copy each (DDP) or a shard each (FSDP2), and activation
checkpointing beside either.

Under ``parallel=fsdp`` each of the model's blocks (``model.blocks``) is one FSDP2 unit, and the
whole model the root unit holding the rest (embeddings, final norm, head): a rank keeps 1/N of every
weight, gradient and optimizer state, gathers a block's weights just before its forward and
backward, and reduce-scatters its gradients (in float32 under ``precision=bf16``, whose policy
computes in bfloat16 on float32 master weights). A model that can (``Capability.META_INIT``) is
built on the meta device and materialised shard by shard. Every micro-batch's backward
reduce-scatters its gradients into the rank's shard (:func:`defers_reduction`). Over several nodes
the ranks shard within a node and replicate across nodes (HSDP, :func:`sharding_mesh`).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from trainrun.core.distributed import nodes_from_environment


@dataclass(frozen=True)
class Parallelism:
    """How the ranks share the model (a run's ``parallel`` settings)."""

    name: str = "ddp"  # ddp: a whole copy per rank; fsdp: FSDP2 shards
    reshard_after_forward: bool = True  # fsdp: gather each block's weights again for its backward
    activation_checkpointing: str = "none"  # none, selective or full
    checkpoint_every: int = 1  # checkpoint every k-th block (1: all of them)
    selective_products: str = "all"  # selective: keep all of a block's products, or every other one


# What selective activation checkpointing keeps from each block's forward: the matrix products
# (float8's ``_scaled_mm`` among them) and attention, the costly work, and ``max`` (float8's amax
# reduction: one number a tensor, so its cast is recomputed without reading the tensor again);
# everything element-wise (norms, activations, rotary, float8's casts) is recomputed. torchtitan's
# list, less what trainrun does not run (tensor parallelism's reduce-scatter).
PRODUCTS = frozenset(getattr(torch.ops.aten, name).default for name in ("mm", "addmm", "bmm", "_scaled_mm"))
KEPT_OPS = PRODUCTS | frozenset(
    getattr(torch.ops.aten, name).default
    for name in (
        "max",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
    )
    if hasattr(torch.ops.aten, name)
)


# torch 2.12 and later can route the tensors selective checkpointing keeps through the surrounding
# saved-tensors hooks (offloading, measurement); torch 2.11 keeps them aside and takes no such setting.
SAC_HOOKS = (
    {"respect_saved_tensors_hooks": True}
    if "respect_saved_tensors_hooks" in inspect.signature(checkpoint).parameters
    else {}
)


def _keep_products(context, op, *args, **kwargs) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in KEPT_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def _keep_every_other_product() -> Callable:
    """A policy for one block's forward keeping its first, third, ... matrix product and recomputing
    the others (torchtitan's op policy); the forward and its recompute count their products apart, so
    both choose the same ones."""
    seen = collections.Counter()

    def policy(context, op, *args, **kwargs) -> CheckpointPolicy:
        if op in PRODUCTS:
            seen[context.is_recompute] += 1
            if seen[context.is_recompute] % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
        return _keep_products(context, op)

    return policy


def draws_random_numbers(module: nn.Module) -> bool:
    """Whether ``module``'s forward may draw random numbers: a dropout layer, or a ``dropout`` rate
    (attention dropout passed to SDPA), above zero. Without them a recompute need not replay the
    forward's RNG state (saving and restoring it costs host time every pass)."""
    for part in module.modules():
        rate = part.p if isinstance(part, nn.Dropout) else getattr(part, "dropout", 0)
        if isinstance(rate, (int, float)) and rate > 0:
            return True
    return False


def checkpointed(
    forward: Callable, selective: bool, keeps_rng_state: bool = True, every_other_product: bool = False
) -> Callable:
    """``forward`` recomputed in the backward pass (all of it, or under ``selective`` its cheap ops,
    and every other product where ``every_other_product``); the RNG state is saved for the recompute
    only where ``keeps_rng_state``. Under ``torch.compile`` (a compiled block) the checkpoint and its
    policy are traced into the block's graph: the policy is applied once, at compile time, not by a
    dispatch mode on every op of every pass."""

    def context():
        return create_selective_checkpoint_contexts(
            _keep_every_other_product() if every_other_product else _keep_products
        )

    options = {"use_reentrant": False, "preserve_rng_state": keeps_rng_state}

    @functools.wraps(forward)
    def run(*args, **kwargs):
        if selective:
            return checkpoint(forward, *args, context_fn=context, **options, **SAC_HOOKS, **kwargs)
        return checkpoint(forward, *args, **options, **kwargs)

    return run


def repeated_blocks(model: nn.Module) -> list[nn.Module]:
    """``model``'s blocks (``model.blocks``): FSDP2's units, activation checkpointing's, a compiled run's
    regions. ``blocks`` lists them (trainrun's models, a transformers model's layers, timm's
    transformers), or is one module holding them in one list (``nn.TransformerEncoder``'s layers);
    anything else is no blocks."""
    blocks = getattr(model, "blocks", None)
    if isinstance(blocks, nn.Module) and not isinstance(blocks, (nn.ModuleList, nn.Sequential)):
        lists = [child for child in blocks.children() if isinstance(child, (nn.ModuleList, nn.Sequential))]
        blocks = lists[0] if len(lists) == 1 else None
    if not isinstance(blocks, (nn.ModuleList, nn.Sequential, list, tuple)):
        return []
    return [block for block in blocks if isinstance(block, nn.Module)]


def checkpoint_activations(model: nn.Module, settings: Parallelism) -> None:
    """Recompute the activations of every ``checkpoint_every``-th block (the first, then each k on) in
    the backward (``activation_checkpointing``: none, selective or full; selective keeping
    ``selective_products``: all, or every other one); the others keep theirs."""
    mode = settings.activation_checkpointing
    if mode == "none":
        return
    alternate = settings.selective_products == "alternate"
    for index, block in enumerate(repeated_blocks(model)):
        if index % settings.checkpoint_every == 0:
            block.forward = checkpointed(block.forward, mode == "selective", draws_random_numbers(block), alternate)


def shards(settings: Parallelism) -> bool:
    """Whether the model is sharded: the run asks for FSDP2 and has a process group (every run on
    several ranks; a bench on one). On one process without a group there is nothing to shard."""
    return settings.name == "fsdp" and torch.distributed.is_initialized()


def sharding_mesh(device_type: str, world_size: int, nodes: int) -> DeviceMesh:
    """The ranks FSDP2 shards over: all of them on one node; over several nodes a 2-D mesh (nodes x
    ranks a node) that shards within a node and replicates across nodes (HSDP: a weight's gathers
    stay on the node's fast links, only the gradient all-reduce crosses nodes), as FSDP2's docs and
    torchtitan advise beyond one node."""
    if nodes <= 1 or world_size % nodes:
        return init_device_mesh(device_type, (world_size,), mesh_dim_names=("shard",))
    return init_device_mesh(device_type, (nodes, world_size // nodes), mesh_dim_names=("replicate", "shard"))


def prepare(
    model: nn.Module,
    settings: Parallelism,
    dtype: torch.dtype | None,
    device: torch.device,
    mesh: DeviceMesh | None = None,
) -> nn.Module:
    """``model`` with activation checkpointing, on ``device``, sharded under FSDP2 where
    :func:`shards` (DDP wraps it later, after the optimizer and ``torch.compile``) over ``mesh``
    (default :func:`sharding_mesh` of the run's ranks and nodes); a model built on the meta device is
    materialised shard by shard."""
    checkpoint_activations(model, settings)
    if not shards(settings):
        return model.to(device)
    mesh = mesh or sharding_mesh(device.type, torch.distributed.get_world_size(), nodes_from_environment())
    # bf16: compute in bfloat16 from float32 master weights, gradients reduced in float32
    policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32) if dtype else MixedPrecisionPolicy()
    for block in repeated_blocks(model):
        fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=settings.reshard_after_forward)
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=False)  # the backward starts at once
    if any(parameter.is_meta for parameter in model.parameters()):
        model.to_empty(device=device)
        if hasattr(model, "initialise"):  # a model built to be sharded (trainrun estimate's fake rank: any)
            model.initialise()  # each weight whole on the host in turn, each rank keeping its shard
    return model


# Each rank keeps its own batch-norm statistics between evaluations (no broadcast before every
# forward); they are averaged over the ranks where they are read. torch 2.15 renamed the switch.
NO_BUFFER_BROADCAST = (
    {"forward_sync_buffers": False}
    if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
    else {"broadcast_buffers": False}
)


def replicate(model: nn.Module, device: torch.device, find_unused_parameters: bool) -> nn.Module:
    """``model`` under DDP (already on ``device``); gradients live in DDP's buckets (no copy of every
    gradient into and out of them), each rank's buffers its own."""
    return DistributedDataParallel(
        model,
        device_ids=[device] if device.type == "cuda" else None,
        find_unused_parameters=find_unused_parameters,
        gradient_as_bucket_view=True,
        **NO_BUFFER_BROADCAST,
    )


def is_sharded(model: nn.Module) -> bool:
    """Whether ``model`` (unwrapped) holds its weights as FSDP2 shards."""
    return isinstance(model, FSDPModule)


def defers_reduction(raw_model: nn.Module) -> bool:
    """Whether a micro-batch's gradients may stay unreduced until the step's last pass.

    Under DDP they do (``no_sync``): they accumulate in its buckets, the model's size either way.
    Under FSDP2 they do not: a gradient left unreduced is kept whole and in float32 per parameter
    (``FSDPParam.unsharded_accumulated_grad``), the whole model's float32 size on every rank instead of
    its shard (32 GB for 8B weights), so each pass reduce-scatters into the rank's shard, as torchtitan
    does, trading one reduce-scatter per micro-batch for that memory."""
    return not is_sharded(raw_model)


def pass_context(model: nn.Module, raw_model: nn.Module, synchronises: bool) -> contextlib.AbstractContextManager:
    """What a micro-batch's forward and backward run in: DDP's ``no_sync`` for a pass that need not
    synchronise where gradients may wait unreduced (:func:`defers_reduction`), else nothing."""
    waits = not synchronises and defers_reduction(raw_model) and isinstance(model, DistributedDataParallel)
    return model.no_sync() if waits else contextlib.nullcontext()


def local_bytes(tensor: torch.Tensor) -> int:
    """Bytes of ``tensor`` on this rank (its local shard of a DTensor)."""
    tensor = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return tensor.numel() * tensor.element_size()


def held_bytes(model: nn.Module, optimizers: Iterable[torch.optim.Optimizer]) -> dict[str, int]:
    """Bytes this rank holds of the weights, their gradients and the ``optimizers``' state (its
    shards under FSDP2; a step counter, 0-D, is not counted)."""
    parameters = list(model.parameters())
    state = [value for optimizer in optimizers for entry in optimizer.state.values() for value in entry.values()]
    return {
        "weights": sum(map(local_bytes, parameters)),
        "gradients": sum(local_bytes(p.grad) for p in parameters if p.grad is not None),
        "optimizer": sum(local_bytes(value) for value in state if torch.is_tensor(value) and value.dim() > 0),
    }


def whole_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """``model``'s weights, whole, on the host of rank 0 (under FSDP2 a collective every rank
    calls; the others get nothing)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    if not is_sharded(model):
        return model.state_dict()
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
