"""The heartbeat between nodes, in this process: two nodes' beating and watching threads over a
real TCPStore on 127.0.0.1, beats a tenth as long as a run's. A node that stops beating is named
lost; a node whose run ended and said so is not; a node that loses the store ends naming it.
(tests/test_multinode.py runs the same between two hosts, a link cut and a node killed.)"""

from __future__ import annotations

import gc
import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from trainrun.core import heartbeat
from trainrun.core.heartbeat import NodeHeartbeat, NodePlace

TIMEOUT = 1.0  # seconds a node may go unheard


class Verdicts:
    """What each node's heartbeat decided: (line, whether this node still reached the store)."""

    def __init__(self) -> None:
        self.lines: dict[int, tuple[str, bool]] = {}
        self.said = threading.Event()

    def of(self, node: int):  # noqa: ANN201
        def lost(line: str, reached: bool) -> None:
            self.lines[node] = (line, reached)
            self.said.set()

        return lost


@pytest.fixture
def store():
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=5), wait_for_workers=False)
    yield server


def two_nodes(store: dist.Store, monkeypatch, verdicts: Verdicts) -> list[NodeHeartbeat]:
    monkeypatch.setattr(heartbeat, "BEAT_SECONDS", 0.1)
    clients = [dist.TCPStore("127.0.0.1", store.port, is_master=False, timeout=timedelta(seconds=2)) for _ in range(2)]
    store.set(f"{heartbeat.PREFIX}/host/1", "host-b, 10.0.0.2, ranks 2-3")
    beats = [
        NodeHeartbeat(client, NodePlace(node, 2, 2 * node, 2), TIMEOUT, verdicts.of(node))
        for node, client in enumerate(clients)
    ]
    for beat in beats:
        for thread in beat.threads:
            thread.start()
    return beats


def test_a_node_that_stops_beating_is_named_lost_by_the_other(store, monkeypatch):
    verdicts = Verdicts()
    alive, silent = two_nodes(store, monkeypatch, verdicts)
    time.sleep(0.5)
    silent.stopped.set()  # its threads end without saying its run ended: a hung host
    assert verdicts.said.wait(10)
    line, reached = verdicts.lines[0]
    assert line.startswith("lost node 1 (host-b, 10.0.0.2, ranks 2-3): no heartbeat for") and reached
    assert 1 not in verdicts.lines
    alive.stop()


def test_a_node_whose_run_ended_is_not_taken_for_lost(store, monkeypatch):
    verdicts = Verdicts()
    working, finished = two_nodes(store, monkeypatch, verdicts)
    time.sleep(0.5)
    finished.stop()  # says so before it stops beating
    assert not verdicts.said.wait(4 * TIMEOUT)  # node 0 goes on (rank 0 exporting, say)
    working.stop()


def test_a_node_that_loses_the_store_ends_naming_it(store, monkeypatch):
    """Node 1 reaches the run's store through a server that then goes away: its requests fail, and
    once they have failed for the timeout it ends, naming node 0's address."""
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    monkeypatch.setattr(heartbeat, "BEAT_SECONDS", 0.1)
    verdicts = Verdicts()
    gone = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=5), wait_for_workers=False)
    client = dist.TCPStore("127.0.0.1", gone.port, is_master=False, timeout=timedelta(seconds=1))
    cut_off = NodeHeartbeat(client, NodePlace(1, 2, 2, 2), TIMEOUT, verdicts.of(1))
    for thread in cut_off.threads:
        thread.start()
    time.sleep(0.3)
    del gone
    gc.collect()
    assert verdicts.said.wait(15)
    line, reached = verdicts.lines[1]
    assert line.startswith("lost the run's store on node 0 (10.0.0.1): no answer for") and not reached


def test_a_node_whose_run_crashed_is_named_lost(store, monkeypatch):
    """A node whose run ended in an error stops beating without saying it is done: its peer names it."""
    verdicts = Verdicts()
    alive, crashed = two_nodes(store, monkeypatch, verdicts)
    time.sleep(0.5)
    crashed.stop(ended=False)
    assert verdicts.said.wait(10)
    assert verdicts.lines[0][0].startswith("lost node 1 (host-b, 10.0.0.2, ranks 2-3)")
    alive.stop()


