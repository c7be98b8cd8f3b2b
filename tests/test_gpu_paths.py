"""What only runs on GPUs and clusters, emulated on this CPU: process groups, device choice,
Slurm and multi-node launch, per-rank random state, compile, fp16 scaling without host syncs.
"""

import logging
import os
import shutil
import socket
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from conftest import run_cli, run_here
from torch import nn

from trainrun.algorithms import build_algorithms
from trainrun.algorithms.label_smoothing import smooth
from trainrun.algorithms.specs import SPECS
from trainrun.algorithms.specs.sam import SAMConfig
from trainrun.core import distributed
from trainrun.core.compiled import DYNAMO_LOGGER, RecompileLimitWatch, compile_model, watch_recompile_limit
from trainrun.core.distributed import Placement, backend_for, cuda_index, join, select_device
from trainrun.core.engine import Engine
from trainrun.core.events import Event
from trainrun.core.precision import Precision
from trainrun.core.state import State
from trainrun.core.time import Timeline
from trainrun.data.build import build_data
from trainrun.errors import ConfigError
from trainrun.launch import adopt_slurm_environment
from trainrun.optim.optimizers import build_optimizer
from trainrun.schema import DataConfig, LauncherConfig, OptimizerConfig
from trainrun.tasks.losses import binary_cross_entropy

ROOT = Path(__file__).resolve().parent.parent
TINY_RUN = ["data=digits", "model.resnet_small.width=8", "train_batch_size=64", "progress=false"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def served_by_gloo(backend: str) -> str:
    """The process group ``backend`` with gloo standing in for NCCL, on the device types NCCL serves.

    ``nccl`` becomes ``cuda:gloo``: a group whose CPU side has no backend, as NCCL-only groups are.
    """
    if ":" not in backend:
        return {"nccl": "cuda:gloo", "gloo": "gloo"}[backend]
    return ",".join(f"{pair.split(':')[0]}:gloo" for pair in backend.split(","))


@pytest.fixture
def recompile_watch():
    """Removes the recompile-limit watchers a test installs on torch's logger."""
    yield
    logger = logging.getLogger(DYNAMO_LOGGER)
    for handler in list(logger.handlers):
        if isinstance(handler, RecompileLimitWatch):
            logger.removeHandler(handler)
    torch.compiler.reset()


def _train_in_a_gpu_runs_group(rank: int, port: int, run_dir: str) -> None:
    """One rank of a tiny CPU run inside the process group a GPU run would make."""
    from trainrun.config import check
    from trainrun.run import train

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    gpu_backend = served_by_gloo(backend_for(torch.device("cuda")))
    distributed.backend_for = lambda device: gpu_backend
    config = check([*TINY_RUN, "max_duration=10ba", "eval_interval=5ba", "checkpoint.interval=5ba"])[0]
    train(config, Path(run_dir), "")
    # The run is over and its group destroyed; leave now: the stand-in group (gloo serving the CUDA
    # device type as well) now and then aborts in its C++ teardown at interpreter exit.
    os._exit(0)


@pytest.mark.slow
@pytest.mark.distributed
def test_a_gpu_runs_process_group_serves_every_collective_of_a_run(tmp_path):
    """Evaluation's reductions, the checkpoint's gather of random states and the barriers all pass
    through the group a GPU run gets; with an NCCL-only group (no CPU backend) they would fail."""
    assert served_by_gloo("nccl") == "cuda:gloo"  # the emulation of the group the run used to make
    mp.start_processes(_train_in_a_gpu_runs_group, args=(free_port(), str(tmp_path)), nprocs=2, start_method="spawn")
    assert (tmp_path / "checkpoints" / "ep0-ba10.pt").is_file()
    saved = torch.load(tmp_path / "checkpoints" / "ep0-ba10.pt", weights_only=True)
    assert saved["topology"] == {"world_size": 2, "global_batch": 64} and "rng" not in saved


def test_backend_follows_the_runs_device_not_the_machine(monkeypatch):
    assert backend_for(torch.device("cuda", 0)) == "cpu:gloo,cuda:nccl"
    assert backend_for(torch.device("cpu")) == "gloo"
    started = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a GPU machine
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **options: started.append((backend, options)))
    for key, value in {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}.items():
        monkeypatch.setenv(key, value)
    placement, device = join("cpu")  # device=cpu with several processes on a GPU machine
    assert device == torch.device("cpu") and placement == Placement(1, 2, 1)
    assert started == [("gloo", {"device_id": None, "timeout": timedelta(minutes=60)})]  # NCCL's own: 10 min


