"""Sharded training: Llama 3, FSDP2 equal to one rank and to DDP, sharded checkpoints resumed on
another number of ranks, activation checkpointing, and what a sharded run refuses."""

import os
import shutil
import signal
import subprocess
import sys
import threading
import zlib
from pathlib import Path

import pytest
import torch
from conftest import on_cpu_beyond_gpus, read_metrics, run_here, wait_for

from trainrun.atomic_io import read_jsonl
from trainrun.config import compose
from trainrun.core import precision as precision_module
from trainrun.core.parallel import SAC_HOOKS, Parallelism, checkpoint_activations
from trainrun.core.sharded_checkpoint import whole_weights
from trainrun.errors import ConfigError
from trainrun.models.llama import Llama
from trainrun.models.llama_export import equal_logits, hf_name, to_llama
from trainrun.schema import LlamaConfig
from trainrun.validation import validate

LLAMA = ["task=causal_lm", "data=stdlib_stream", "model=llama_tiny", "optimizer=adamw", "optimizer.lr=3e-3"]
# Adam's eps well above the gradients' float noise: a weight whose gradient is ~0 moves by noise / eps
LLAMA += ["optimizer.eps=1e-5", "train_batch_size=8", "data.text.max_seq_len=32", "progress=false"]
CLIPPED = ["algorithms=[gradient_clipping]", "device_train_microbatch_size=2"]  # 2 passes a rank, clipped


def assert_same_weights(got: dict, expected: dict, atol: float = 1e-4) -> None:
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        torch.testing.assert_close(got[name], value, rtol=1e-3, atol=atol, msg=name)


def final_weights(run: Path) -> dict[str, torch.Tensor]:
    """The model of a run's newest checkpoint: one file, or a sharded folder read whole."""
    newest = max((run / "checkpoints").iterdir(), key=lambda path: int(path.name.split("-ba")[1].split(".")[0]))
    return whole_weights(newest) if newest.is_dir() else torch.load(newest, weights_only=True)["model"]


@pytest.mark.parametrize(
    "shape",
    [{}, {"kv_heads": 1, "rope_factor": 8.0, "rope_original_positions": 64, "tie_head": True}],
    ids=["llama_tiny", "scaled_rope_tied_head"],
)
def test_the_llama_export_gives_transformers_logits_equal_to_trainruns(shape):
    torch.manual_seed(0)
    model = Llama(LlamaConfig(**shape), vocab_size=300).eval()
    exported = to_llama(model)
    assert type(exported).__name__ == "LlamaForCausalLM"
    assert equal_logits(model, exported, torch.randint(0, 300, (2, 200))) < 1e-5  # positions past 64: scaled


def test_a_llama_built_on_the_meta_device_materialises_the_weights_built_whole():
    torch.manual_seed(3)
    whole = Llama(LlamaConfig(tie_head=True), vocab_size=300)
    torch.manual_seed(3)
    with torch.device("meta"):
        meta = Llama(LlamaConfig(tie_head=True), vocab_size=300)
    meta.to_empty(device="cpu")
    meta.initialise()
    assert meta.head.weight is meta.embed.weight
    for (name, a), b in zip(whole.state_dict().items(), meta.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert torch.equal(whole.rotary_cos, meta.rotary_cos)


def saved_activation_bytes(model: torch.nn.Module, tokens: torch.Tensor) -> tuple[int, torch.Tensor, list]:
    """What autograd keeps from a forward pass for the backward (bytes), the loss and the gradients."""
    saved = 0

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal saved
        saved += tensor.numel() * tensor.element_size() if not isinstance(tensor, torch.nn.Parameter) else 0
        return tensor

    model.zero_grad()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = model(tokens).logsumexp(-1).mean()
    loss.backward()
    return saved, loss.detach(), [parameter.grad.clone() for parameter in model.parameters()]


def test_activation_checkpointing_keeps_outputs_and_gradients_and_saves_activations():
    """The saving is measured as the bytes autograd keeps for the backward pass."""
    tokens = torch.randint(0, 300, (4, 128))
    results = {}
    for mode in ("none", "selective", "full"):
        torch.manual_seed(0)
        model = Llama(LlamaConfig(layers=4), vocab_size=300)
        checkpoint_activations(model, Parallelism(activation_checkpointing=mode))
        results[mode] = saved_activation_bytes(model, tokens)
    for mode in ("selective", "full"):
        assert torch.equal(results[mode][1], results["none"][1])
        for got, expected in zip(results[mode][2], results["none"][2], strict=True):
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-7)
    none, selective, full = (results[mode][0] for mode in ("none", "selective", "full"))
    assert selective < none and full < none / 3
    if SAC_HOOKS:  # torch 2.12 on: what selective checkpointing keeps passes the hooks and is counted
        assert full < selective


