"""What a lost node costs: a 400-step run of two nodes of two ranks with node 1 killed at steps 100, 200
and 300, under ``launcher.fault_tolerance=replicas`` (node 1 given the same command again at once; it
joins live) against the same run without it (node 0 ends on the loss; both nodes start again at once
with ``resume=auto``, as Slurm's requeue would, less its scheduling delay), each beside its own
uninterrupted run. Hosts are network namespaces of this machine (``tests/network_hosts.py``: root);
the lighthouse on a third.

    .venv/bin/python bench/fault_cost.py [--steps 400] [--every 100] [--checkpoint 30]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from network_hosts import Hosts, made_hosts  # noqa: E402

MODEL = ["data=digits", "model.resnet_small.width=16", "model.resnet_small.norm=group", "train_batch_size=64"]
MODEL += ["progress=false", "eval_batch_size=64", "launcher.devices=2", "launcher.nnodes=2"]
PORT = 29540


def reached(run: Path, step: int) -> bool:
    """Whether the run's metrics have a row at or past ``step``."""
    rows = run / "metrics.jsonl"
    if not rows.exists():
        return False
    lines = [json.loads(line) for line in rows.read_text().splitlines() if line.strip()]
    return any(row["batch"] >= step for row in lines)


def one_run(hosts: Hosts, folder: Path, tolerant: bool, kills: list[int], args: list[str]) -> dict:
    """Wall seconds to the run's end, node 1 killed at each of ``kills``; the faults it records."""
    run = folder / "run"
    if tolerant:
        common = [*args, "launcher.fault_tolerance=replicas", f"launcher.lighthouse={hosts.address(2)}:{PORT}"]
    else:
        common = [*args, f"launcher.master_addr={hosts.address(0)}", f"launcher.master_port={PORT + 5}"]
    common += [f"hydra.run.dir={run}"]

    def start(node: int, *extra: str) -> subprocess.Popen:
        where = [f"launcher.node_rank={node}", f"data.cache_dir={folder}/h{node}", *extra]
        return hosts.start(node, *common, *where)

    lighthouse = hosts.start(2, "lighthouse", "--port", str(PORT)) if tolerant else None
    started = time.monotonic()
    nodes = [start(0), start(1)]
    try:
        for step in kills:
            while not reached(run, step):
                time.sleep(0.05)
            os.killpg(nodes[1].pid, signal.SIGKILL)
            nodes[1].wait()
            if tolerant:
                nodes[1] = start(1)
            else:  # node 0 ends on the loss; the job is requeued: both start again from the newest checkpoint
                nodes[0].wait(timeout=300)
                nodes = [start(0, "resume=auto"), start(1, "resume=auto")]
        codes = [node.wait(timeout=900) for node in nodes]
        wall = time.monotonic() - started
    finally:
        for process in [*nodes, *([lighthouse] if lighthouse else [])]:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
    summary = json.loads((run / "summary.json").read_text())
    return {"wall": wall, "codes": codes, "faults": summary.get("faults", []), "batches": summary["batches"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--checkpoint", type=int, default=30, help="checkpoint interval in steps (both runs)")
    options = parser.parse_args()
    args = [*MODEL, f"max_duration={options.steps}ba", f"eval_interval={options.every // 5}ba"]
    args += [f"checkpoint.interval={options.checkpoint}ba", "checkpoint.keep=2"]
    kills = list(range(options.every, options.steps, options.every))
    rows = []
    with made_hosts(3) as hosts, tempfile.TemporaryDirectory() as scratch:
        for tolerant in (True, False):
            label = "replicas" if tolerant else "none (requeued, resume=auto)"
            whole = one_run(hosts, Path(scratch) / f"whole{tolerant}", tolerant, [], args)
            broken = one_run(hosts, Path(scratch) / f"broken{tolerant}", tolerant, kills, args)
            lost = broken["wall"] - whole["wall"]
            rows.append((label, whole["wall"], broken["wall"], lost, lost / len(kills), broken))
    print(f"| launcher.fault_tolerance | uninterrupted s | {len(kills)} losses s | lost s | a loss s |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for label, whole, broken, lost, each, _ in rows:
        print(f"| {label} | {whole:.1f} | {broken:.1f} | {lost:.1f} | {each:.1f} |")
    for label, *_, broken in rows:
        print(label, "exit codes", broken["codes"], "faults", json.dumps(broken["faults"]))


if __name__ == "__main__":
    main()