def test_each_rank_takes_the_gpu_it_sees_before_joining_the_group(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)  # Slurm --gpus-per-task=1
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: calls.append(("set_device", device)))
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **options: calls.append((backend, options)))
    for key, value in {"RANK": "11", "WORLD_SIZE": "16", "LOCAL_RANK": "3"}.items():
        monkeypatch.setenv(key, value)
    placement, device = join("auto")
    cuda0 = torch.device("cuda", 0)
    assert device == cuda0 and placement.local_rank == 3
    told = {"device_id": cuda0, "timeout": timedelta(minutes=60)}
    assert calls == [("set_device", cuda0), ("cpu:gloo,cuda:nccl", told)]  # device first, told
    assert torch.backends.cudnn.benchmark  # autotuned convolutions on CUDA

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)  # every GPU of the node visible
    assert cuda_index(3) == 3
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(ConfigError, match="local rank 3 has no GPU: this process sees 2 GPU"):
        cuda_index(3)


def test_deterministic_runs_use_deterministic_kernels_and_no_autotuning(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", True)
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    try:
        assert select_device("cuda", 0, deterministic=True) == torch.device("cuda", 0)
        assert torch.are_deterministic_algorithms_enabled() and torch.is_deterministic_algorithms_warn_only_enabled()
        assert not torch.backends.cudnn.benchmark  # autotuning picks algorithms by timing: not repeatable
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"  # cuBLAS's condition for repeatable sums
    finally:
        torch.use_deterministic_algorithms(False)


def test_torch_loader_pins_memory_when_training_on_cuda():
    config = DataConfig(name="digits")
    assert build_data(config, 64, 64, 0, device=torch.device("cuda", 0)).train.pin_memory
    assert not build_data(config, 64, 64, 0, device=torch.device("cpu")).train.pin_memory
    config.pin_memory = False  # a user's explicit choice wins
    assert not build_data(config, 64, 64, 0, device=torch.device("cuda", 0)).train.pin_memory


def test_slurm_batch_step_is_one_process_and_srun_steps_are_ranks(monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(key, "")  # recorded, so what adopt_slurm_environment sets is undone after
        monkeypatch.delenv(key)
    batch_script = {"SLURM_PROCID": "0", "SLURM_NTASKS": "16", "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "gpu[1-2]"}
    for key, value in batch_script.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("SLURM_STEP_NUM_TASKS", raising=False)
    assert not adopt_slurm_environment(LauncherConfig())  # sbatch's own step: launch workers here
    assert "WORLD_SIZE" not in os.environ
    step = {"SLURM_STEP_NUM_TASKS": "16", "SLURM_PROCID": "9", "SLURM_LOCALID": "1", "SLURM_STEP_NODELIST": "gpu[2-3]"}
    for key, value in step.items():
        monkeypatch.setenv(key, value)
    assert adopt_slurm_environment(LauncherConfig())
    assert [os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")] == ["9", "16", "1", "gpu2"]


def test_multi_node_launch_refuses_a_loopback_master_address(tmp_path):
    args = [*TINY_RUN, "launcher.nnodes=2", "launcher.master_port=29500", f"hydra.run.dir={tmp_path}"]
    result = run_cli(*args)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "trainrun: error: bad value for 'launcher.master_addr': '127.0.0.1' is this machine on every node; "
        "a multi-node launch needs the address of the node_rank 0 machine that every node can reach"
    ]
    assert not any(tmp_path.iterdir())
    assert run_cli(*args[:-1], "launcher.master_addr=localhost", f"hydra.run.dir={tmp_path}").returncode == 2


def _write_node_cache(rank: int, port: int, root: str) -> None:
    """Rank ``rank`` is local rank 0 of its own node, whose disk is ``root/node<rank>``; forked, so
    one thread (as torch's loader workers), away from the parent's OpenMP pool."""
    from trainrun.data.ffcv import cached_betons

    torch.set_num_threads(1)

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    config = DataConfig(
        name="synthetic", num_samples=32, val_samples=8, resolution=8, eval_resolution=8, loader="ffcv",
        cache_dir=f"{root}/node{rank}",
    )  # fmt: skip
    for path in cached_betons(config, Placement(rank=rank, world_size=2, local_rank=0)):
        assert path.is_file(), path
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.distributed
def test_each_node_writes_its_own_builtin_cache(tmp_path):
    pytest.importorskip("ffcv")  # the GPU machine has no FFCV
    mp.start_processes(_write_node_cache, args=(free_port(), str(tmp_path)), nprocs=2, start_method="fork")
    for node in ("node0", "node1"):
        assert len(list((tmp_path / node).glob("synthetic-*.beton"))) == 2


@pytest.mark.slow
@pytest.mark.distributed
def test_two_ranks_resume_with_their_own_random_streams(tmp_path):
    """Kill a 2-rank run with per-rank draws (mixing, stochastic depth) mid-epoch, resume: the
    uninterrupted run's weights, bit for bit; the draws are keyed to (seed, step, rank), not saved."""
    args = [*TINY_RUN, "max_duration=2ep", "algorithms=[mixup,stochastic_depth]", "model=resnet_small"]
    args += ["launcher.devices=2", "checkpoint.interval=30ba", "data.random_crop_padding=1"]
    uninterrupted, resumed = tmp_path / "whole", tmp_path / "resumed"
    assert run_here(*args, f"hydra.run.dir={uninterrupted}").returncode == 0
    (resumed / "checkpoints").mkdir(parents=True)  # as if killed after step 30 of 44
    shutil.copy(uninterrupted / "checkpoints" / "ep1-ba30.pt", resumed / "checkpoints")
    again = run_cli(*args, f"hydra.run.dir={resumed}", "resume=auto")
    assert again.returncode == 0 and "ep1-ba30.pt" in again.stdout, again.stderr
    a = torch.load(uninterrupted / "checkpoints" / "ep2-ba44.pt", weights_only=True)
    b = torch.load(resumed / "checkpoints" / "ep2-ba44.pt", weights_only=True)
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), key


def counting_backend(compiles: list):
    def backend(graph_module, example_inputs):
        compiles.append(1)
        return graph_module.forward

    return backend


def test_layer_freezing_recompiles_once_per_change_and_never_falls_back_to_eager(recompile_watch):
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(4, 4) for _ in range(12)])
    compiles, fallbacks = [], []
    watch_recompile_limit(fallbacks.append)
    state = State(
        torch.compile(model, backend=counting_backend(compiles)), None, Timeline(1, 2, 12), torch.device("cpu"),
        Precision("fp32", "cpu"),
    )  # fmt: skip
    (freezing,) = build_algorithms({"layer_freezing": SPECS["layer_freezing"].config(0.0, 1.0)})
    inputs = torch.randn(2, 4)
    for step in range(12):  # a new freeze level every step: more than dynamo's 8 recompiles
        state.batch = step
        freezing.apply(Event.EPOCH_END, state)
        state.model(inputs).sum().backward()
        assert all(p.grad is None for layer in model[:step] for p in layer.parameters())
        assert all(p.grad is not None for layer in model[step:] for p in layer.parameters())
        model.zero_grad(set_to_none=True)
    assert fallbacks == []
    assert len(compiles) == 12  # one compile per freeze level
    assert [n["text"] for n in state.notices][-1].startswith("layer_freezing: 11 layers frozen; torch.compile")


