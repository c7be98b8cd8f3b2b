"""Nodes as replica groups that train on when one is lost (``launcher.fault_tolerance=replicas``).

Each node is one replica group: its ranks form their own process group (DDP or FSDP2 within the
node), and torchft's Manager joins the groups (its Lighthouse decides who takes part in each step, its
reconfigurable process group exchanges the gradients between nodes, and it copies a live replica's
state to one that starts again). What torchft leaves to the trainer is kept here:

- **The global batch is kept.** A step's samples are divided into the planned nodes' shares; each
  live node trains its own, and the shares of nodes not in the step's quorum are taken by the live
  ones as more micro-batches (:meth:`Replicas.shares`). Each node's gradient is its ranks' average;
  the nodes' gradients are summed and divided by the planned nodes, so a step's arithmetic is the
  uninterrupted run's, whoever trained it.
- **A failed step is redone.** A step whose exchange failed (a node lost in it) is not committed:
  its gradients are dropped and the same step runs again with the next quorum, so no sample is
  skipped or seen twice.
- **A node that starts again** receives the trainer's state (the checkpoint payload, weights and
  optimizer state as each rank holds them) from a live node in its first quorum, and goes on from
  that step.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any

import torch
from torch.distributed.tensor import DTensor
from torch.utils._pytree import tree_map_only
from torchft import Manager, ProcessGroupGloo, ProcessGroupNCCL
from torchft.checkpointing.http_transport import HTTPTransport

from trainrun.core import heartbeat
from trainrun.core.distributed import REPLICA_TIMEOUT, Placement
from trainrun.core.heartbeat import NODE_ADDRESS
from trainrun.core.start_store import START_STORE, wait_for_every_node
from trainrun.core.state import State
from trainrun.errors import NodeUnreachable

LIGHTHOUSE = "TORCHFT_LIGHTHOUSE"  # torchft's variable: the lighthouse's address, as the launcher tells it

Payload = dict[str, Any]
ADDRESS_BYTES = 64  # a node's address, as each step's membership exchange carries it


@dataclass
class Fault:
    """A node lost or joined, as ``summary.json`` lists it."""

    event: str  # lost or joined
    step: int  # the step it was lost in, or joined at
    node: int
    host: str
    ranks: list[int]  # the run's ranks it held
    seconds: float | None = None  # lost: from its last step with the others to the next step committed without it


class Replicas:
    """This rank's place among the run's replica groups, through torchft's Manager, made as the rank
    starts: its node is heard by the lighthouse from then on, and the first quorum waits for a node
    heard but not yet asking (the lighthouse's join timeout), rather than starting without it.
    ``address`` is this node's, as the others reach it (the state it serves, the faults named).
    """

    def __init__(
        self,
        placement: Placement,
        device: torch.device,
        lost_after: float,
        start_timeout: float,
        requeue: bool,
        shrink: bool = False,
    ) -> None:
        self.replica, self.replicas, self.shrink, self.device = placement.replica, placement.replicas, shrink, device
        self.rank, self.world_size = placement.rank, placement.world_size
        self.address = os.environ.get(NODE_ADDRESS, "127.0.0.1")
        self.lighthouse = os.environ.get(LIGHTHOUSE, "")
        self.healed, self._quorum_held = False, False
        self._loaders: dict[int, ShareLoader] = {}
        self._held: list[torch.Tensor] = []  # the step's shares' gradients, in node order (hold_share)
        self._counted_terms = False  # the step's losses weighed by their terms' share (summed)
        logging.getLogger("torchft").setLevel(logging.CRITICAL)  # a failed exchange is said in one line, below
        collectives = timedelta(seconds=float(os.environ.get(REPLICA_TIMEOUT, "10")))
        transport = RoutedTransport(self.address, timeout=timedelta(minutes=10), num_chunks=0)
        group = _process_group(device, collectives)
        self.manager = Manager(
            pg=group,
            load_state_dict=None,  # attach's, once the trainer is built
            state_dict=None,
            min_replica_size=1,
            use_async_quorum=False,  # who takes part is known before the step's samples are chosen
            timeout=timedelta(minutes=10),  # a state sent to a node that joins; a commit's agreement
            quorum_timeout=timedelta(hours=1),  # a node may wait this long on another's checkpoint or evaluation
            connect_timeout=timedelta(seconds=60),
            rank=self.rank,
            world_size=self.world_size,
            replica_id=f"trainrun_node_{self.replica}",
            hostname=self.address,
            checkpoint_transport=transport,
            init_sync=False,  # every node builds the same seeded weights
        )
        if self.rank == 0:
            threading.Thread(target=self._watch_lighthouse, args=(lost_after, requeue), daemon=True).start()
            if wait_for_every_node(os.environ[START_STORE], self.replicas, start_timeout):
                self.say(f"node {self.replica}: every node came; training starts")
        self.live: list[int] | None = None  # the nodes taking part in the step (None: not yet known)
        self.hosts: dict[int, str] = {}
        self.faults: list[Fault] = []
        self._last_commit = time.monotonic()
        self._lost_since: dict[int, float] = {}

    def _watch_lighthouse(self, lost_after: float, requeue: bool) -> None:
        """End this node when the lighthouse has not answered for ``lost_after`` seconds (its host
        lost, or this node cut off): its quorum would otherwise wait for it as long as a slow node's
        checkpoint may take. Under Slurm node 0 requeues the job, which ended short."""
        host, _, port = self.lighthouse.removeprefix("http://").rpartition(":")
        heard = time.monotonic()
        while time.monotonic() - heard < lost_after:
            try:
                with socket.create_connection((host.strip("[]"), int(port)), timeout=2.0):
                    heard = time.monotonic()
            except OSError:
                pass
            time.sleep(1.0)
        heartbeat.end_this_rank(
            f"lost the lighthouse at {host}:{port} (no answer for {lost_after:.0f} s): node {self.replica} ends; "
            "resume=auto continues from the newest checkpoint",
            survivor=self.replica == 0,
            requeue=requeue,
        )

    def attach(self, state: State, save: Callable[[], Payload], restore: Callable[[Payload], None]) -> None:
        """The trainer's state: what this node sends a node that joins (``save``'s payload) and takes
        when it joins (``restore`` takes the payload once the weights and optimizer state are in place)."""
        self.state, self._save, self._restore = state, save, restore
        self.manager.register_state_dict_fn("trainrun", self._healed_with, self._sent)

    def start_at(self, step: int) -> None:
        """The step this run starts from (a resumed checkpoint's), as torchft counts its commits."""
        self.manager.load_state_dict({"step": step, "batches_committed": step * self.replicas})

    def _sent(self) -> dict[str, Any]:
        """What a node that joins receives from this rank: the trainer's payload, the weights and
        optimizer state as this rank holds them (its shards under FSDP2)."""
        payload = self._save()
        payload["model"] = {name: _local(value) for name, value in payload["model"].items()}
        payload["optimizer"] = tree_map_only(torch.Tensor, _local, payload["optimizer"])
        return payload

    def _healed_with(self, payload: dict[str, Any]) -> None:
        """A live node's state, received in this node's first quorum."""
        model, optimizer = self.state.raw_model, self.state.optimizer
        held = model.state_dict()
        torch._foreach_copy_([_local(held[name]) for name in payload["model"]], list(payload["model"].values()))
        load_local_optimizer_state(optimizer, payload["optimizer"])
        self._restore(payload)
        self._loaders.clear()
        self.healed = True
        self.say(f"node {self.replica} joined at step {self.state.batch}: the state of a live node received")

    def begin_step(self, step: int) -> bool:
        """The step's quorum, and who takes part; True if this node was behind and now holds a live
        node's state (the trainer then reads its data from that step: the quorum holds for it)."""
        if self._quorum_held:  # the quorum this node joined in: its step goes on
            self._quorum_held = False
            self._read_membership(step)
            return False
        self.healed = False
        try:
            self.manager.start_quorum()
        except Exception as error:  # torchft's, from its quorum: the lighthouse, gone
            raise NodeUnreachable(
                f"lost the lighthouse at {self.lighthouse} ({str(error).splitlines()[0]}); "
                "resume=auto continues from the newest checkpoint"
            ) from error
        if self.healed:
            self._quorum_held = True
            return True
        self._read_membership(step)
        return False

    def _read_membership(self, step: int) -> None:
        """Every node's row (taking part, its address) through one sum over the quorum; lines and
        faults for the nodes lost and joined since the last step."""
        rows = torch.zeros(self.replicas, 1 + ADDRESS_BYTES)
        encoded = self.address.encode()[:ADDRESS_BYTES]
        rows[self.replica, 0] = 1
        rows[self.replica, 1 : 1 + len(encoded)] = torch.tensor(list(encoded), dtype=torch.float32)
        self.manager.allreduce(rows, reduce_op=torch.distributed.ReduceOp.SUM).wait()
        if self._node_failed():
            return  # the step will not commit; the next quorum tells again
        live = [node for node in range(self.replicas) if rows[node, 0] > 0.5]
        for node in set(live) - set(self.live or []):  # new to the step: read where it is
            self.hosts[node] = bytes(int(v) for v in rows[node, 1:].tolist() if v > 0.5).decode()
        if self.live is None:  # the first step this node takes part in
            self.live, absent = live, [node for node in range(self.replicas) if node not in live]
            if absent:
                self.say(f"node(s) {absent} not up at step {step}: they join when they come")
            return
        previous, self.live = self.live, live
        for node in sorted(set(previous) - set(live)):
            self._lost(node, step)
        for node in sorted(set(live) - set(previous)):
            self._joined(node, step)

    def _node_failed(self) -> bool:
        """Whether the membership exchange failed on any rank of this node; then every rank of it
        skips the step's later exchanges. Otherwise a rank whose exchange went through, held at the
        node's next collective by one whose exchange was timing out, would then wait out its own
        gradients' exchange: a node lost between two ranks' exchanges cost two timeouts, not one."""
        here = self.manager.errored() is not None
        if self.world_size == 1:
            return here
        failed = torch.tensor([float(here)], device=self.device)
        torch.distributed.all_reduce(failed, op=torch.distributed.ReduceOp.MAX)
        anywhere = bool(failed.item())
        if anywhere and not here:
            self.manager.report_error(RuntimeError("another rank of this node lost the exchange"))
        return anywhere

    def _ranks_of(self, node: int) -> list[int]:
        return list(range(node * self.world_size, (node + 1) * self.world_size))

    def _lost(self, node: int, step: int) -> None:
        self._lost_since[node] = self._last_commit
        host = self.hosts.get(node, "?")
        self._record(Fault("lost", step, node, host, self._ranks_of(node)))
        taken = "its share is not trained (replica_batch=shrink)" if self.shrink else "the others take its share"
        self.say(f"node {node} ({host}) lost at step {step}: {taken}")

    def _joined(self, node: int, step: int) -> None:
        host = self.hosts.get(node, "?")
        self._record(Fault("joined", step, node, host, self._ranks_of(node)))
        self.say(f"node {node} ({host}) joined at step {step}: its share is its own again")

    def _record(self, fault: Fault | None = None) -> None:
        """``fault`` kept, and the state's list (what summary.json says) brought up to date."""
        self.faults += [fault] if fault else []
        self.state.faults = [asdict(fault) for fault in self.faults]

    def say(self, line: str) -> None:
        """One line on this node's console (its first rank's)."""
        if self.rank == 0:
            print(f"trainrun: {line}", file=sys.stderr, flush=True)

    def shares(self) -> list[int]:
        """The nodes whose share of the step this node trains (:func:`dealt`)."""
        return [self.replica] if self.shrink else dealt(self.replica, self.live, self.replicas)

    def missing_batches(self, state: State) -> list[tuple[int, Any]]:
        """The batches of the missing nodes' shares this rank trains in the step, each with its data
        rank: read from this rank's counterpart's loader on that node, at the step's place."""
        missing = self.shares()[1:]
        for node in set(self._loaders) - set(missing):  # back: its share is its own again
            del self._loaders[node]
        batches = []
        for node in missing:
            loader = self._loaders.get(node)
            if loader is None or loader.epoch != state.epoch:
                loader = self._loaders[node] = ShareLoader(state.data.for_replica(node), state.epoch)
            batches.append((node * self.world_size + self.rank, loader.batch_at(state.batch_in_epoch)))
        return batches

    def summed(self, terms: torch.Tensor) -> torch.Tensor:
        """``terms`` summed over the replica groups."""
        self.manager.allreduce(terms, reduce_op=torch.distributed.ReduceOp.SUM).wait()
        self._counted_terms = True
        return terms

    def exchanged(self, parameters: list[torch.nn.Parameter]) -> bool:
        """The step's gradients exchanged between the nodes; whether the step commits."""
        self.exchange(parameters)
        return self.commit()

    def hold_share(self, parameters: list[torch.nn.Parameter]) -> None:
        """A share's gradients (its ranks' average), put aside after its passes; the next share's
        start from none. This node's shares are summed in node order, as the nodes' exchange sums
        them: for two nodes the sum is the same to the bit whichever node trained a share."""
        self._held.append(_flat_gradients(parameters))
        for parameter in parameters:
            parameter.grad = None

    def exchange(self, parameters: list[torch.nn.Parameter]) -> None:
        """Sum the nodes' gradients (each its ranks' average) and divide by the planned nodes: the
        mean over every share of the step. A parameter without a gradient on this node takes part
        as zeros (another node's may have one)."""
        if not parameters:
            return
        if self._held:  # several shares: summed in node order
            ordered = sorted(zip(self.shares(), self._held, strict=True), key=lambda pair: pair[0])
            flat, self._held = functools.reduce(torch.add, [held for _, held in ordered]), []
        else:
            flat = _flat_gradients(parameters)
        self.manager.allreduce(flat, reduce_op=torch.distributed.ReduceOp.SUM).wait()
        # the mean over the samples trained: under shrink those of the live nodes, unless each loss was
        # weighed by its share of the step's counted terms (the trainer's _loss_share, for the planned nodes)
        counted, self._counted_terms = self._counted_terms, False
        flat /= len(self.live) if self.shrink and self.live and not counted else self.replicas
        for parameter in parameters:
            if parameter.grad is None:
                parameter.grad = torch.zeros_like(parameter)
        grads = [_local(parameter.grad) for parameter in parameters]
        torch._foreach_copy_(grads, torch._utils._unflatten_dense_tensors(flat, grads))

    def commit(self) -> bool:
        """Whether every node's step went through (else it is redone); the seconds a loss cost are
        counted at the first step committed after it."""
        committed = self.manager.should_commit()
        if committed and self._lost_since:
            now = time.monotonic()
            for node, since in self._lost_since.items():
                for fault in reversed(self.faults):
                    if fault.event == "lost" and fault.node == node and fault.seconds is None:
                        fault.seconds = round(now - since, 3)
                        self.say(f"node {node} lost: training went on {fault.seconds:.1f} s after its last step")
                        break
            self._record()
            self._lost_since.clear()
        if committed:
            self._last_commit = time.monotonic()
        return committed

    def ended(self) -> None:
        """One line a node at the end: the step and a fingerprint of the weights its first rank holds
        (whole, or its shard: the same on every node), for a person or a script to compare."""
        digest = hashlib.sha256()
        for value in self.state.raw_model.state_dict().values():
            digest.update(_local(value).detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
        self.say(f"node {self.replica} ended at step {self.state.batch}: weights {digest.hexdigest()[:16]}")

    def shutdown(self) -> None:
        self.manager.shutdown(wait=False)


def dealt(node: int, live: list[int] | None, planned: int) -> list[int]:
    """The nodes whose share of a step ``node`` trains: its own first, then the missing nodes' shares
    dealt out over the ``live`` nodes in turn (its own alone where who is live is not known)."""
    if live is None or node not in live:
        return [node]
    missing = [other for other in range(planned) if other not in live]
    return [node, *missing[live.index(node) :: len(live)]]


class ShareLoader:
    """A missing node's share of each step of one epoch, as its counterpart rank would have read it;
    the batch of the step last asked for is kept (a step redone reads it again)."""

    def __init__(self, data: Any, epoch: int) -> None:
        self.data, self.epoch = data, epoch
        self.batches: Any = None
        self.place, self.batch = -1, None

    def batch_at(self, place: int) -> Any:
        """The batch of step ``place`` of the epoch."""
        if place != self.place:
            if self.batches is None or place != self.place + 1:
                self.batches = self.data.train_batches(self.epoch, skip=place)
            self.place, self.batch = place, next(self.batches)
        return self.batch


def load_local_optimizer_state(optimizer: torch.optim.Optimizer, saved: dict[str, Any]) -> None:
    """``saved`` (an optimizer's state dict of local tensors, :func:`_local`) into ``optimizer``;
    under FSDP2 each state tensor shaped as its parameter's shard becomes that shard again."""
    optimizer.load_state_dict(saved)
    for group in optimizer.param_groups:
        for parameter in group["params"]:
            if not hasattr(parameter, "to_local"):
                continue
            held = optimizer.state.get(parameter, {})
            for key, value in held.items():
                if torch.is_tensor(value) and value.dim() and value.shape == parameter.to_local().shape:
                    held[key] = DTensor.from_local(
                        value,
                        parameter.device_mesh,
                        parameter.placements,
                        shape=parameter.shape,
                        stride=parameter.stride(),
                    )


def _flat_gradients(parameters: list[torch.nn.Parameter]) -> torch.Tensor:
    """This rank's part of each parameter's gradient (zeros where it has none), as one tensor."""
    return torch._utils._flatten_dense_tensors(
        [_local(p.grad) if p.grad is not None else torch.zeros_like(_local(p)) for p in parameters]
    )


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of ``tensor`` (its shard under FSDP2)."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _process_group(device: torch.device, timeout: timedelta) -> ProcessGroupGloo | ProcessGroupNCCL:
    """torchft's reconfigurable group between the nodes: NCCL for a GPU's tensors, gloo on the CPU."""
    return ProcessGroupNCCL(timeout=timeout) if device.type == "cuda" else ProcessGroupGloo(timeout=timeout)


class RoutedTransport(HTTPTransport):
    """torchft's HTTP transport of a state to a node that joins, served at this node's address as the
    others reach it (torchft's own names the host name, which may resolve to a loopback address)."""

    def __init__(self, node_address: str, **settings: Any) -> None:
        self.node_address = node_address
        super().__init__(**settings)
        self._server.RequestHandlerClass.log_message = lambda *_: None  # a line a request, on the console

    def address(self) -> str:
        port = self._server.socket.getsockname()[1]
        return f"http://{self.node_address}:{port}/checkpoint/"
