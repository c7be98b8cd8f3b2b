"""The operations a step runs, as the estimate times them (:mod:`trainrun.estimate.device`): each aten
operation of a fake pass with its FLOPs, the bytes it reads and writes, its kind and the dimensions
its speed depends on (:class:`OperationLog`), attention counted and run as the fused kernels a GPU
runs (:mod:`~trainrun.estimate.flops`, :class:`AsFusedAttention`). Written here because torch's FLOP
counter gives FLOPs alone, not what each operation moves or how its GEMM is shaped."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch.autograd.graph import register_multi_grad_hook
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils.flop_counter import flop_registry, shape_wrapper

from trainrun.estimate.flops import FUSED_ATTENTION, kernel_formulas
from trainrun.estimate.layout import CUDA_CORES, TRANSPOSE, Convolution, channels_first, laid_out_last, off_tensor_cores
from trainrun.models.flex import CAUSAL_SHARE

MATMUL, CONVOLUTION, ATTENTION, MEMORY = "matmul", "convolution", "attention", "memory"
# convolutions of several groups, timed as their groups' implicit GEMMs (grouped) or at the memory's
# bandwidth (depthwise: a channel a group), named apart: cuDNN's kernels for them are not the dense ones
GROUPED, DEPTHWISE = "grouped convolution", "depthwise convolution"
FLOAT8 = "float8"  # a matrix product of a layer precision=fp8 trains in float8 (torchao's)
SYNC = "host waits"  # the host reads a result back: it issues nothing more until the GPU has caught up
# the architectures whose GPUs run torch's grouped matrix product as one kernel (CUTLASS's, for bf16
# operands on compute capability 9.0 and 10.0); elsewhere, and in other precisions, torch loops over
# the groups: it reads the groups' sizes back to the host, then issues one product a group
GROUPED_KERNEL_ARCHITECTURES = frozenset({"hopper", "blackwell"})
# what torchao's tensorwise float8 scaling moves for each element of a float8 product's operand: the
# amax's read, then the cast's read and its float8 write
FLOAT8_CAST_BYTES = 2 + 2 + 1
aten = torch.ops.aten
# operations that launch no kernel: allocations, and the view torch's matmul takes of a product's
# output (a view its schema does not mark as one)
NO_KERNEL = {
    aten.empty,
    aten.empty_like,
    aten.empty_strided,
    aten.new_empty,
    aten.new_empty_strided,
    aten.lift_fresh,
    aten._unsafe_view,
}


class Access(NamedTuple):
    """A tensor an operation reads or writes: which storage (a serial, new each time an operation
    makes one), which part of it (its offset and shape: a view), and its bytes."""

    storage: int
    part: tuple
    bytes: int


class Operation(NamedTuple):
    """One operation of a step: its FLOPs, the bytes it reads and writes, its kind and the
    dimensions its efficiency depends on (a GEMM's m, n, k; attention's query and key lengths and
    head width; none for memory-bound operations); under a compiled run's log, the tensors it reads
    and writes and the storages it makes, from which a fused kernel's traffic follows
    (:func:`~trainrun.estimate.device.fused_kernels`)."""

    flops: float
    moved: float
    kind: str = MEMORY
    dims: tuple[int, ...] = ()
    compiled: bool = False  # run inside a compiled region: inductor may fuse it with its neighbours
    reads: tuple[Access, ...] = ()
    writes: tuple[Access, ...] = ()
    made: tuple[int, ...] = ()  # the storages of its new outputs


class AsFusedAttention(TorchFunctionMode):
    """``scaled_dot_product_attention`` as a GPU runs it: one fused kernel with its mask and dropout
    inside. The CPU runs a call with a mask or dropout as the unfused math path (a product, a softmax,
    a dropout, a product, each through memory), which a GPU's flash or memory-efficient kernel does
    not; so each call goes to the CPU's flash kernel without them, its stand-in in the operations.
    Where the mask pads sequences whose ``real_share`` of positions are tokens (a masked language
    model's), the kernel attends those alone, as the GPU's variable-length kernel does."""

    SIGNATURE = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")

    def __init__(self, real_share: float | None = None) -> None:
        super().__init__()
        self.real_share = real_share

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if func is not torch.nn.functional.scaled_dot_product_attention:
            return func(*args, **(kwargs or {}))
        named = dict(zip(self.SIGNATURE, args)) | (kwargs or {})
        padded = named.get("attn_mask") is not None and self.real_share is not None
        named |= {"attn_mask": None, "dropout_p": 0.0}
        if not padded:
            return func(**named)
        length = named["query"].shape[-2]
        real = max(1, round(length * self.real_share))
        for name in ("query", "key", "value"):
            named[name] = named[name][..., :real, :]
        return torch.nn.functional.pad(func(**named), (0, 0, 0, length - real))


# normalizations whose statistics (or whose gradients' sums) span more than a kernel holds on chip:
# they read their inputs once for the sums and again to normalize (two passes, as cuDNN's and torch's
# batch-norm kernels and torch's layer-norm backward run); a layer norm's forward, a row at a time,
# reads once
TWO_PASSES = {
    aten.native_batch_norm,
    aten._native_batch_norm_legit,
    aten.native_batch_norm_backward,
    aten.native_group_norm,
    aten.native_group_norm_backward,
    aten.native_layer_norm_backward,
}


class InsideRegions:
    """Whether the running operation belongs to one of ``regions`` (modules): from a region's forward's
    start to its end, and in the backward from its outputs' gradients to its inputs' (where its
    checkpointed forward is recomputed too). torch's ``ModuleTracker`` hooks the same points but
    names a module by its class path, not by which module it is; so written here."""

    def __init__(self, regions: list[torch.nn.Module]) -> None:
        self.depth = 0
        for region in regions:
            region.register_forward_pre_hook(self._enter)
            region.register_forward_hook(self._leave)

    @property
    def inside(self) -> bool:
        return self.depth > 0

    def around(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """``function`` as one more region: a compiled loss. Its backward is marked from its output's
        gradient on, which autograd computes where the output is scaled before ``backward()`` (as a
        step's loss is: the gradient hooks of the backward's root do not run)."""

        def region(*args: Any) -> Any:
            self._enter(None, args)
            output = function(*args)
            self._leave(None, args, output)
            return output

        return region

    def _step(self, by: int) -> None:
        self.depth += by

    def _enter(self, module: torch.nn.Module | None, inputs: Any) -> None:
        self._step(1)
        self._on_gradients(inputs, -1)

    def _leave(self, module: torch.nn.Module | None, inputs: Any, output: Any) -> None:
        self._step(-1)
        self._on_gradients(output, 1)

    def _on_gradients(self, values: Any, by: int) -> None:
        """Step the depth by ``by`` once every gradient of ``values``' tensors is computed."""
        leaves = pytree.tree_leaves(values)
        tensors = [value for value in leaves if isinstance(value, torch.Tensor) and value.requires_grad]
        if tensors and torch.is_grad_enabled():
            register_multi_grad_hook(tensors, lambda grads: self._step(by))


class OperationLog(TorchDispatchMode):
    """Each aten operation run under it, as an :class:`~trainrun.estimate.device.Operation`: its FLOPs
    by torch's formulas for matrix products, convolutions and fused attention (as :func:`pass_flops`
    counts them), the bytes it reads and writes (its tensor arguments read, those it changes in place
    written again, its new outputs written), its kind and dimensions (:func:`kind_of`); with compiled
    ``regions``, the tensors themselves (:class:`Access`), which a fused kernel's traffic is counted
    from. Views and allocations, which launch nothing, are left out."""

    def __init__(
        self, regions: InsideRegions | None = None, float8: InsideRegions | None = None, grouped_kernel: bool = True
    ) -> None:
        super().__init__()
        self.operations: list[Operation] = []
        self.grouped_kernel = grouped_kernel  # the GPU runs a bf16 grouped product as one kernel
        self.regions = regions  # the compiled regions
        self.float8 = float8  # the layers precision=fp8 trains in float8
        custom = {packet: shape_wrapper(formula) for packet, formula in kernel_formulas().items()}
        self.formulas = {**flop_registry, **custom}
        self.storages: dict[int, int] = {}  # a storage's address to its serial (compiled runs: regions given)
        self.serials = itertools.count(1)
        self.convolutions: list[Convolution] = []  # the compiled ones, which inductor lays out
        self.untiled: set[int] = set()  # the positions of compiled grouped ones no tile fits, if laid out last

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func.namespace != "aten" or func.is_view:
            return out
        if func.overloadpacket in NO_KERNEL:
            for value in pytree.tree_leaves(out):  # a new storage, not one that last had its address
                if isinstance(value, torch.Tensor) and self.regions is not None:
                    self._storage(value, made=True)
            return out
        packet, arguments = func.overloadpacket, func._schema.arguments
        flops = self.formulas[packet](*args, **kwargs, out_val=out) if packet in self.formulas else 0
        named = dict(zip((argument.name for argument in arguments), args)) | kwargs
        kind, dims = kind_of(packet, args, out) if flops else (MEMORY, ())
        if kind == ATTENTION and named.get("is_causal"):  # the kernel skips the key blocks past the diagonal
            flops, dims = flops * CAUSAL_SHARE, (dims[0], max(1, round(dims[1] * CAUSAL_SHARE)), dims[2])
        compiled = self.regions is not None and self.regions.inside
        if packet is aten.convolution_backward:  # its kernels' bytes and tensors are their own
            kernels = self._gradient_kernels(args, out, Operation(float(flops), 0.0, kind, dims, compiled))
            self.operations.extend(self._laid_out(kernels, args[1], args[2], args[4], args[9]))
            return out
        written = [named.get(item.name) for item in arguments if item.alias_info and item.alias_info.is_write]
        given = {id(value) for value in pytree.tree_leaves((args, kwargs))}
        fresh = [value for value in pytree.tree_leaves(out) if id(value) not in given]
        moved = float(_moved(packet, named, args, kwargs, written, fresh))
        if kind == MATMUL and self.float8 is not None and self.float8.inside:
            operands = sum(value.numel() for value in args if isinstance(value, torch.Tensor) and value.dim() == 2)
            self.operations.append(Operation(0.0, float(FLOAT8_CAST_BYTES * operands), compiled=compiled))
            kind, moved = FLOAT8, moved / 2  # float8 operands: half bf16's bytes
        accesses = self._accesses(packet, named, args, kwargs, written, fresh) if self.regions is not None else ()
        kernel = Operation(float(flops), moved, kind, dims, compiled, *accesses)
        if packet is aten._grouped_mm:
            self.operations.extend(self._grouped(kernel, args[0], named.get("offs")))
        elif packet is not aten.convolution:
            self.operations.append(kernel)
        else:  # with its transposes; a compiled one noted for inductor's layout
            self.operations.extend(self._laid_out([kernel], args[0], args[1], args[3], args[8]))
            if compiled:
                self.convolutions.append(Convolution(tuple(args[1].shape), args[8], kernel.flops))
        return out

    def _laid_out(
        self, kernels: list[Operation], x: torch.Tensor, weight: torch.Tensor, stride: list, groups: int
    ) -> list:
        """A convolution's ``kernels`` as its layout runs them (:mod:`~trainrun.estimate.layout`): with
        cuDNN's transposes after each product where its input ``x`` is channels-first (not a depthwise
        one's: what it reads and writes, again); a grouped one's products on the CUDA cores where
        channels-last and no tile fits its groups (a compiled one's positions noted for inductor's layout)."""
        if kernels[0].kind == DEPTHWISE:
            return kernels
        if kernels[0].kind == GROUPED and off_tensor_cores(x, weight, groups):
            if laid_out_last(x, weight):
                return [item._replace(kind=CUDA_CORES) if item.kind == GROUPED else item for item in kernels]
            if kernels[0].compiled:
                self.untiled.update(
                    len(self.operations) + at for at, item in enumerate(kernels) if item.kind == GROUPED
                )
        if not channels_first(x, weight, stride):
            return kernels
        again = [Operation(0.0, 2 * item.moved, TRANSPOSE, compiled=item.compiled) for item in kernels if item.flops]
        return [*kernels, *again]

    def _grouped(self, product: Operation, a: torch.Tensor, offsets: torch.Tensor | None) -> list[Operation]:
        """A grouped matrix ``product`` as the GPU runs it (:data:`GROUPED_KERNEL_ARCHITECTURES`): one
        kernel, or, where the groups' sizes are read back (``offsets``), the host's wait for them and
        one product a group, each its share of the FLOPs and bytes."""
        if offsets is None or (self.grouped_kernel and a.dtype == torch.bfloat16):
            return [product]
        groups = offsets.numel()
        each = product._replace(flops=product.flops / groups, moved=product.moved / groups)
        return [Operation(0.0, 0.0, SYNC, compiled=product.compiled), *[each] * groups]

    def _gradient_kernels(self, args: tuple, out: tuple, backward: Operation) -> list[Operation]:
        """A convolution's ``backward`` as its kernels (cuDNN's, and torch's for a depthwise one): one for
        each gradient it computes, each reading the output's gradient; the input's (reading the weight)
        and the weight's (reading the input) each at the forward's FLOPs and GEMM dimensions, the bias's
        a reduction."""
        grad_output, inputs, weight, mask = args[0], args[1], args[2], args[10]
        products = backward._replace(flops=backward.flops / max(1, sum(map(bool, mask[:2]))))
        reduction = backward._replace(flops=0.0, kind=MEMORY, dims=())
        kernels = []
        for reads, gradient, kernel in (
            ((grad_output, weight), out[0], products),
            ((grad_output, inputs), out[1], products),
            ((grad_output,), out[2], reduction),
        ):
            if gradient is None:
                continue
            kernel = kernel._replace(moved=float(tensor_bytes((reads, gradient))))
            if self.regions is not None:
                made = self._access(gradient, made=True)
                kernel = kernel._replace(reads=tuple(map(self._access, reads)), writes=(made,), made=(made.storage,))
            kernels.append(kernel)
        return kernels

    def _storage(self, tensor: torch.Tensor, made: bool = False) -> int:
        """The serial of ``tensor``'s storage: a new one where an operation ``made`` it."""
        local = getattr(tensor, "_local_tensor", tensor)
        owns_storage = local.layout == torch.strided and not is_traceable_wrapper_subclass(local)
        address = local.untyped_storage()._cdata if owns_storage else id(local)  # else: no storage of its own
        if made or address not in self.storages:
            self.storages[address] = next(self.serials)
        return self.storages[address]

    def _access(self, tensor: torch.Tensor, made: bool = False, part: tuple = (), size: int | None = None) -> Access:
        local = getattr(tensor, "_local_tensor", tensor)
        where = part or (local.storage_offset(), tuple(local.shape))
        return Access(self._storage(tensor, made), where, tensor_bytes(tensor) if size is None else size)

    def _accesses(
        self, packet: Any, named: dict, args: tuple, kwargs: dict, written: list, fresh: list
    ) -> tuple[tuple[Access, ...], tuple[Access, ...], tuple[int, ...]]:
        """What an operation reads and writes as :class:`Access` es, and the storages it makes, the
        bytes as :func:`_moved` counts them (a gather's source and a scatter's destination: the rows
        picked; a two-pass normalization's input: twice)."""
        tensors = [value for value in pytree.tree_leaves((args, kwargs)) if isinstance(value, torch.Tensor)]
        picked = len(self.operations)  # a gather's or a scatter's rows: this operation's own
        reads = [self._access(value) for value in tensors]
        if packet in GATHERS:
            reads[0] = self._access(tensors[0], part=("picked", picked), size=tensor_bytes(fresh))
        if packet in TWO_PASSES and _training(packet, named):
            reads.append(self._access(tensors[0], part=("again", picked)))
        writes = [self._access(value) for value in written if isinstance(value, torch.Tensor)]
        if packet in SCATTERS:
            writes = [self._access(tensors[0], part=("picked", picked), size=tensor_bytes((args[1:], kwargs)))]
        made = [self._access(value, made=True) for value in fresh if isinstance(value, torch.Tensor)]
        return tuple(reads), tuple(writes + made), tuple(access.storage for access in made)


def _moved(packet: Any, named: dict, args: tuple, kwargs: dict, written: list, fresh: list) -> int:
    """The bytes an operation reads and writes: its tensor arguments read (twice for
    :data:`TWO_PASSES`), those it changes in place written again, its new outputs written; for an
    indexed gather or scatter (:data:`GATHERS`, :data:`SCATTERS`), the rows it picks, not its source's
    or its destination's whole."""
    if packet in GATHERS:
        return tensor_bytes((args[1:], kwargs)) + 2 * tensor_bytes(fresh)
    if packet in SCATTERS:
        return 2 * tensor_bytes((args[1:], kwargs))
    reads = tensor_bytes((args, kwargs)) * (2 if packet in TWO_PASSES and _training(packet, named) else 1)
    return reads + tensor_bytes((written, fresh))


def _training(packet: Any, named: dict) -> bool:
    """Whether a normalization computes its statistics (a batch norm in evaluation reads its running ones)."""
    return named.get("training", True) if packet in (aten.native_batch_norm, aten._native_batch_norm_legit) else True


# operations that read (gather) or write in place (scatter) only the rows an index picks from their
# first argument, as their kernels do: a loss's picked log-probabilities, an embedding's rows
GATHERS = {aten.index, aten.gather, aten.index_select, aten.embedding, aten.nll_loss_forward, aten.nll_loss2d_forward}
SCATTERS = {aten.index_put_, aten._index_put_impl_, aten.scatter_, aten.scatter_add_, aten.index_add_, aten.index_copy_}
MATMULS = {aten.mm: (0, 1), aten._scaled_mm: (0, 1), aten.addmm: (1, 2), aten.bmm: (0, 1), aten.baddbmm: (1, 2)}


def kind_of(packet: Any, args: tuple, out: Any) -> tuple[str, tuple[int, ...]]:
    """An operation with FLOPs as the GPU runs it: a matrix product's (m, n, k), batched ones' batch
    folded into m; a convolution's implicit GEMM per group (m: the outputs' positions, n: a group's
    output channels, k: a group's input channels times the kernel's taps; grouped where it has several),
    a depthwise one (a channel a group) memory-bound; a fused attention kernel's (query length, key
    length, head width)."""
    if packet in MATMULS:
        left, right = (args[index] for index in MATMULS[packet])
        rows = math.prod(left.shape[:-1])
        return MATMUL, (rows, right.shape[-1], left.shape[-1])
    name = str(packet)
    if packet in (aten.convolution, aten.convolution_backward):
        forward = packet is aten.convolution
        weight, groups = args[1] if forward else args[2], args[8] if forward else args[9]
        output = out if forward else args[0]
        if weight.shape[1] == 1 and groups > 1:
            return DEPTHWISE, ()
        positions = output.shape[0] * math.prod(output.shape[2:])
        gemm = (positions, weight.shape[0] // groups, weight.shape[1] * math.prod(weight.shape[2:]))
        return GROUPED if groups > 1 else CONVOLUTION, gemm
    if packet is aten._grouped_mm:
        return MATMUL, grouped_gemm(args[0], args[1], args[2] if len(args) > 2 else None)
    if "scaled_dot_product" in name and any(kernel in name for kernel in FUSED_ATTENTION):
        query, key = (args[0], args[1]) if not name.endswith("_backward") else (args[1], args[2])
        return ATTENTION, (query.shape[-2], key.shape[-2], query.shape[-1])
    return MATMUL, ()


def grouped_gemm(a: torch.Tensor, b: torch.Tensor, offsets: torch.Tensor | None) -> tuple[int, ...]:
    """A grouped product's GEMM for one group (m, n, k), the rows that ``offsets`` split among its
    groups taken as evenly split (as a balanced mixture of experts routes its tokens): a 2-D operand
    against a 3-D one's groups (an expert's product, its input's gradient), two 2-D ones summed a
    group into a 3-D output (the experts' weights' gradient), or two batches of matrices (no offsets)."""
    if offsets is None:
        return a.shape[1], b.shape[2], a.shape[2]
    groups = offsets.numel()
    if a.dim() == b.dim() == 2:
        return a.shape[0], b.shape[1], max(1, a.shape[1] // groups)
    if a.dim() == 2:
        return max(1, a.shape[0] // groups), b.shape[-1], a.shape[1]
    return a.shape[1], max(1, b.shape[1] // groups), a.shape[2]


def tensor_bytes(values: Any) -> int:
    """Bytes of the tensors in ``values`` (a sharded tensor's: its local shard's)."""
    tensors = [getattr(value, "_local_tensor", value) for value in pytree.tree_leaves(values)]
    return sum(tensor.numel() * tensor.element_size() for tensor in tensors if isinstance(tensor, torch.Tensor))