def test_a_fall_back_to_eager_is_a_run_warning(recompile_watch):
    state = State(nn.Identity(), None, Timeline(1, 2, 12), torch.device("cpu"), Precision("fp32", "cpu"))
    model = compile_model(nn.Linear(2, 2), state.warn)
    torch.compiler.reset()
    # torch's own patch: monkeypatch's undo left the setting missing for the process's later compiles
    # ("torch._dynamo.config.recompile_limit does not exist" in the next test that compiled)
    with torch._dynamo.config.patch(recompile_limit=1):
        for dtype in (torch.float32, torch.float64):  # a second compile is one past the limit
            model.to(dtype)(torch.ones(1, 2, dtype=dtype))
    (notice,) = state.notices
    assert notice["level"] == "warning" and notice["text"].startswith("torch.compile fell back to eager")


def test_bce_targets_stay_fp32_under_bf16_autocast():
    torch.manual_seed(0)
    logits = torch.randn(4, 10).bfloat16()
    targets = smooth(torch.tensor([1, 2, 3, 4]), 10, 0.08, torch.float32)
    assert targets[0, 1] == pytest.approx(0.928)  # 0.92 + 0.008: not representable in bf16
    expected = F.binary_cross_entropy_with_logits(logits.float(), targets, reduction="sum") / 4
    loss = binary_cross_entropy(logits, targets)
    assert loss.dtype == torch.float32 and torch.equal(loss, expected)


