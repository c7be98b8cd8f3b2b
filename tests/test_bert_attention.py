"""trainrun's BERT attention paths: the padded model's numbers on the real tokens alone, ALiBi inside
the kernel, and a training step that reads nothing back from the device."""

import re
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import flex_attention

import trainrun.models.bert as bert_module
from trainrun.core.precision import Precision
from trainrun.data.masked_text import IGNORED, collate_masked
from trainrun.models.alibi import alibi_slopes
from trainrun.models.bert import MaskedLanguageModel, build_bert
from trainrun.schema import BertConfig
from trainrun.tasks.masked_lm import MaskedLanguageModeling, MaskedTokenEvaluator, masked_cross_entropy

LENGTHS = [9, 4, 6, 1]
WIDTH = 9


def tiny_bert(alibi: bool = False, dropout: float = 0.0) -> MaskedLanguageModel:
    torch.manual_seed(0)
    config = BertConfig(layers=2, hidden_size=16, heads=2, intermediate_size=32)
    config.hidden_dropout = config.attention_dropout = dropout
    model = build_bert(config, vocab_size=50)
    if alibi:
        model.use_alibi(16)
    return model


def loader_batch(lengths=LENGTHS, width=WIDTH) -> dict[str, torch.Tensor]:
    """What the loader's workers send: sequences of ``lengths`` real tokens, the second each predicted."""
    generator = torch.Generator().manual_seed(1)
    samples = []
    for length in lengths:
        mask = (torch.arange(width) < length).long()
        ids = torch.randint(5, 50, (width,), generator=generator) * mask
        chosen = torch.zeros(width, dtype=torch.bool)
        chosen[min(1, length - 1)] = True
        labels = torch.where(chosen, ids, IGNORED)
        samples.append(
            {"input_ids": ids, "attention_mask": mask, "labels": labels, "predict_positions": chosen.nonzero()[:, 0]}
        )
    return collate_masked(samples)


def inputs_of(batch):
    return {key: batch[key] for key in ("input_ids", "attention_mask", "lengths")}


def per_sequence_attention(q, k, v, cu_q, cu_k, max_q, max_k):
    """What a variable-length kernel computes: each sequence of the packed rows attends to itself."""
    assert torch.equal(cu_q, cu_k) and cu_q.dtype == torch.int32 and max_q == max_k
    pieces = []
    for start, end in zip(cu_q[:-1].tolist(), cu_q[1:].tolist(), strict=True):
        q_, k_, v_ = (t[start:end].transpose(0, 1) for t in (q, k, v))  # (heads, tokens, size)
        pieces.append(F.scaled_dot_product_attention(q_, k_, v_).transpose(0, 1))
    return torch.cat(pieces)


def force_path(monkeypatch, unpadded: str, padded: str = "sdpa") -> None:
    monkeypatch.setattr(
        MaskedLanguageModel, "attention_path", lambda self, device, dtype: unpadded if self.unpad else padded
    )


def real_rows(logits, batch):
    return logits[batch["attention_mask"].bool()]


