"""compile=true: each model's training and evaluation compile without graph breaks, and nothing is
compiled again after warm-up (``summary.json``'s ``compile``); the Llama with selective
checkpointing on two ranks, under fsdp and ddp. Counted with dynamo's counters under the ``eager``
backend (the same tracing, breaks and guards as inductor's, without its code generation: seconds
instead of minutes on a CPU)."""

from __future__ import annotations

import json

import pytest
import torch

import trainrun.core.compiled as compiled
from tests.conftest import run_here
from trainrun.core import parallel

SHORT = ["progress=false", "export=false", "compile=true", "eval_interval=2ba", "max_duration=4ba"]
# each run: micro-batches of two sizes, an evaluation with a partial last batch, then more of the same
RUNS = {
    "resnet": ["task=image_classification", "data=digits", "model=resnet_small", "train_batch_size=12"],
    "bert with the methods": [
        "task=masked_lm",
        "data=text",
        "data.text.corpus=stdlib_docs",
        "model=bert_tiny",
        "algorithms=[seq_length_warmup,alibi,unpadding,gated_linear_units,low_precision_layernorm,masked_head,fused_layers]",
    ],
    "gpt as the speedrun": [
        "task=causal_lm",
        "data=stdlib_stream",
        "model=gpt_tiny",
        "data.text.max_seq_len=64",
        "optimizer=muon",
        "model.gpt.positions=rotary",
        "model.gpt.norm=rmsnorm",
        "model.gpt.qk_norm=true",
        "model.gpt.mlp=relu2",
        "model.gpt.tie_head=false",
        "model.gpt.logit_softcap=15",
        "model.gpt.value_embeddings=1",
        "model.gpt.document_mask=true",
        "algorithms=[window_warmup]",
        "algorithms.window_warmup.start=8",
        "algorithms.window_warmup.end=64",
        "algorithms.window_warmup.multiple=8",
    ],
    "unet": [
        "task=segmentation",
        "data=synthetic_brats",
        "model=unet2d",
        "model.unet.filters=[8,16,32]",
        "model.unet.strides=[1,2,2]",
        "data.segmentation.patch_size=[16,16]",
        "data.segmentation.synthetic_shape=[8,24,24]",
        "data.segmentation.synthetic_cases=10",
        "eval_batch_size=2",
    ],
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(RUNS))
def test_a_compiled_run_has_no_graph_break_and_no_recompile_after_warm_up(name, tmp_path, monkeypatch):
    monkeypatch.setattr(compiled, "BACKEND", "eager")
    torch._dynamo.reset()
    args = [*RUNS[name], *SHORT, "train_batch_size=6", "device_train_microbatch_size=4"]
    result = run_here(*args, f"hydra.run.dir={tmp_path}")
    assert result.returncode == 0, result.stderr
    record = json.loads((tmp_path / "summary.json").read_text())["compile"]
    print(name, record)
    assert record["graph_breaks"] == 0 and record["recompiles"] == 0, record
    assert record["warm_up_graphs"] >= 1 and record["seconds"] > 0


def passes_after_warm_up(model: torch.nn.Module, rank_seed: int) -> tuple[list[float], int, int]:
    """Training passes at micro-batch sizes 4 then 3 and an evaluation (the warm-up), then more sizes
    and another evaluation: the losses, and dynamo's graph breaks and graphs compiled after warm-up."""
    from torch._dynamo.utils import counters

    from trainrun.tasks.causal_lm import next_token_cross_entropy

    torch.manual_seed(rank_seed)
    losses, warm = [], 0
    for sizes in [(4, 3), (2, 5, 4)]:
        for size in sizes:
            tokens = torch.randint(0, 200, (size, 17))
            loss = next_token_cross_entropy(model(tokens[:, :-1]), tokens[:, 1:])
            loss.backward()
            losses.append(float(loss))
        model.eval()
        with torch.no_grad():
            model(torch.randint(0, 200, (6, 16)))
        model.train()
        warm = warm or counters["frames"]["ok"]
    return losses, sum(counters["graph_break"].values()), counters["frames"]["ok"] - warm