class HostReads:
    """Counts reads of tensor values back to the host (.item(), bool(), float())."""

    def __init__(self, monkeypatch) -> None:
        self.count = 0
        for name in ("item", "__bool__", "__float__", "tolist"):
            original = getattr(torch.Tensor, name)

            def counting(tensor, *args, _original=original, **kwargs):
                self.count += 1
                return _original(tensor, *args, **kwargs)

            monkeypatch.setattr(torch.Tensor, name, counting)


def scaled_step(model, optimizer, scaler, poison: bool = False) -> None:
    loss = model(torch.randn(8, 4)).square().mean()
    scaler.scale(loss).backward()
    if poison:
        model.weight.grad[0, 0] = float("inf")
    scaler.unscale_(optimizer)


@pytest.mark.parametrize("overflow", [False, True])
def test_sgdw_takes_the_scalers_verdict_on_the_device(monkeypatch, overflow):
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    config = OptimizerConfig(lr=0.5, momentum=0.9, weight_decay=0.1, exclude_norm_and_bias=False)
    optimizer = build_optimizer(model, config, 128)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    scaled_step(model, optimizer, scaler, poison=overflow)
    before = [p.detach().clone() for p in model.parameters()]
    grads = [p.grad.clone() for p in model.parameters()]
    reads = HostReads(monkeypatch)
    scaler.step(optimizer)
    scaler.update()
    assert reads.count == 0  # no per-step synchronisation
    monkeypatch.undo()
    for param, weight, grad in zip(model.parameters(), before, grads):
        # first step: momentum buffer = g; decoupled decay 0.1 * lr / peak lr = 0.1
        expected = weight if overflow else weight * (1 - 0.1) - 0.5 * grad
        assert torch.allclose(param.detach(), expected, atol=1e-6)
    assert scaler.get_scale() == (512.0 if overflow else 1024.0)


def test_sam_second_pass_reads_nothing_back_to_the_host(monkeypatch):
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    scaler = torch.amp.GradScaler("cpu", init_scale=256.0)
    state = State(
        model, torch.optim.SGD(model.parameters(), lr=0.1), Timeline(1, 8, 10), torch.device("cpu"),
        Precision("amp", "cpu", None, scaler), loss_fn=lambda out, target: (out - target).square().mean(),
    )  # fmt: skip
    engine = Engine(build_algorithms({"sam": SAMConfig(rho=0.05, epsilon=1e-12, interval=1)}))
    state.inputs, state.targets = torch.randn(8, 4), torch.randn(8, 2)
    engine.run(Event.BEFORE_FORWARD, state)
    state.outputs = model(state.inputs)
    state.loss = state.loss_fn(state.outputs, state.targets)
    engine.run(Event.AFTER_LOSS, state)
    scaler.scale(state.loss).backward()
    weights = [p.detach().clone() for p in model.parameters()]
    first = [p.grad / 256.0 for p in model.parameters()]
    reads = HostReads(monkeypatch)
    engine.run(Event.AFTER_BACKWARD, state)
    assert reads.count == 0
    monkeypatch.undo()
    assert all(torch.equal(p, w) for p, w in zip(model.parameters(), weights))  # weights back at w exactly
    norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in first]))
    reference = nn.Linear(4, 2)
    with torch.no_grad():
        for p, w, g in zip(reference.parameters(), weights, first):
            p.copy_(w + 0.05 * g / norm)
    state.loss_fn(reference(state.inputs), state.targets).backward()
    for p, q in zip(model.parameters(), reference.parameters()):
        assert torch.allclose(p.grad / 256.0, q.grad, atol=1e-5)  # the scaled gradient at w + e


def gpu_bench():
    sys.path.insert(0, str(ROOT / "bench"))
    import gpu_throughput

    return gpu_throughput