def test_selective_checkpointing_of_every_other_product_recomputes_half_the_products_and_saves_more():
    """parallel.selective_products=alternate (torchtitan's op policy): the backward runs again half of
    the forward's matrix products, the same gradients come out, and less is kept than when every
    product is."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Products(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN202
            self.count += func.overloadpacket is torch.ops.aten.mm
            return func(*args, **(kwargs or {}))

    tokens = torch.randint(0, 300, (2, 64))
    runs = {}
    for products in ("all", "alternate"):
        torch.manual_seed(0)
        model = Llama(LlamaConfig(layers=2), vocab_size=300)
        checkpoint_activations(model, Parallelism(activation_checkpointing="selective", selective_products=products))
        loss, backward = model(tokens).logsumexp(-1).mean(), Products()
        with backward:
            loss.backward()
        grads = [parameter.grad for parameter in model.parameters()]
        runs[products] = (backward.count, grads, saved_activation_bytes(model, tokens)[0])
    (backward, grads, saved), (alternate_backward, alternate_grads, alternate_saved) = runs.values()
    recomputed = 2 * (7 // 2)  # of each block's 7 (query, key, value, out, gate, up, down): the 2nd, 4th, 6th
    assert alternate_backward == backward + recomputed
    for got, expected in zip(alternate_grads, grads, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-7)
    if SAC_HOOKS:
        assert alternate_saved < saved


def test_every_kth_block_is_checkpointed_and_only_a_model_with_dropout_keeps_its_rng_state(monkeypatch):
    """parallel.checkpoint_every=2 recomputes blocks 0 and 2 of 4 and keeps the others' activations:
    saved bytes between none and every block's; a Llama (no dropout) saves no RNG state for the
    recompute, a GPT with dropout does."""
    from trainrun.core import parallel
    from trainrun.models.gpt import GPT
    from trainrun.schema import GPTConfig

    tokens = torch.randint(0, 300, (4, 128))
    saved = {}
    for every in (1, 2):
        torch.manual_seed(0)
        model = Llama(LlamaConfig(layers=4), vocab_size=300)
        checkpoint_activations(model, Parallelism(activation_checkpointing="full", checkpoint_every=every))
        wrapped = [hasattr(block.forward, "__wrapped__") for block in model.blocks]
        assert wrapped == ([True] * 4 if every == 1 else [True, False, True, False])
        saved[every] = saved_activation_bytes(model, tokens)[0]
    torch.manual_seed(0)
    plain = Llama(LlamaConfig(layers=4), vocab_size=300)
    assert saved[1] < saved[2] < saved_activation_bytes(plain, tokens)[0]

    options = []
    monkeypatch.setattr(
        parallel, "checkpoint", lambda forward, *args, **kwargs: options.append(kwargs) or forward(*args)
    )
    for model in (Llama(LlamaConfig(), 300), GPT(GPTConfig(dropout=0.1), 300)):
        checkpoint_activations(model, Parallelism(activation_checkpointing="selective"))
        model(torch.randint(0, 300, (1, 8)))
    assert [kwargs["preserve_rng_state"] for kwargs in options] == [False, False, True, True]


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["algorithms=[ema]"],
            "algorithm 'ema' does not run under parallel=fsdp: its average is a whole copy of the model",
        ),
        (["precision=amp"], "bad value for 'precision': 'amp' (fp16 with loss scaling) does not run under"),
    ],
)
def test_what_a_sharded_run_cannot_do_is_refused_in_one_line(args, line):
    with pytest.raises(ConfigError) as refused:
        validate(compose([*LLAMA, "parallel=fsdp", *args]), files=False)
    assert str(refused.value).startswith(line) and "\n" not in str(refused.value)


def test_activation_checkpointing_needs_blocks():
    with pytest.raises(ConfigError, match="'parallel.activation_checkpointing': 'full' recomputes blocks, which model"):
        validate(compose(["parallel.activation_checkpointing=full"]), files=False)


@pytest.mark.slow
@pytest.mark.distributed
def test_fsdp_on_two_ranks_trains_the_weights_of_one_rank_and_of_ddp(tmp_path):
    """llama_tiny (built on the meta device and materialised in shards) and gpt_tiny (built whole,
    then sharded), with clipping over the sharded gradients and two micro-batches a rank; validation
    on 5 windows, which 2 ranks do not divide (one rank repeats a window to run the other's passes,
    unscored): the same loss as one rank's, each window scored once."""
    runs = {
        "llama_one": [*LLAMA, *CLIPPED],
        "llama_ddp": [*LLAMA, *CLIPPED, "launcher.devices=2"],
        "llama_fsdp": [*LLAMA, *CLIPPED, "launcher.devices=2", "parallel=fsdp"],
        "gpt_one": [*LLAMA, *CLIPPED, "model=gpt_tiny"],
        "gpt_fsdp": [*LLAMA, *CLIPPED, "model=gpt_tiny", "launcher.devices=2", "parallel=fsdp"],
    }
    uneven = ["data.text.val_tokens=160", "eval_batch_size=4"]  # 5 windows of 32, batches of 2 a rank
    for name, args in runs.items():
        args = [*args, *uneven, "max_duration=10ba", "eval_interval=5ba", f"hydra.run.dir={tmp_path / name}"]
        result = run_here(*args)  # the launcher here, the ranks forked from its fork server
        assert result.returncode == 0, result.stderr
    for kind in ("llama", "gpt"):
        one = [row["eval_loss"] for row in read_metrics(tmp_path / f"{kind}_one")]
        for name in (f"{kind}_ddp", f"{kind}_fsdp"):
            if name in runs:
                assert [row["eval_loss"] for row in read_metrics(tmp_path / name)] == pytest.approx(one, rel=1e-4)
    expected = final_weights(tmp_path / "llama_one")
    assert_same_weights(final_weights(tmp_path / "llama_ddp"), expected)
    assert_same_weights(final_weights(tmp_path / "llama_fsdp"), expected)
    assert_same_weights(final_weights(tmp_path / "gpt_fsdp"), final_weights(tmp_path / "gpt_one"))
    from transformers import LlamaForCausalLM

    exported = LlamaForCausalLM.from_pretrained(tmp_path / "llama_fsdp" / "hf_model").state_dict()
    fsdp = final_weights(tmp_path / "llama_fsdp")  # gathered whole to rank 0 for the export
    assert all(torch.equal(exported[hf_name(name)], value) for name, value in fsdp.items())


