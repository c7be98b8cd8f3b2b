"""A lost node ends a multi-node run on every node within ``launcher.node_timeout`` seconds.

A node whose processes die resets its peers' connections: their collectives fail at once, and they
wait for the heartbeat's verdict (:func:`await_verdict`) to name it; a node cut off (a link down, a
partition, a hung kernel) resets nothing, and every collective would wait its
whole timeout (an hour here, torch's 10-30 minutes by default) while the other nodes' GPUs idle.
So the first rank of each node beats a counter in the run's rendezvous store every
:data:`BEAT_SECONDS`, from a thread of its own, whatever the training thread does (a first
compile, a checkpoint write, a long collective), and reads every node's counter in one request. A node whose
counter has not moved for ``node_timeout`` seconds is lost: the rank names its host and ranks and
ends (the launcher then stops the node's other ranks and exits 1). A node that cannot reach the
store for as long is itself the one cut off, and ends naming the store's host. Under Slurm a
survivor requeues the job (``launcher.requeue``), as for preemption: ``resume=auto`` continues it on
the nodes Slurm gives it next. Counters, not clocks: the nodes' clocks need not agree. A node whose
run ends says so before it stops beating, so that a node still at work (rank 0 exporting the
model) does not take it for lost; a node whose run crashed does not, so that its peers name it.
Written here because torch's elastic agent checks its peers only between rendezvous rounds, not
while the workers train.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

from trainrun.core import preemption
from trainrun.core.distributed import nodes_from_environment, record_failure

BEAT_SECONDS = 2.0
STORE_TIMEOUT = timedelta(seconds=5)  # one store request, on a link that may be down
PREFIX = "trainrun/heartbeat"
REQUEUE_SECONDS = 10  # a lost node's survivor's scontrol requeue: the job still ends within a minute
NODE_ADDRESS = "TRAINRUN_NODE_ADDRESS"  # this node's address on the route to the master, as the launcher found it


@dataclass(frozen=True)
class NodePlace:
    """This rank's node among the run's nodes, from the launcher's variables (trainrun's, torchrun's, Slurm's)."""

    node: int
    nodes: int
    first_rank: int
    ranks: int  # on this node

    @classmethod
    def from_environment(cls) -> NodePlace | None:
        """This rank's place where it is its node's first of a run across nodes; None otherwise."""
        env = os.environ
        nodes = nodes_from_environment()
        if nodes < 2 or env.get("LOCAL_RANK", "0") != "0":
            return None
        world = int(env.get("WORLD_SIZE", "1"))
        ranks = int(env.get("LOCAL_WORLD_SIZE") or world // nodes)
        return cls(int(env.get("GROUP_RANK") or "0"), nodes, int(env["RANK"]), ranks)


class NodeHeartbeat:
    """One node's first rank's two threads (:func:`start`): one beats and reads the counters through
    the store, the other watches that the store still answers (a request on a link that is down may
    block far longer than the store's timeout, until TCP gives up)."""

    def __init__(
        self, store: dist.Store, place: NodePlace, timeout: float, on_lost: Callable[[str, bool], None]
    ) -> None:
        self.store, self.place, self.timeout, self.on_lost = store, place, timeout, on_lost
        self.stopped = threading.Event()
        self.verdict = threading.Lock()  # one verdict, from whichever thread reaches it first
        self.answered = time.monotonic()  # when the store last answered
        self.threads = [
            threading.Thread(target=target, name=f"trainrun-heartbeat-{name}", daemon=True)
            for name, target in (("beat", self._beat), ("watch", self._watch))
        ]

    def _key(self, node: int) -> str:
        return f"{PREFIX}/beat/{node}"

    def _beat(self) -> None:
        nodes, keys = range(self.place.nodes), [self._key(node) for node in range(self.place.nodes)]
        now = time.monotonic()
        seen = {node: (-1, now) for node in nodes}  # each node's counter, and when it last moved
        try:
            for key in keys:  # every counter there before any is read (a read of a missing key waits)
                self.store.add(key, 0)
        except Exception:  # noqa: BLE001 (the store is not reached: the watching thread ends the rank)
            return
        while not self.stopped.wait(BEAT_SECONDS):
            try:
                self.store.add(self._key(self.place.node), 1)
                read = self.store.multi_get(keys)  # every counter in one request
            except Exception:  # noqa: BLE001 (any store failure: a timeout, a reset, a closed socket)
                continue  # the watching thread ends the rank once it has lasted
            counts = dict(zip(nodes, (int(value) for value in read), strict=True))
            now = self.answered = time.monotonic()
            seen = {node: (count, now if count != seen[node][0] else seen[node][1]) for node, count in counts.items()}
            stale = [node for node, (_, moved) in seen.items() if now - moved > self.timeout]
            stale = [node for node in stale if not self._finished(node)]
            if stale:
                named = "; ".join(self._described(node) for node in stale)
                self._lost(f"lost {named}: no heartbeat for {now - min(seen[n][1] for n in stale):.0f} s", True)

    def _watch(self) -> None:
        while not self.stopped.wait(BEAT_SECONDS):
            silent = time.monotonic() - self.answered
            if silent > self.timeout:
                host = os.environ.get("MASTER_ADDR", "?")
                self._lost(f"lost the run's store on node 0 ({host}): no answer for {silent:.0f} s", False)

    def _finished(self, node: int) -> bool:
        """Whether ``node`` stopped beating because its run ended (:meth:`stop`), not because it is lost."""
        try:
            return self.store.add(f"{PREFIX}/done/{node}", 0) > 0
        except Exception:  # noqa: BLE001
            return False

    def _described(self, node: int) -> str:
        try:
            return f"node {node} ({self.store.get(f'{PREFIX}/host/{node}').decode()})"
        except Exception:  # noqa: BLE001
            return f"node {node}"

    def _lost(self, line: str, reached: bool) -> None:
        """``reached``: this node still reaches the store (another node is lost), so it can requeue."""
        with self.verdict:
            if self.stopped.is_set():
                return
            self.stopped.set()
        self.on_lost(line, reached)

    def stop(self, ended: bool = True) -> None:
        """This node stops beating. Where its run ``ended`` (not a crash), it says so, so that a node
        still at work (rank 0 exporting the model, say) does not take it for lost; the saying is
        bounded by the store's timeout (a node that has itself lost the store ends anyway). A node
        whose run crashed says nothing: its peers name it lost."""
        with self.verdict:
            if self.stopped.is_set():
                return
            self.stopped.set()
        if not ended:
            return
        done = threading.Thread(target=self._say_done, name="trainrun-heartbeat-done", daemon=True)
        done.start()
        done.join(STORE_TIMEOUT.total_seconds())

    def _say_done(self) -> None:
        try:
            self.store.add(f"{PREFIX}/done/{self.place.node}", 1)
        except Exception:  # noqa: BLE001 (the store is gone: nobody is left to mistake this node for lost)
            return


def start(timeout: float, on_lost: Callable[[str, bool], None]) -> NodeHeartbeat | None:
    """The heartbeat of this node, where this rank is its node's first of a run across nodes; None
    otherwise. ``on_lost`` is called, from the heartbeat's thread, with one line naming the lost node
    and whether this node still reaches the others (a survivor, not the node cut off)."""
    place = NodePlace.from_environment()
    if place is None:
        return None
    env = os.environ
    store = dist.TCPStore(
        env["MASTER_ADDR"], int(env["MASTER_PORT"]), is_master=False, timeout=STORE_TIMEOUT, wait_for_workers=False
    )
    last = place.first_rank + place.ranks - 1
    ranks = f"rank {last}" if place.ranks == 1 else f"ranks {place.first_rank}-{last}"
    address = env.get(NODE_ADDRESS, "address not said")
    store.set(f"{PREFIX}/host/{place.node}", f"{socket.gethostname()}, {address}, {ranks}")
    heartbeat = NodeHeartbeat(store, place, timeout, on_lost)
    for thread in heartbeat.threads:
        thread.start()
    return heartbeat


def await_verdict(timeout: float) -> None:
    """A collective failed because a peer went away: on a run across nodes, wait as long as the
    heartbeat (``timeout``: ``launcher.node_timeout``) needs to say whether a node was lost, which
    ends this process from its thread (and under Slurm requeues the job: a node killed outright
    resets its peers' connections before it misses a beat). A node's other ranks outwait its first,
    so that its line is the one the launcher reports. Where no node was lost (a rank that crashed),
    the failure then goes up as it is."""
    if nodes_from_environment() < 2:
        return
    first = os.environ.get("LOCAL_RANK", "0") == "0"
    time.sleep(timeout + (3 if first else 4) * BEAT_SECONDS)


def end_this_rank(line: str, survivor: bool, requeue: bool) -> None:
    """A lost node: this rank ends at once, from the heartbeat's thread (the training thread may wait
    in a collective that never finishes), its line handed to the launcher, which stops the node's
    other ranks. Under Slurm a ``survivor`` (one that still reaches the others) requeues the job
    where ``requeue`` (``launcher.requeue``) allows."""
    requeued = preemption.requeue_slurm_job(wait=False, timeout=REQUEUE_SECONDS) if survivor and requeue else None
    record_failure(f"rank {os.environ.get('RANK', '0')}: {line}" + (f"; {requeued}" if requeued else ""))
    sys.stderr.flush()
    os._exit(1)
