"""The node a run is priced, sized and timed on (``hardware=``, conf/hardware/*.yaml): its devices'
datasheet, its CPUs, links and price. Torch-free: the schema reads it (``hardware`` in
:class:`~trainrun.schema.TrainConfig`), as trainrun report and trainrun estimate do."""

from __future__ import annotations

from dataclasses import dataclass, field

from trainrun.fields import positive_field


@dataclass
class HardwareConfig:
    """One node, for cost-to-accuracy reports and what ``trainrun estimate`` sizes and times a run
    against (conf/hardware/*.yaml; null: not said)."""

    name: str = "unpriced"
    price_per_hour: float | None = field(default=None, metadata={"min": 0})  # one node, in dollars
    description: str = ""
    device_memory_gb: float | None = field(default=None, metadata={"exclusive_min": 0})  # GB a device (vendor's)
    peak_tflops: float | None = field(default=None, metadata={"exclusive_min": 0})  # a device's dense bf16 peak
    peak_fp32_tflops: float | None = field(default=None, metadata={"exclusive_min": 0})  # float32, no TF32
    peak_fp8_tflops: float | None = field(default=None, metadata={"exclusive_min": 0})  # its dense float8 peak
    # a GeForce part's dense fp16 with FP16 accumulate: its tensor cores' full rate, twice peak_tflops
    peak_fp16_accumulate_tflops: float | None = field(default=None, metadata={"exclusive_min": 0})
    memory_gb_s: float | None = field(default=None, metadata={"exclusive_min": 0})  # GB/s of a device's memory
    gpu: str | None = None  # the device's name (h100, a100, ...); trainrun/estimate/readings.yaml's where measured
    architecture: str | None = None  # its generation (ampere, hopper, blackwell, ...): whose shares time it
    sm_count: int | None = positive_field(None)  # its streaming multiprocessors (compute units), as its datasheet says
    cpu_cores: int | None = positive_field(None)  # the node's physical cores, which its loaders share
    cpu_threads: int | None = positive_field(None)  # its hardware threads (null: one a core)
    cpu_speed: float | None = field(default=None, metadata={"exclusive_min": 0})  # a thread's, against readings.yaml's
    devices: int | None = positive_field(None)  # GPUs a node: trainrun estimate's ranks a node at launcher.devices=auto
    link_gb_s: float | None = field(default=None, metadata={"exclusive_min": 0})  # GB/s a GPU sends the node's others
    network_gbit_s: float | None = field(default=None, metadata={"exclusive_min": 0})  # Gbit/s a node sends the others