def compiled_rank(rank: int, port: int, results) -> None:
    """One of two gloo ranks: a Llama with selective checkpointing sharded (fsdp) and replicated
    (ddp), compiled block by block under the eager backend, and the same model uncompiled."""
    import os

    import torch.distributed as dist

    from trainrun.models.llama import Llama
    from trainrun.schema import LlamaConfig

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    for name in ("fsdp", "ddp"):
        runs = {}
        for compiles in (False, True):
            torch._dynamo.reset()
            torch.manual_seed(0)
            model = Llama(LlamaConfig(), 200)
            settings = parallel.Parallelism(name, activation_checkpointing="selective")
            model = parallel.prepare(model, settings, None, torch.device("cpu"))
            if compiles:
                assert compiled.compile_model(model, print, backend="eager") is model and compiled.is_compiled(model)
            if name == "ddp":
                model = parallel.replicate(model, torch.device("cpu"), find_unused_parameters=False)
            runs[compiles] = passes_after_warm_up(model, rank)
        results[(name, rank)] = runs
    dist.destroy_process_group()


@pytest.mark.slow
def test_blocks_compile_once_under_fsdp_and_ddp_with_checkpointing_and_train_as_eager(tmp_path):
    import torch.multiprocessing as mp

    from trainrun.launch import free_port

    results = mp.Manager().dict()
    mp.spawn(compiled_rank, args=(free_port(), results), nprocs=2)
    for name in ("fsdp", "ddp"):
        for rank in range(2):
            eager, compiled_run = results[(name, rank)][False], results[(name, rank)][True]
            assert compiled_run[1:] == (0, 0), (name, compiled_run)  # no graph break, nothing compiled after warm-up
            assert compiled_run[0] == pytest.approx(eager[0], rel=1e-5), name


def test_a_blocks_compiled_gpt_compiles_its_logits_tail_and_loss_and_trains_as_eager():
    """A GPT with a padded vocabulary and soft-capped logits: compiled, its blocks, its logits' tail
    and its loss (the plain float32 cross-entropy inside the graph, keeping no float32 logits for its
    backward; the chunked one eager) give the
    eager model's loss and gradients, without a graph break; a model compiled whole keeps its loss,
    and so does a task whose loss does not trace whole."""
    from torch._dynamo.utils import counters

    from trainrun.models.gpt import GPT
    from trainrun.schema import GPTConfig
    from trainrun.tasks.causal_lm import CausalLanguageModeling, next_token_cross_entropy
    from trainrun.tasks.losses import summed_cross_entropy
    from trainrun.tasks.masked_lm import MaskedLanguageModeling

    def model() -> GPT:
        torch.manual_seed(0)
        return GPT(GPTConfig(layers=2, heads=2, width=16, max_seq_len=12, logit_softcap=15.0), vocab_size=50)

    eager, compiled_gpt, tokens = model(), model(), torch.randint(0, 50, (3, 13))
    assert compiled.compiled_regions(compiled_gpt) == [*compiled_gpt.blocks, compiled_gpt.logit_tail]
    torch._dynamo.reset()
    loss_fn = compiled.compile_loss(compiled_gpt, CausalLanguageModeling(), next_token_cross_entropy, backend="eager")
    compiled.compile_model(compiled_gpt, print, backend="eager")
    losses = []
    for net, loss in ((eager, next_token_cross_entropy), (compiled_gpt, loss_fn)):
        value = loss(net(tokens[:, :-1]), tokens[:, 1:])
        value.backward()
        losses.append(value)
    torch.testing.assert_close(*losses)
    for (name, mine), theirs in zip(compiled_gpt.named_parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(mine.grad, theirs.grad, msg=name)
    assert sum(counters["graph_break"].values()) == 0
    logits, targets = torch.randn(40, 50), torch.randint(0, 50, (40,))  # chunked eager (8 rows a chunk), plain compiled
    torch.testing.assert_close(
        summed_cross_entropy(logits, targets, chunk_elements=400),
        torch.compile(summed_cross_entropy, backend="eager")(logits, targets, chunk_elements=400),
    )
    saved = []  # what the compiled loss keeps for its backward (inductor's partitioner): no float32 logits
    half = logits.bfloat16().requires_grad_()
    with torch.autograd.graph.saved_tensors_hooks(lambda x: saved.append((x.shape, x.dtype)) or x, lambda x: x):
        torch.compile(summed_cross_entropy, backend="aot_eager_decomp_partition")(half, targets, chunk_elements=400)
    assert (half.shape, torch.float32) not in saved and (half.shape, torch.bfloat16) in saved, saved
    whole = torch.nn.Linear(4, 2)
    assert compiled.compile_loss(whole, CausalLanguageModeling(), next_token_cross_entropy) is next_token_cross_entropy
    assert not compiled.compiles_loss(compiled_gpt, MaskedLanguageModeling())  # its loss reads host counts