def test_gpu_bench_peaks_match_exact_product_names(monkeypatch):
    bench = gpu_bench()
    cuda = torch.device("cuda", 0)
    for name, bf16, tf32, fp32 in [
        ("NVIDIA H100 80GB HBM3", 989.4, 494.7, 66.9),
        ("NVIDIA H100 PCIe", 756.5, 378.0, 51.2),
        ("NVIDIA H100 NVL", 835.5, 417.5, 60.0),
        ("NVIDIA H200", 989.4, 494.7, 66.9),
    ]:
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device, name=name: name)
        assert bench.peak_tflops(cuda, "bf16", None, False) == bench.peak_tflops(cuda, "amp", None, True) == bf16
        assert bench.peak_tflops(cuda, "fp32", None, True) == tf32  # convolutions: TF32 tensor cores
        assert bench.peak_tflops(cuda, "fp32", None, False) == fp32  # matrix products in true fp32
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: "NVIDIA H100 SomethingNew")
    assert bench.peak_tflops(cuda, "bf16", None, False) is None
    assert bench.peak_tflops(cuda, "bf16", 700.0, False) == 700.0


@pytest.mark.slow
def test_gpu_bench_times_the_full_step_in_steady_state_at_the_rows_format(monkeypatch):
    bench = gpu_bench()
    resets = []
    original_reset = torch.compiler.reset
    monkeypatch.setattr(torch.compiler, "reset", lambda: resets.append(1) or original_reset())
    args = bench.argparse.Namespace(model="resnet_small", warmup=1, steps=2, recipe="mild")
    for nhwc in (False, True):
        setting = bench.Setting(32, 8, "fp32", nhwc, False)
        full = bench.full_step_rate(args, setting, torch.device("cpu"))
        assert (full.resolution, full.channels_last) == (32, nhwc)  # full size, the row's own layout
        bench.model_step_rate(args, setting, torch.device("cpu"))
    assert len(resets) == 4  # every setting starts from empty compile caches


@pytest.mark.slow
def test_gpu_bench_loader_rate_includes_the_device_copy_and_normalisation(monkeypatch, tmp_path):
    pytest.importorskip("ffcv")  # the GPU machine has no FFCV
    from trainrun.data.build import datasets
    from trainrun.data.write import WriteSettings, write_beton
    from trainrun.tasks.image_classification import ImageClassification

    bench = gpu_bench()
    train, _ = datasets(DataConfig(name="digits"), augment=False)
    write_beton(train, tmp_path / "digits.beton", WriteSettings(mode="raw", max_resolution=8))
    prepared = []
    original = ImageClassification.normalise
    monkeypatch.setattr(ImageClassification, "normalise", lambda self, *a: prepared.append(a[1]) or original(self, *a))
    rate = bench.loader_rate(str(tmp_path / "digits.beton"), 8, 64, 1, 10, torch.device("cpu"))
    assert rate > 0 and len(prepared) == 2 * (len(train) // 64)  # every batch of both epochs
    assert set(prepared) == {torch.channels_last}


def test_a_package_below_its_declared_floor_is_refused_in_one_line(monkeypatch, capsys):
    """The floors are setup.cfg's, read back from the installed metadata; the CLI names the package."""
    import importlib.metadata

    from trainrun import commands, versions

    try:
        floors = importlib.metadata.requires("trainrun")
    except importlib.metadata.PackageNotFoundError:  # a source tree on PYTHONPATH (the GPU machine)
        pytest.skip("trainrun is not installed here: no declared floors to read")
    assert "torch>=2.11" in floors and "torchvision>=0.26" in floors  # the floor make test-floor runs on
    versions.check_requirements()  # what is installed here meets them
    real_version = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "2.4.1" if name == "torch" else real_version(name))
    assert commands.main(["--cfg", "job"]) == 2
    assert capsys.readouterr().err == (
        "trainrun: error: trainrun needs torch>=2.11 but 2.4.1 is installed: pip install 'torch>=2.11'\n"
    )


def test_bf16_on_a_gpu_without_bf16_arithmetic_runs_fp16_amp_and_says_so(monkeypatch):
    from trainrun.core.precision import resolve_precision

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla V100-SXM2-32GB")
    precision, notes = resolve_precision("bf16", torch.device("cuda", 0))
    assert (precision.name, precision.dtype, precision.scaler is not None) == ("amp", torch.float16, True)
    assert notes == ["Tesla V100-SXM2-32GB has no bf16 arithmetic: precision=bf16 runs fp16 amp"]
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    precision, notes = resolve_precision("bf16", torch.device("cuda", 0))
    assert (precision.name, precision.dtype, precision.scaler, notes) == ("bf16", torch.bfloat16, None, [])