@pytest.mark.slow
@pytest.mark.distributed
def test_a_sharded_run_killed_mid_epoch_resumes_on_one_and_on_four_ranks(tmp_path):
    """SIGKILL to the whole 2-rank job after its second sharded checkpoint; resume=auto on 1 and on 4
    ranks (DCP reshards weights and AdamW's state) ends with the uninterrupted run's weights (whose
    checkpoints were written in the background). Then the checkpoint is consolidated into one file
    and the resumed run samples text."""
    args = [*LLAMA, "parallel=fsdp", "max_duration=16ba", "eval_interval=8ba", "checkpoint.interval=4ba"]
    args += ["checkpoint.keep=10", "export=false"]  # consolidate --hf below exports the resumed run
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    command = [sys.executable, "-m", "trainrun", *on_cpu_beyond_gpus([*args, "launcher.devices=2"])]
    process = subprocess.Popen(
        [*command, f"hydra.run.dir={killed}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )

    def kill_at_the_second_checkpoint() -> None:
        wait_for(lambda: (killed / "checkpoints" / "ep0-ba8").is_dir(), process)
        os.killpg(process.pid, signal.SIGKILL)  # the launcher and both ranks at once: no handler runs

    killer = threading.Thread(target=kill_at_the_second_checkpoint)
    killer.start()  # while that run starts in its process, the uninterrupted one trains here
    # the uninterrupted run writes in the background (async_save): the same checkpoints
    assert run_here(*args, "launcher.devices=2", "checkpoint.async_save=true", f"hydra.run.dir={whole}").returncode == 0
    assert sorted(path.name for path in (whole / "checkpoints" / "ep0-ba16").iterdir()) == [
        ".metadata",
        "__0_0.distcp",  # each rank's shards
        "__1_0.distcp",
        "trainer.pt",
    ]
    assert not (whole / "hf_model").exists()  # export=false
    killer.join(timeout=120)
    assert process.wait(timeout=30) == -signal.SIGKILL
    assert (killed / "checkpoints" / "ep0-ba8").is_dir() and not (killed / "checkpoints" / "ep0-ba16").exists()
    expected = final_weights(whole)
    for ranks in (1, 4):
        shutil.copytree(killed, folder := tmp_path / f"on{ranks}")
        resumed = run_here(*args, "resume=auto", f"launcher.devices={ranks}", f"hydra.run.dir={folder}")
        assert resumed.returncode == 0, resumed.stderr
        if ranks == 1:  # one rank prints here (four ranks print to their own streams)
            assert "ep0-ba8 at epoch 0, batch 8" in resumed.stdout.partition("resumed from ")[2]
        assert_same_weights(final_weights(folder), expected, atol=1e-5)
        # step rows from 9 on: it went on after step 8 (the killed run wrote none: rows go every 10 steps)
        assert [row["step"] for row in read_jsonl(folder / "steps.jsonl")] == list(range(9, 17))
    resumed = tmp_path / "on1"  # the commands below in this process: their output, not their start, is tested
    consolidated = run_here("consolidate", str(resumed / "checkpoints" / "ep0-ba16"), "--hf", str(tmp_path / "hf"))
    assert consolidated.returncode == 0, consolidated.stderr
    one_file = torch.load(resumed / "ep0-ba16.pt", weights_only=True)
    assert_same_weights(one_file["model"], expected, atol=1e-5)
    assert (tmp_path / "hf" / "model.safetensors").is_file()
    sampled = run_here("sample", str(resumed), "--prompt", "The file", "--tokens", "5", "--temperature", "0")
    assert sampled.returncode == 0 and sampled.stdout.startswith("The file"), sampled.stderr


def test_fp8_without_compile_says_it_is_slower_than_bf16(monkeypatch):
    """torchao's float8 casts run as separate kernels in eager mode (0.44x of bf16 on an H200)."""
    monkeypatch.setattr(precision_module, "check_float8", lambda name, device: None)  # no float8 GPU here
    eager, notes = precision_module.resolve_precision("fp8", torch.device("cuda"), compiled=False)
    assert eager.float8 and eager.dtype == torch.bfloat16
    assert notes == [precision_module.FP8_EAGER] and "add compile=true" in notes[0]
    assert precision_module.resolve_precision("fp8", torch.device("cuda"), compiled=True)[1] == []


@pytest.mark.parametrize(
    ("precision", "expected"), [(torch.bfloat16, (torch.bfloat16, torch.float32)), (None, (None, None))]
)
def test_every_fsdp_unit_computes_in_the_runs_precision_and_reduces_gradients_in_float32(precision, expected):
    """Under bf16 each unit (every block and the root: embedding, final norm, head) gathers bf16
    weights and reduce-scatters float32 gradients; under fp32 the policy sets neither."""
    from trainrun.core.parallel import Parallelism, prepare
    from trainrun.estimate.memory import fake_world

    with fake_world(2):
        with torch.device("meta"):
            model = Llama(LlamaConfig(layers=2, width=32, heads=2, kv_heads=1, max_seq_len=16), vocab_size=64)
        prepare(model, Parallelism("fsdp"), precision, torch.device("cpu"))
        units = [model, *model.blocks]
        policies = [unit._get_fsdp_state()._fsdp_param_group.mp_policy for unit in units]
    assert len(units) == 3 and [(p.param_dtype, p.reduce_dtype) for p in policies] == [expected] * 3


def test_each_llama_weight_starts_from_its_own_names_generator_whatever_the_layout():
    """A weight's initial value depends on the run's seed and its name only: the same in a model of
    more blocks (residual projections scaled by their depth rule), in any order of initialisation,
    and different from every other weight's."""
    import math

    torch.manual_seed(0)
    two = Llama(LlamaConfig(layers=2, width=32, heads=2, kv_heads=1, max_seq_len=16), vocab_size=64)
    torch.manual_seed(0)
    three = Llama(LlamaConfig(layers=3, width=32, heads=2, kv_heads=1, max_seq_len=16), vocab_size=64)
    deeper = dict(three.named_parameters())
    for name, value in two.named_parameters():
        residual = name.endswith(("attention.out.weight", "mlp.down.weight"))
        scale = math.sqrt(4 / 6) if residual else 1.0  # std 0.02 / sqrt(2 x layers)
        torch.testing.assert_close(deeper[name], value * scale, msg=name)
    for name, value in two.named_parameters():  # norms at one; matrices normal(0, 0.02), residual 0.02 / sqrt(2 x 2)
        if name.endswith("norm.weight"):
            assert torch.equal(value, torch.ones_like(value)), name
        else:
            residual = name.endswith(("attention.out.weight", "mlp.down.weight"))
            assert float(value.detach().std()) == pytest.approx(0.02 / 2 if residual else 0.02, rel=0.1), name
    name = "blocks.1.mlp.up.weight"  # the key: the run's weight seed plus the name's CRC-32
    generator = torch.Generator().manual_seed((two.weight_seed + zlib.crc32(name.encode())) % 2**63)
    expected = torch.empty(deeper[name].shape).normal_(0.0, 0.02, generator=generator)
    assert torch.equal(dict(two.named_parameters())[name], expected)
    backwards = {name: two.initial_value(name, p) for name, p in reversed(list(two.named_parameters()))}
    assert all(torch.equal(backwards[name], p) for name, p in two.named_parameters())
    matrices = [p.flatten()[:16] for name, p in two.named_parameters() if p.dim() == 2]
    assert len({tuple(m.tolist()) for m in matrices}) == len(matrices)  # no two weights share a draw


@pytest.mark.parametrize("reshard", [True, False])
def test_reshard_after_forward_decides_whether_a_blocks_weights_stay_gathered_for_its_backward(reshard):
    """``parallel.reshard_after_forward``, from the command line to FSDP2: after a forward, each
    block's weights are shards again (true: gathered anew for the backward) or stay whole (false:
    more memory, one all-gather less); the root's stay whole either way (its backward starts at once).
    Rank 0 of a fake process group of 2."""
    from torch.distributed.tensor import DTensor

    from trainrun.core import parallel
    from trainrun.estimate.memory import fake_world
    from trainrun.run import parallelism

    args = ["task=causal_lm", "data=stdlib_stream", "model=llama_tiny", "parallel=fsdp"]
    config = validate(compose([*args, f"parallel.reshard_after_forward={str(reshard).lower()}"]), files=False)
    with fake_world(2):
        model = Llama(LlamaConfig(layers=2, width=32, heads=2, kv_heads=1, ffn_hidden=64, max_seq_len=8), 40)
        model = parallel.prepare(model, parallelism(config), None, torch.device("cpu"))
        assert all(isinstance(weight, DTensor) for weight in model.parameters())  # sharded before the forward
        model(torch.randint(0, 40, (1, 8)))
        sharded = [all(isinstance(weight, DTensor) for weight in block.parameters()) for block in model.blocks]
        assert sharded == [reshard, reshard]
        assert not isinstance(model.embed.weight, DTensor)
