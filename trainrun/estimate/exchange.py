"""What a run's GPUs exchange in a step, as NCCL runs it, and what of it the compute does not hide.

- **DDP** all-reduces the float32 gradients once a step (micro-batches before the last wait, as the
  trainer's ``no_sync`` has them), in buckets of 25 MB that overlap the backward: everything but the
  last bucket hides behind the backward's compute.
- **FSDP2** gathers each unit's weights in the compute dtype (bf16 under mixed precision, float32
  otherwise) before its forward and, where ``parallel.reshard_after_forward`` frees them, again
  before its backward, and reduce-scatters its float32 gradients after its backward: every
  micro-batch, as FSDP2 does without ``no_sync``. It prefetches the next unit's gathers, so the
  exchange hides behind the step's compute but for the first unit's gather.
- **Across nodes** (DDP, or HSDP's replicas) each node's share of the gradients is all-reduced over
  the network, which the node's GPUs share.

A collective moves its bytes in a ring: an all-gather or a reduce-scatter of ``S`` bytes sends
``(p - 1) / p * S`` from each rank, an all-reduce twice that. The link is used at the share of its
nominal bandwidth NCCL's bus bandwidth reaches (:data:`BUS_EFFICIENCY`), and each collective costs
a latency (:data:`COLLECTIVE_LATENCY_S`) however small. Written here because the exchange is the
trainer's own schedule of collectives, which no library prices.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainrun.schema import TrainConfig

GB = 1e9
BUCKET_BYTES = 25 * 2**20  # DDP's default bucket_cap_mb
# nccl-tests' bus bandwidth against the link's nominal one way: about 360-370 GB/s of NVLink 4's 450 on
# an H100 node and 80-90 % of a 400 Gbit/s NIC across nodes (NVIDIA's published nccl-tests figures)
BUS_EFFICIENCY = 0.8
COLLECTIVE_LATENCY_S = 20e-6  # a ring collective's start-up within a node (nccl-tests' small messages)
BACKWARD_SHARE = 2 / 3  # of a step's compute: the backward, which DDP's bucketed all-reduce overlaps


@dataclass(frozen=True)
class Traffic:
    """What one GPU sends in a step: to the other GPUs of its node and to other nodes (bytes), the
    collectives it takes part in, the GPUs a node (who share its network), the share of the step's
    compute that hides it, and what no compute hides (the first gather, the last bucket)."""

    within_node: float
    across_nodes: float
    collectives: int
    per_node: int
    hidden_by: float
    unhidden: float = 0.0  # bytes sent within the node before any compute can hide them

    def seconds(self, config: TrainConfig) -> float:
        """At NCCL's share of the node's link bandwidth and of its network's share a GPU, with a
        latency a collective (0 where nothing is sent)."""
        hardware = config.hardware
        seconds = self.within_node / (hardware.link_gb_s * GB * BUS_EFFICIENCY) if self.within_node else 0.0
        if self.across_nodes:
            seconds += self.across_nodes / (hardware.network_gbit_s / 8 * GB * BUS_EFFICIENCY / self.per_node)
        return seconds + self.collectives * COLLECTIVE_LATENCY_S if seconds else 0.0

    def exposed(self, config: TrainConfig, compute: float) -> float:
        """What of the exchange ``compute`` seconds of the step's compute do not hide."""
        total = self.seconds(config)
        if not total:
            return 0.0
        first = self.unhidden / (config.hardware.link_gb_s * GB * BUS_EFFICIENCY) if self.unhidden else 0.0
        return min(total, first + max(0.0, total - first - self.hidden_by * compute))


NO_TRAFFIC = Traffic(0.0, 0.0, 0, 1, 0.0)  # one GPU's: nothing sent


def step_traffic(
    config: TrainConfig, held: dict[str, float], ranks: int, nodes: int, passes: int, units: int
) -> Traffic:
    """A step's exchange (module docstring) for one rank holding ``held`` (GB: its weights and
    gradients, its shards under FSDP2) over ``passes`` micro-batches, FSDP2 sharding ``units``
    units (its repeated blocks and the root)."""
    per_node = ranks // nodes
    sharded = config.parallel.name == "fsdp" and ranks > 1
    group = per_node if sharded and nodes > 1 else ranks if sharded else 1
    gradients = held.get("gradients", 0.0) * group * GB  # float32, the whole model's
    across = 2 * (nodes - 1) / nodes * gradients / per_node if nodes > 1 else 0.0
    across_collectives = (units if sharded else max(1, round(gradients / BUCKET_BYTES))) if nodes > 1 else 0
    if sharded:
        compute_share = 0.5 if config.precision in ("amp", "bf16", "fp8") else 1.0  # gathered in the compute dtype
        weights = held.get("weights", 0.0) * group * GB * compute_share
        gathers = 2 if config.parallel.reshard_after_forward else 1
        ring = (group - 1) / group
        within = passes * ring * (gathers * weights + gradients)
        collectives = passes * units * (gathers + 1) + across_collectives
        return Traffic(within, across, collectives, per_node, 1.0, unhidden=ring * weights / units)
    ring = 2 * (per_node - 1) / per_node
    buckets = max(1, round(gradients / BUCKET_BYTES))
    last = ring * min(gradients, BUCKET_BYTES)
    return Traffic(ring * gradients, across, buckets + across_collectives, per_node, BACKWARD_SHARE, unhidden=last)
