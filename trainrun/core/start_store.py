"""Where a fresh fault-tolerant run's nodes meet before their first step: a store beside the lighthouse
(its port + 1). Each node's first rank comes once its torchft Manager is heard by the lighthouse, so
that the first quorum holds every node; a node started again finds the run under way and joins it live.
"""

from __future__ import annotations

import time
from datetime import timedelta

from torch.distributed import TCPStore

from trainrun.errors import NodeUnreachable

ARRIVED, UNDER_WAY = "nodes_arrived", "under_way"
START_STORE = "TRAINRUN_START_STORE"  # host:port, as the launcher tells the ranks


def connected(where: str, timeout: float) -> TCPStore:
    """The start store at ``where`` (host:port), waited for up to ``timeout`` seconds."""
    host, _, port = where.rpartition(":")
    try:
        return TCPStore(host.strip("[]"), int(port), is_master=False, timeout=timedelta(seconds=timeout))
    except Exception:
        raise NodeUnreachable(f"no lighthouse's start store at {where} within {timeout:.0f} s: is it up?") from None


def under_way(where: str, timeout: float) -> bool:
    """Whether the run's nodes met already (a node that starts now joins it live)."""
    return connected(where, timeout).check([UNDER_WAY])


def wait_for_every_node(where: str, nodes: int, timeout: float) -> bool:
    """Wait until every planned node came to the store at ``where``, unless the run is under way
    already (a node started again joins it live); False if it is."""
    store = connected(where, timeout)
    if store.check([UNDER_WAY]):
        return False
    came, deadline = store.add(ARRIVED, 1), time.monotonic() + timeout
    while came < nodes:
        if time.monotonic() > deadline:
            raise NodeUnreachable(
                f"{came} of {nodes} nodes came to {where} within launcher.rendezvous_timeout={timeout:.0f} s"
            )
        time.sleep(0.2)
        came = store.add(ARRIVED, 0)
    store.set(UNDER_WAY, "1")
    return True
