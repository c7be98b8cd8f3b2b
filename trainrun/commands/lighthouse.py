"""``trainrun lighthouse --port P``: the lighthouse of fault-tolerant runs on a host of its own.

Runs name it with ``launcher.fault_tolerance=replicas launcher.lighthouse=HOST:P``; it decides, step
by step, which of their nodes take part (torchft's lighthouse), so that losing any node, node 0 too,
costs seconds. It serves until it is stopped (Ctrl-C, SIGTERM).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading


def lighthouse_command(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="trainrun lighthouse", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True, help="its port on every address of this host (and port+1)")
    args = parser.parse_args(argv)
    from trainrun.replica_groups import start_lighthouse, start_store

    server, store = start_lighthouse(args.port, "--port"), start_store(args.port)
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    print(f"trainrun: lighthouse at port {args.port}: runs name it launcher.lighthouse=HOST:{args.port}", flush=True)
    try:
        stopped.wait()
    except KeyboardInterrupt:
        pass
    server.shutdown()
    del store
    print("trainrun: lighthouse stopped", file=sys.stderr)
    return 0