def test_the_varlen_path_runs_the_real_tokens_only_with_the_padded_models_outputs_and_gradients(monkeypatch):
    calls = []

    def recording(q, k, v, cu_q, cu_k, max_q, max_k):
        calls.append((q.shape, cu_q.tolist(), max_q))
        return per_sequence_attention(q, k, v, cu_q, cu_k, max_q, max_k)

    monkeypatch.setattr("torch.nn.attention.varlen.varlen_attn", recording)
    force_path(monkeypatch, "varlen")
    model, batch = tiny_bert(), loader_batch()
    results = []
    for unpad in (False, True):
        model.unpad = unpad
        model.zero_grad()
        logits = model(inputs_of(batch))
        real_rows(logits, batch).square().sum().backward()
        results.append((real_rows(logits, batch).detach(), [p.grad.clone() for p in model.parameters()]))
    (padded, padded_grads), (unpadded, unpadded_grads) = results
    assert padded.shape == unpadded.shape == (sum(LENGTHS), 50)
    torch.testing.assert_close(unpadded, padded, rtol=1e-5, atol=1e-5)
    for a, b in zip(unpadded_grads, padded_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert calls == [((20, 2, 8), [0, 9, 13, 19, 20], 9)] * 2  # one call per layer, on the 20 real tokens


def test_the_padded_and_re_padded_paths_keep_each_sequence_to_itself():
    """A sequence's logits do not depend on the other sequences of its batch, padded or not."""
    model, batch = tiny_bert(), loader_batch()
    alone = loader_batch(lengths=[6], width=WIDTH)
    alone["input_ids"][0] = batch["input_ids"][2]
    for unpad in (False, True):
        model.unpad = unpad
        together = model(inputs_of(batch))[2, :6]
        torch.testing.assert_close(model(inputs_of(alone))[0, :6], together, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("alibi", [False, True])
def test_flex_attention_gives_the_sdpa_paths_outputs_with_alibi_in_its_score_mod(monkeypatch, alibi):
    """FlexAttention (eager here: torch runs it on a CPU forward only) with a document mask over the
    packed tokens, or a padding mask, and ALiBi as ``score - slope·|i - j|``, against sdpa with the
    materialised (batch, heads, length, length) biases."""
    monkeypatch.setattr(bert_module, "flex_kernel", lambda dynamic: flex_attention)
    model, batch = tiny_bert(alibi=alibi), loader_batch()
    outputs = {}
    with torch.no_grad():
        for path in ("sdpa", "flex"):
            force_path(monkeypatch, path, padded=path)
            for unpad in (False, True):
                model.unpad = unpad
                outputs[path, unpad] = real_rows(model(inputs_of(batch)), batch)
    for unpad in (False, True):
        torch.testing.assert_close(outputs["flex", unpad], outputs["sdpa", False], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(outputs["sdpa", unpad], outputs["sdpa", False], rtol=1e-5, atol=1e-5)


def test_auto_attention_takes_each_path_where_it_applies_and_a_forced_one_is_checked(monkeypatch):
    model = tiny_bert()
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    model.unpad = True
    assert model.attention_path(cuda, torch.bfloat16) == "varlen"
    assert model.attention_path(cuda, torch.float32) == "sdpa"  # the Flash kernel has no fp32
    assert model.attention_path(cpu, torch.bfloat16) == "sdpa"
    monkeypatch.setattr(bert_module, "has_varlen_attention", lambda: False)  # a torch without varlen_attn
    assert model.attention_path(cuda, torch.bfloat16) == "sdpa"
    monkeypatch.undo()
    model.unpad = False
    assert model.attention_path(cuda, torch.bfloat16) == "sdpa"
    model.alibi_slopes = alibi_slopes(2)
    assert model.attention_path(cuda, torch.bfloat16) == "sdpa"  # measured faster than flex on an H100
    model.attention = "flex"
    assert model.attention_path(cuda, torch.bfloat16) == "flex"  # the bias inside the kernel, when asked for
    model.attention = "auto"
    dropping = tiny_bert(dropout=0.1)
    dropping.unpad = True
    assert dropping.attention_path(cuda, torch.bfloat16) == "sdpa"  # neither kernel has attention dropout
    assert dropping.eval().attention_path(cuda, torch.bfloat16) == "varlen"  # no dropout in evaluation
    model.attention = "varlen"
    from trainrun.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^bad value for 'model.bert.attention': 'varlen' needs a CUDA device"):
        model.attention_path(cpu, torch.bfloat16)


@pytest.mark.parametrize(
    ("unpad", "masked_head", "alibi"), [(False, False, False), (True, True, True), (True, False, False)]
)
def test_a_bert_step_and_evaluation_read_nothing_back_from_the_device(unpad, masked_head, alibi):
    """On the meta device a tensor has no values: any read-back (``nonzero``, boolean indexing,
    ``.item()``, ``if tensor``) raises. The step runs there from the loader's batch to the optimizer,
    with sequence-length warmup's cut, and so does an evaluation batch."""
    from trainrun.algorithms import build_algorithms
    from trainrun.algorithms.specs.seq_length_warmup import SeqLengthWarmupConfig
    from trainrun.core.events import Event

    model = tiny_bert(alibi=alibi, dropout=0.1)
    model.unpad, model.masked_head = unpad, masked_head
    model.to("meta")
    task, device = MaskedLanguageModeling(), torch.device("meta")
    inputs, targets, _ = task.batch(loader_batch(), SimpleNamespace(device=device))
    assert inputs["input_ids"].is_meta and not inputs["lengths"].is_meta  # counts stay on the host
    state = SimpleNamespace(inputs=inputs, targets=targets, progress=0.1, task=task)
    build_algorithms({"seq_length_warmup": SeqLengthWarmupConfig(duration=0.5, min_seq_length=4, step_size=2)})[
        0
    ].apply(Event.AFTER_DATALOADER, state)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, foreach=False)
    loss = masked_cross_entropy(model(state.inputs), state.targets)
    loss.backward()
    optimizer.step()
    assert loss.is_meta and loss.dim() == 0
    model.eval()
    with torch.no_grad():
        evaluator = MaskedTokenEvaluator(device, 1)
        outputs = model(inputs)
        evaluator.update(outputs, targets)
    assert outputs.shape == (4, 50)  # evaluation: the predicted rows' logits only (one a sequence)
    with pytest.raises((RuntimeError, NotImplementedError)):  # the detector: a read-back does raise here
        torch.ones(3, device="meta").nonzero()


def test_the_start_up_banner_names_the_attention_each_path_runs(monkeypatch):
    model = tiny_bert()
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert model.attention_kernels(12, torch.float32, cpu).startswith("scaled_dot_product_attention (")
    model.unpad = True
    assert model.attention_kernels(12, torch.bfloat16, cuda) == "varlen_attn (Flash) on the real tokens only"
    model.alibi_slopes, model.attention = alibi_slopes(2), "flex"
    expected = "FlexAttention (compiled) on the real tokens only, ALiBi in its score_mod"
    assert model.attention_kernels(12, torch.bfloat16, cuda) == expected


def test_the_masked_lm_task_says_which_attention_its_bert_gets_at_the_datas_length():
    model = tiny_bert()
    state = SimpleNamespace(raw_model=model, precision=Precision("fp32", "cpu"), device=torch.device("cpu"))
    state.data = SimpleNamespace(text=SimpleNamespace(max_seq_len=32))
    (line,) = MaskedLanguageModeling().startup_notes(state)
    assert re.fullmatch(r"attention: scaled_dot_product_attention \(\w+\) on batches padded to their length", line)
    state.raw_model = SimpleNamespace(attention_kernels=lambda length, dtype, device: f"{length} {dtype} {device}")
    assert MaskedLanguageModeling().startup_notes(state) == ["attention: 32 torch.float32 cpu"]  # fp32: no autocast
    state.precision = Precision("bf16", "cpu", torch.bfloat16)
    assert MaskedLanguageModeling().startup_notes(state) == ["attention: 32 torch.bfloat16 cpu"]


@pytest.mark.parametrize("masked_head", [False, True])
def test_repeated_evaluation_samples_are_not_scored(masked_head):
    """A rank's last evaluation batch repeats a sample to run the other ranks' passes: its metrics
    equal those of the batch cut to its own samples, with or without a masked head's rows."""
    model = tiny_bert()
    model.masked_head = masked_head
    model.eval()
    task, device = MaskedLanguageModeling(), torch.device("cpu")
    batch = loader_batch()
    inputs, targets, size = task.batch(batch, SimpleNamespace(device=device))
    own = 3
    cut_inputs, cut_targets, _ = task.batch(loader_batch(LENGTHS[:own]), SimpleNamespace(device=device))
    with torch.no_grad():
        repeated, alone = MaskedTokenEvaluator(device, 1), MaskedTokenEvaluator(device, 1)
        repeated.update(*task.without_repeats(model(inputs), targets, own, size))
        alone.update(model(cut_inputs), cut_targets)
    assert repeated.compute() == pytest.approx(alone.compute())


@pytest.mark.parametrize("unpad", [False, True])
def test_compiled_layers_take_each_batchs_flex_mask_without_recompiling(monkeypatch, unpad):
    """A batch's FlexAttention block mask and ALiBi's score modification reach the compiled layers
    as inputs (closures over tensors only): batches of other lengths and sizes, after the ones that
    make their sizes dynamic, compile nothing more, and give the uncompiled model's outputs."""
    from torch._dynamo.utils import counters

    from trainrun.core.compiled import compile_model

    monkeypatch.setattr(bert_module, "flex_kernel", lambda dynamic: flex_attention)
    force_path(monkeypatch, "flex", padded="flex")
    model, reference = tiny_bert(alibi=True), tiny_bert(alibi=True)
    model.unpad = reference.unpad = unpad
    torch._dynamo.reset()
    compile_model(model, print, backend="eager")
    graphs = []
    with torch.no_grad():
        for lengths in ([9, 4, 6, 1], [3, 8, 2, 5], [7, 7, 1], [2, 9, 4, 4, 6], [5, 1]):
            batch = loader_batch(lengths)
            torch.testing.assert_close(model(inputs_of(batch)), reference(inputs_of(batch)), rtol=1e-5, atol=1e-5)
            graphs.append(counters["frames"]["ok"])
    # warm-up: the first batch, then one of another size makes the sizes dynamic
    assert sum(counters["graph_break"].values()) == 0 and graphs[2] == graphs[-1], graphs