class CountingStore:
    """A store's counters in memory, each request counted by its kind."""

    def __init__(self) -> None:
        self.values: dict[str, int] = {}
        self.requests: list[str] = []

    def add(self, key: str, amount: int) -> int:
        self.requests.append("add")
        self.values[key] = self.values.get(key, 0) + amount
        return self.values[key]

    def multi_get(self, keys: list[str]) -> list[bytes]:
        self.requests.append("multi_get")
        return [str(self.values[key]).encode() for key in keys]


def test_a_beat_reads_every_nodes_counter_in_one_request(monkeypatch):
    """64 nodes: a beat is two requests to the store (its own counter, every counter), not 65."""
    monkeypatch.setattr(heartbeat, "BEAT_SECONDS", 0.05)
    counting = CountingStore()
    beat = NodeHeartbeat(counting, NodePlace(3, 64, 24, 8), 60.0, lambda line, reached: None)
    beat.threads[0].start()
    time.sleep(0.5)
    beat.stopped.set()
    beat.threads[0].join()
    beats = counting.requests[64:]  # after the one-time creation of the 64 counters
    assert counting.requests[:64] == ["add"] * 64 and len(beats) >= 4
    assert beats[: len(beats) // 2 * 2] == ["add", "multi_get"] * (len(beats) // 2)


class SlowToSay(threading.Event):
    """An event whose state takes a while to read: every thread reaching a verdict at once reads it unset
    before any sets it, unless the verdict is taken under a lock."""

    def is_set(self) -> bool:
        state = super().is_set()
        time.sleep(0.02)  # the other threads read it meanwhile
        return state


def test_the_verdict_is_given_once_when_both_threads_reach_it():
    said: list[str] = []
    beat = NodeHeartbeat(CountingStore(), NodePlace(0, 2, 0, 1), 1.0, lambda line, reached: said.append(line))
    beat.stopped = SlowToSay()
    barrier = threading.Barrier(8)

    def judge(index: int) -> None:
        barrier.wait()
        beat._lost(f"verdict {index}", True)

    threads = [threading.Thread(target=judge, args=(index,)) for index in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(said) == 1


NCCL_ABORTED = (
    "[Rank 0] NCCL communicator was aborted on rank 0. Original reason for failure was: [Rank 0] Watchdog "
    "caught collective operation timeout: WorkNCCL(SeqNum=12, OpType=ALLREDUCE) ran for 600000 milliseconds"
)


@pytest.mark.parametrize(
    ("error", "waits"),
    [
        (dist.DistBackendError(NCCL_ABORTED), True),  # NCCL's watchdog, TORCH_NCCL_ASYNC_ERROR_HANDLING=2
        (RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer"), True),
        (ValueError("loss is nan"), False),  # the rank's own failure goes up at once
    ],
)
def test_a_collective_that_fails_as_nccl_fails_waits_for_the_heartbeats_verdict(tmp_path, monkeypatch, error, waits):
    """Under NCCL with the launcher's TORCH_NCCL_ASYNC_ERROR_HANDLING=2, the watchdog aborts the
    communicator and the training thread's collective raises (torch's default would end the process
    before the heartbeat names the lost node). On a run across nodes that exception waits the
    heartbeat's verdict, as gloo's reset connection does; the rank's own error does not."""
    from trainrun.config import check
    from trainrun.core.trainer import Trainer
    from trainrun.run import train

    waited = []

    def collective_fails(self, offset=None):  # noqa: ANN001, ANN202
        raise error

    monkeypatch.setenv("GROUP_WORLD_SIZE", "2")
    monkeypatch.setattr(heartbeat, "start", lambda timeout, on_lost: None)
    monkeypatch.setattr(heartbeat, "await_verdict", waited.append)
    monkeypatch.setattr(Trainer, "fit", collective_fails)
    config = check(["data=digits", "model.resnet_small.width=8", "progress=false", "launcher.node_timeout=7"])[0]
    with pytest.raises(type(error)):
        train(config, tmp_path, "")
    assert waited == ([7] if waits else [])
