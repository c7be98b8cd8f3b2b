"""BERT's speed-up methods and LAMB, each checked by numbers against its formula."""

import copy
import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from conftest import read_metrics, run_here
from test_engine_algorithms import make_state
from torch import nn

from trainrun.algorithms import build_algorithms
from trainrun.algorithms.fused_layers import fuse_layers
from trainrun.algorithms.gated_linear_units import GatedIntermediate, apply_glu
from trainrun.algorithms.low_precision_layernorm import LowPrecisionLayerNorm, replace_layer_norms
from trainrun.algorithms.seq_length_warmup import length_at
from trainrun.algorithms.specs import SPECS
from trainrun.algorithms.specs.alibi import AlibiConfig
from trainrun.algorithms.specs.gated_linear_units import GatedLinearUnitsConfig
from trainrun.algorithms.specs.seq_length_warmup import SeqLengthWarmupConfig
from trainrun.algorithms.specs.unpadding import UnpaddingConfig
from trainrun.core.events import Event
from trainrun.core.precision import Precision
from trainrun.data.masked_text import IGNORED, collate_masked
from trainrun.errors import ConfigError
from trainrun.models.alibi import alibi_slopes
from trainrun.models.bert import build_bert
from trainrun.optim.optimizers import build_optimizer
from trainrun.schema import BertConfig, OptimizerConfig
from trainrun.tasks.masked_lm import MaskedLanguageModeling


# ---------------------------------------------------------------------------------------- LAMB
def lamb_reference(weight, bias, grads, lr, beta1, beta2, eps, decay, max_norm):
    """MLPerf's reference LAMB, written out: global-norm clip, bias-corrected Adam direction plus
    decay, per-tensor trust ratio |w| / |u| (none, and no decay, for the bias)."""
    state = {"w": [torch.zeros_like(weight), torch.zeros_like(weight)], "b": [torch.zeros_like(bias)] * 2}
    w, b = weight.clone(), bias.clone()
    for step, (gw, gb) in enumerate(grads, start=1):
        norm = torch.sqrt(gw.pow(2).sum() + gb.pow(2).sum())
        scale = max(float(norm) / max_norm, 1.0)
        gw, gb = gw / scale, gb / scale
        for key, p, g, wd in (("w", w, gw, decay), ("b", b, gb, 0.0)):
            m, v = state[key]
            m = beta1 * m + (1 - beta1) * g
            v = beta2 * v + (1 - beta2) * g * g
            state[key] = [m, v]
            update = (m / (1 - beta1**step)) / ((v / (1 - beta2**step)).sqrt() + eps) + wd * p
            ratio = (p.norm() / update.norm()).item() if wd else 1.0
            p -= lr * ratio * update
    return w, b


def test_lamb_follows_the_mlperf_reference_step_by_step():
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    weight, bias = model.weight.detach().clone(), model.bias.detach().clone()
    config = OptimizerConfig(name="lamb", lr=0.01, betas=[0.9, 0.999], eps=1e-6, weight_decay=0.01)
    config.exclude_norm_and_bias, config.max_grad_norm = True, 1.0
    optimizer = build_optimizer(model, config, global_batch_size=256)
    grads = [(torch.randn(3, 4) * 3, torch.randn(3) * 3), (torch.randn(3, 4) * 0.01, torch.randn(3) * 0.01)]
    for gw, gb in grads:  # the first step's gradient norm is above 1 (clipped), the second's below
        model.weight.grad, model.bias.grad = gw.clone(), gb.clone()
        optimizer.step()
    expected_w, expected_b = lamb_reference(weight, bias, grads, 0.01, 0.9, 0.999, 1e-6, 0.01, 1.0)
    assert model.weight.shape == expected_w.shape and model.bias.shape == expected_b.shape
    assert torch.allclose(model.weight, expected_w, atol=1e-6)
    assert torch.allclose(model.bias, expected_b, atol=1e-6)


def test_lamb_recipe_values_are_the_reference_ones():
    from trainrun.config import compose
    from trainrun.validation import validate

    optimizer = validate(compose(["optimizer=lamb"]), files=False).optimizer
    assert (optimizer.lr, optimizer.betas, optimizer.eps, optimizer.weight_decay) == (4.25e-4, [0.9, 0.999], 1e-6, 0.01)
    assert optimizer.max_grad_norm == 1.0 and optimizer.exclude_norm_and_bias


# --------------------------------------------------------------------------- sequence-length warmup
@pytest.mark.parametrize(
    ("progress", "expected"),
    [
        (0.0, 8),
        (0.1, 8 + 8 * math.floor(0.1 / 0.3 * 15)),
        (0.2, 8 + 8 * 10),
        (0.29, 8 + 8 * 14),
        (0.3, 128),
        (1.0, 128),
    ],
)
def test_sequence_length_grows_in_steps_to_full_length_over_its_duration(progress, expected):
    config = SeqLengthWarmupConfig(duration=0.3, min_seq_length=8, max_seq_length=1024, step_size=8)
    assert length_at(progress, 128, config) == expected  # (128 - 8) // 8 = 15 increments
    assert length_at(progress, 64, config) <= 64


def test_sequence_length_warmup_counts_whole_increments_when_the_step_does_not_divide_the_range():
    """min 8, max 30, step 8: (30 - 8) // 8 = 2 whole increments (Composer's n_upd), so 8, 16 and
    24 tokens during warmup, and the full 30 from the end of warmup on (not 8 + 8·2 = 24)."""
    config = SeqLengthWarmupConfig(duration=0.5, min_seq_length=8, max_seq_length=30, step_size=8)
    lengths = [length_at(progress, 64, config) for progress in (0.0, 0.2, 0.25, 0.45, 0.5, 0.9)]
    assert lengths == [8, 8, 16, 16, 30, 30]  # at 45 %: floor(0.9 · 2) = 1 increment, not floor(0.9 · 2.75) = 2


def collated(lengths, predicted, width):
    """A loader's masked-LM batch: sequences of ``lengths`` real tokens, ``predicted`` positions each."""
    samples = []
    for row, (length, positions) in enumerate(zip(lengths, predicted, strict=True)):
        ids = torch.arange(width) + 100 * row
        chosen = torch.zeros(width, dtype=torch.bool)
        chosen[positions] = True
        samples.append(
            {
                "input_ids": ids,
                "attention_mask": (torch.arange(width) < length).long(),
                "labels": torch.where(chosen, ids + 1000, IGNORED),
                "predict_positions": torch.tensor(positions, dtype=torch.int64),
            }
        )
    return collate_masked(samples)


def test_sequence_length_warmup_cuts_inputs_and_targets_alike_and_drops_predictions_cut_off():
    (warmup,) = build_algorithms({"seq_length_warmup": SeqLengthWarmupConfig(duration=0.5, step_size=4)})
    batch = collated([32, 12], [[3, 19, 20, 25], [5]], width=32)  # 20 is the first position cut off
    inputs, targets, _ = MaskedLanguageModeling().batch(batch, SimpleNamespace(device=torch.device("cpu")))
    state = SimpleNamespace(inputs=inputs, targets=targets, progress=0.25, task=MaskedLanguageModeling())
    warmup.apply(Event.AFTER_DATALOADER, state)
    length = 8 + 4 * math.floor(0.25 / 0.5 * ((32 - 8) // 4))  # 20
    ids = batch["input_ids"]
    assert state.inputs["input_ids"].shape == state.targets["labels"].shape == (2, length)
    assert torch.equal(state.inputs["input_ids"], ids[:, :length])
    assert torch.equal(state.inputs["attention_mask"], batch["attention_mask"][:, :length])
    assert torch.equal(state.targets["labels"], batch["labels"][:, :length])
    assert state.inputs["lengths"].tolist() == [20, 12]  # per sequence: clamped, not cut
    assert state.inputs["predict_positions"].tolist() == [[3, 19, 0, 0], [5, 0, 0, 0]]  # 20 and 25 are cut off
    assert state.targets["predicted"].tolist() == [[1003, 1019, IGNORED, IGNORED], [1105] + [IGNORED] * 3]
    assert state.inputs["predict_counts"].tolist() == state.targets["counts"].tolist() == [4, 1]  # host: kept


def test_the_loader_sends_real_token_and_prediction_counts_and_the_predicted_slots():
    from trainrun.data.masked_text import predicted_slots

    batch = collated([6, 10, 3], [[1, 4], list(range(1, 10)), []], width=12)
    assert batch["lengths"].tolist() == [6, 10, 3] and batch["predict_counts"].tolist() == [2, 9, 0]
    assert batch["predict_positions"].shape == batch["predicted_labels"].shape == (3, 9)  # the batch's most
    assert batch["predict_positions"][0].tolist() == [1, 4] + [0] * 7
    assert batch["predicted_labels"][0].tolist() == [1001, 1004] + [IGNORED] * 7
    assert batch["predicted_labels"][1].tolist() == [1101 + k for k in range(9)]
    assert (batch["predicted_labels"][2] == IGNORED).all()
    slots = predicted_slots(batch["predict_counts"], 9, torch.device("cpu"))
    assert slots.tolist() == [0, 1] + [9 + k for k in range(9)]  # row-major, the real slots only
    assert (batch["predicted_labels"].flatten()[slots] != IGNORED).all()
    nothing = collated([4, 3], [[], []], width=8)  # no prediction in the batch: one slot, unscored
    assert nothing["predict_positions"].shape == (2, 1) and (nothing["predicted_labels"] == IGNORED).all()


# ---------------------------------------------------------------------------------- gated linear units
def tiny_bert(layers=2):
    config = BertConfig(layers=layers, hidden_size=16, heads=2, intermediate_size=32)
    config.hidden_dropout = config.attention_dropout = 0.0
    return build_bert(config, vocab_size=50)


def test_glu_makes_each_feed_forward_act_of_gate_times_value_and_adds_its_parameters():
    torch.manual_seed(0)
    model = tiny_bert()
    before = sum(p.numel() for p in model.parameters())
    assert apply_glu(model, GatedLinearUnitsConfig(), std=0.02) == 2
    layer = model.bert.bert.encoder.layer[0]
    assert isinstance(layer.intermediate, GatedIntermediate) and layer.intermediate.gated.bias is None
    x = torch.randn(3, 5, 16)
    gate, value = layer.intermediate.gated.weight, layer.intermediate.non_gated.weight
    expected = F.gelu(x @ gate.T) * (x @ value.T)  # BERT's activation is exact (erf) GELU
    assert layer.intermediate(x).shape == expected.shape and torch.allclose(layer.intermediate(x), expected, atol=1e-6)
    # per layer: W_i (16x32) and its bias (32) become W_g and W_v (16x32 each, no bias)
    assert sum(p.numel() for p in model.parameters()) - before == 2 * (16 * 32 - 32)
    assert 0.015 < float(gate.detach().std()) < 0.025
    logits = model({"input_ids": torch.randint(0, 50, (2, 7)), "attention_mask": torch.ones(2, 7, dtype=torch.long)})
    assert logits.shape == (2, 7, 50)


def init_state(model, precision="bf16"):
    """A State at INIT whose raw model is ``model``; its notices collect what an algorithm says."""
    state = make_state(model)
    state.precision = Precision(precision, "cpu", torch.bfloat16 if precision == "bf16" else None)
    return state


def said(state, level):
    return [notice["text"] for notice in state.notices if notice["level"] == level]


def test_the_glu_algorithm_initialises_as_the_model_does_with_the_biases_asked_for():
    torch.manual_seed(0)
    model = tiny_bert()
    model.bert.config.initializer_range = 0.2  # the model's own init std, not BERT's default 0.02
    config = GatedLinearUnitsConfig(gated_layer_bias=True, non_gated_layer_bias=True)
    (glu,) = build_algorithms({"gated_linear_units": config})
    state = init_state(model)
    glu.apply(Event.INIT, state)
    intermediates = [layer.intermediate for layer in model.bert.bert.encoder.layer]
    assert all(isinstance(m, GatedIntermediate) for m in intermediates) and said(state, "warning") == []
    weights = torch.cat(
        [m.gated.weight.flatten() for m in intermediates] + [m.non_gated.weight.flatten() for m in intermediates]
    )
    assert 0.18 < float(weights.detach().std()) < 0.22
    for module in intermediates:
        assert module.gated.bias.shape == module.non_gated.bias.shape == (32,)
        assert not module.gated.bias.any() and not module.non_gated.bias.any()
    only_gated = tiny_bert(layers=1)
    apply_glu(only_gated, GatedLinearUnitsConfig(gated_layer_bias=True), std=0.02)
    intermediate = only_gated.bert.bert.encoder.layer[0].intermediate
    assert intermediate.gated.bias is not None and intermediate.non_gated.bias is None
    unconfigured = nn.Sequential(nn.Linear(16, 16))
    unconfigured[0].dense, unconfigured[0].intermediate_act_fn = nn.Linear(16, 64), F.gelu  # no config anywhere
    glu.apply(Event.INIT, init_state(unconfigured))
    assert 0.018 < float(unconfigured[0].gated.weight.detach().std()) < 0.022  # BERT's 0.02
    state = init_state(nn.Linear(2, 2))
    glu.apply(Event.INIT, state)
    assert said(state, "warning") == [
        "gated_linear_units: the model has no transformer feed-forward layers; nothing changed"
    ]


def test_model_surgery_builds_new_layers_on_the_models_device_and_in_its_dtype():
    """On the meta device (as a GPU would show): the GLU and the low-precision LayerNorms stay with the model."""
    with torch.device("meta"):
        model = tiny_bert(layers=1)
    apply_glu(model.to(torch.bfloat16), GatedLinearUnitsConfig(), std=0.02)
    replace_layer_norms(model)
    layer = model.bert.bert.encoder.layer[0]
    assert {(p.device.type, p.dtype) for p in layer.intermediate.parameters()} == {("meta", torch.bfloat16)}
    assert {p.device.type for m in model.modules() if isinstance(m, LowPrecisionLayerNorm) for p in m.parameters()} == {
        "meta"
    }


# ------------------------------------------------------------------------------ low-precision LayerNorm
def test_low_precision_layernorm_computes_in_the_autocast_dtype_and_is_plain_layernorm_without():
    torch.manual_seed(0)
    model = tiny_bert(layers=1)
    norms = [m for m in model.modules() if isinstance(m, nn.LayerNorm)]
    assert replace_layer_norms(model) == len(norms) == 4  # embeddings, attention, output, head
    norm = next(m for m in model.modules() if isinstance(m, LowPrecisionLayerNorm))
    nn.init.normal_(norm.weight)
    x = torch.randn(4, 16) * 3 + 1
    plain = F.layer_norm(x, (16,), norm.weight, norm.bias, norm.eps)
    assert torch.equal(norm(x), plain)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = norm(x)
        fp32 = nn.LayerNorm.forward(norm, x)  # what autocast does with a LayerNorm: fp32 out
    expected = F.layer_norm(x.bfloat16(), (16,), norm.weight.bfloat16(), norm.bias.bfloat16(), norm.eps)
    assert low.dtype == torch.bfloat16 and fp32.dtype == torch.float32
    assert low.shape == expected.shape and torch.equal(low, expected)


def test_low_precision_layernorm_keeps_eps_bias_and_the_affine_setting_and_normalises_with_autocast_off(monkeypatch):
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.LayerNorm(8, eps=0.5), nn.LayerNorm(8, elementwise_affine=False), nn.LayerNorm(8, bias=False)
    )
    nn.init.normal_(model[0].weight), nn.init.normal_(model[0].bias)
    assert replace_layer_norms(model) == 3
    wide_eps, no_affine, no_bias = model
    assert wide_eps.eps == 0.5 and no_affine.weight is None and no_affine.bias is None and no_bias.bias is None
    assert no_bias.weight is not None and no_affine.eps == 1e-5
    x = torch.randn(4, 8) * 0.3
    autocast_during_norm = []
    layer_norm = F.layer_norm

    def recording(*args, **kwargs):
        autocast_during_norm.append(torch.is_autocast_enabled("cpu"))
        return layer_norm(*args, **kwargs)

    monkeypatch.setattr(F, "layer_norm", recording)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        outputs = [norm(x) for norm in model]
    assert autocast_during_norm == [False] * 3  # on CUDA autocast would run layer_norm in fp32 again
    low = x.bfloat16()
    expected = [
        layer_norm(low, (8,), wide_eps.weight.bfloat16(), wide_eps.bias.bfloat16(), 0.5),
        layer_norm(low, (8,), None, None, 1e-5),
        layer_norm(low, (8,), no_bias.weight.bfloat16(), None, 1e-5),
    ]
    for got, want in zip(outputs, expected, strict=True):
        assert got.dtype == torch.bfloat16 and got.shape == want.shape and torch.equal(got, want)


def test_the_low_precision_layernorm_algorithm_says_when_it_changes_nothing():
    (algorithm,) = build_algorithms({"low_precision_layernorm": SPECS["low_precision_layernorm"].config()})
    state = init_state(tiny_bert(layers=1), "bf16")
    algorithm.apply(Event.INIT, state)
    assert isinstance(state.raw_model.bert.bert.embeddings.LayerNorm, LowPrecisionLayerNorm)
    assert state.notices == []
    state = init_state(tiny_bert(layers=1), "fp32")
    algorithm.apply(Event.INIT, state)
    assert said(state, "note") == ["low_precision_layernorm has no effect at precision=fp32 (it acts under autocast)"]
    state = init_state(nn.Linear(2, 2))
    algorithm.apply(Event.INIT, state)
    assert said(state, "warning") == ["low_precision_layernorm: the model has no LayerNorm; nothing changed"]


@pytest.mark.slow
def test_a_tiny_bert_trains_with_every_language_method_and_lamb(tmp_path):
    run_dir = tmp_path / "run"
    args = [
        "task=masked_lm",
        "data=stdlib_docs",
        "model=bert_tiny",
        "data.text.max_seq_len=32",
        "data.text.packing=pack",
    ]
    args += ["optimizer=lamb", "optimizer.lr=2e-3", "train_batch_size=32", "max_duration=40ba", "eval_interval=20ba"]
    args += ["precision=bf16", "scheduler.t_warmup=0.1dur", "data.num_samples=2048"]
    language = "seq_length_warmup,alibi,unpadding,gated_linear_units,low_precision_layernorm,masked_head,fused_layers"
    args += [f"algorithms=[{language}]"]
    args += ["algorithms.seq_length_warmup.min_seq_length=16", "algorithms.seq_length_warmup.step_size=8"]
    result = run_here(*args, "progress=false", f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.stderr
    first, last = read_metrics(run_dir)
    assert last["eval_loss"] < first["eval_loss"]


# ---------------------------------------------------------------------------------------------- ALiBi
def test_alibi_slopes_follow_press_et_al_for_any_number_of_heads():
    assert torch.allclose(alibi_slopes(8), torch.tensor([2.0**-k for k in range(1, 9)]))
    assert torch.allclose(alibi_slopes(16), torch.tensor([2 ** (-0.5 * k) for k in range(1, 17)]))
    twelve = [2.0**-k for k in range(1, 9)] + [2**-0.5, 2**-1.5, 2**-2.5, 2**-3.5]
    assert torch.allclose(alibi_slopes(12), torch.tensor(twelve))

    def press(n):  # the paper's reference code: power-of-two sets, then every other slope of the next set
        def power_of_two(p):
            start = 2 ** (-(2 ** -(math.log2(p) - 3)))
            return [start * start**i for i in range(p)]

        if math.log2(n).is_integer():
            return power_of_two(n)
        closest = 2 ** math.floor(math.log2(n))
        return power_of_two(closest) + press(2 * closest)[0::2][: n - closest]

    for heads in (1, 2, 3, 5, 6, 7, 12, 16, 20, 24):
        assert alibi_slopes(heads).shape == (heads,)
        assert torch.allclose(alibi_slopes(heads), torch.tensor(press(heads))), heads


def test_alibi_biases_attention_by_distance_and_drops_learned_positions(monkeypatch):
    torch.manual_seed(0)
    model = tiny_bert(layers=1)
    (alibi,) = build_algorithms({"alibi": AlibiConfig(max_sequence_length=64)})
    alibi.apply(Event.INIT, SimpleNamespace(raw_model=model))
    positions = model.bert.bert.embeddings.position_embeddings
    assert positions.weight.shape == (64, 16) and not positions.weight.requires_grad and not positions.weight.any()
    assert "alibi_slopes" in dict(model.named_buffers())  # moved to the device with the model, not saved
    masks = []
    sdpa = F.scaled_dot_product_attention

    def recording(*args, **kwargs):
        masks.append(kwargs.get("attn_mask"))
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording)
    attention = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    model({"input_ids": torch.randint(0, 50, (2, 5)), "attention_mask": attention})
    slopes = torch.tensor([2.0**-4, 2.0**-8])  # two heads: 2^(-8k/2)
    distance = (torch.arange(5)[:, None] - torch.arange(5)[None, :]).abs()
    expected = -slopes[None, :, None, None] * distance  # (1, heads, query, key)
    expected = expected + torch.where(attention[:, None, None, :] == 1, 0.0, torch.finfo(torch.float32).min)
    assert masks and masks[0].shape == expected.shape == (2, 2, 5, 5)
    assert torch.allclose(masks[0], expected)


def test_alibi_keeps_the_checkpoint_keys_and_the_models_device_and_refuses_other_models():
    model = tiny_bert(layers=1)
    keys = set(model.state_dict())
    (alibi,) = build_algorithms({"alibi": AlibiConfig(max_sequence_length=64)})
    alibi.apply(Event.INIT, SimpleNamespace(raw_model=model))
    assert set(model.state_dict()) == keys  # position and segment ids are not saved, as before
    embeddings = model.bert.bert.embeddings
    assert torch.equal(embeddings.position_ids, torch.arange(64)[None]) and embeddings.token_type_ids.shape == (1, 64)
    with torch.device("meta"):  # as a model already on a GPU
        on_device = tiny_bert(layers=1)
    alibi.apply(Event.INIT, SimpleNamespace(raw_model=on_device))
    embeddings = on_device.bert.bert.embeddings
    assert {embeddings.position_embeddings.weight.device.type, embeddings.position_ids.device.type} == {"meta"}
    with pytest.raises(
        ConfigError, match=r"^algorithm 'alibi' needs trainrun's BERT or GPT \(model=bert_\*, gpt\*\), not Linear$"
    ):
        alibi.apply(Event.INIT, SimpleNamespace(raw_model=nn.Linear(2, 2)))


def test_alibi_runs_sequences_longer_than_the_learned_positions_allowed():
    config = BertConfig(layers=1, hidden_size=16, heads=2, intermediate_size=32)
    config.max_position_embeddings = 16
    model = build_bert(config, vocab_size=50)
    long = {"input_ids": torch.randint(0, 50, (1, 40)), "attention_mask": torch.ones(1, 40, dtype=torch.long)}
    with pytest.raises((IndexError, RuntimeError)):
        model(long)
    build_algorithms({"alibi": AlibiConfig(max_sequence_length=64)})[0].apply(
        Event.INIT, SimpleNamespace(raw_model=model)
    )
    assert model(long).shape == (1, 40, 50)


# ------------------------------------------------------------------------------------------ unpadding
def test_unpadding_gives_the_padded_outputs_and_gradients_for_the_real_tokens_work_only():
    """Every per-token matrix product of the encoder runs on the real rows: (B·S − nnz) rows of
    Q, K, V, attention-output (4·2·D²) and feed-forward (2·2·D·F) FLOPs fewer per layer."""
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    model = tiny_bert(layers=2)
    lengths = torch.tensor([7, 3, 5, 1])
    mask = (torch.arange(7)[None, :] < lengths[:, None]).long()
    inputs = {"input_ids": torch.randint(0, 50, (4, 7)), "attention_mask": mask}
    results = []
    for unpad in (False, True):
        model.unpad = unpad
        model.zero_grad()
        with FlopCounterMode(display=False) as flops:
            logits = model(inputs)
        real = mask.bool()
        logits[real].sum().backward()
        results.append((logits[real].detach(), [p.grad.clone() for p in model.parameters()], flops.get_total_flops()))
    (padded, padded_grads, padded_flops), (unpadded, unpadded_grads, unpadded_flops) = results
    assert padded.shape == unpadded.shape == (16, 50)
    assert torch.allclose(padded, unpadded, atol=1e-5)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(padded_grads, unpadded_grads, strict=True))
    hidden, width, layers, pads = 16, 32, 2, 4 * 7 - 16
    assert padded_flops - unpadded_flops == layers * pads * (4 * 2 * hidden * hidden + 2 * 2 * hidden * width)


def test_the_unpadding_algorithm_switches_trainruns_bert_and_refuses_other_models():
    model = tiny_bert(layers=1)
    (unpadding,) = build_algorithms({"unpadding": UnpaddingConfig()})
    assert not model.unpad
    unpadding.apply(Event.INIT, SimpleNamespace(raw_model=model))
    assert model.unpad is True
    with pytest.raises(
        ConfigError, match=r"^algorithm 'unpadding' needs trainrun's BERT \(model=bert_\*\), not Linear$"
    ):
        unpadding.apply(Event.INIT, SimpleNamespace(raw_model=nn.Linear(2, 2)))


def test_unpadding_composes_with_the_masked_head_and_alibi():
    torch.manual_seed(0)
    model = tiny_bert(layers=1)
    build_algorithms({"alibi": AlibiConfig(max_sequence_length=32)})[0].apply(
        Event.INIT, SimpleNamespace(raw_model=model)
    )
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]])
    positions = torch.tensor([[1, 3, 0, 0], [0, 5, 0, 0]])  # the last two slots of each row are padding
    inputs = {"input_ids": torch.randint(0, 50, (2, 6)), "attention_mask": mask, "predict_positions": positions}
    full = model(inputs)  # training, no masked_head: every position
    model.masked_head = True
    padded = model(inputs)
    model.unpad = True
    unpadded = model(inputs)
    assert full.shape == (2, 6, 50) and padded.shape == unpadded.shape == (8, 50)
    expected = full[torch.arange(2)[:, None], positions].flatten(0, 1)
    assert torch.allclose(padded, expected, atol=1e-5) and torch.allclose(unpadded, expected, atol=1e-5)


# --------------------------------------------------------------------------------------- fused layers
def test_fused_layers_compile_each_layers_blocks_once_for_any_token_count_with_the_eager_numbers():
    """Three blocks a layer; the layers share their compiled code; unpadded batches of other token
    counts run without recompiling; outputs and gradients are eager's up to float rounding."""
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    eager = tiny_bert(layers=2)
    fused = copy.deepcopy(eager)
    apply_glu(fused, GatedLinearUnitsConfig(), std=0.02)  # what fused_layers compiles is the block as surgery left it
    apply_glu(eager, GatedLinearUnitsConfig(), std=0.02)
    fused.load_state_dict(eager.state_dict())
    assert fuse_layers(fused) == 3 * 2
    torch._dynamo.reset()
    counters.clear()
    graphs = []
    for lengths in ([3, 12, 7], [5, 9, 2], [12, 12, 1, 4]):
        mask = (torch.arange(12)[None] < torch.tensor(lengths)[:, None]).long()
        inputs = {"input_ids": torch.randint(5, 50, (len(lengths), 12)) * mask, "attention_mask": mask}
        results = []
        for model in (eager, fused):
            model.unpad = True
            model.zero_grad()
            logits = model(inputs)
            logits.square().mean().backward()
            results.append((logits, [p.grad for p in model.parameters()]))
        (expected, expected_grads), (got, got_grads) = results
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
        for a, b in zip(got_grads, expected_grads, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
        graphs.append(counters["stats"]["unique_graphs"])
    assert graphs == [3, 3, 3]  # attention output, GLU, output: once, for both layers and all lengths
    assert fused.state_dict().keys() == eager.state_dict().keys()


def test_the_fused_layers_algorithm_compiles_each_layer_and_warns_on_a_model_without_any():
    (fused,) = build_algorithms({"fused_layers": SPECS["fused_layers"].config()})
    state = init_state(tiny_bert(layers=2))
    fused.apply(Event.INIT, state)
    layer = state.raw_model.bert.bert.encoder.layer[1]
    assert said(state, "warning") == [] and layer.output._compiled_call_impl is not None  # compiled in place, lazily
    state = init_state(nn.Linear(2, 2))
    fused.apply(Event.INIT, state)
    assert said(state, "warning") == ["fused_layers: the model has no transformer encoder layers; nothing changed"]


# ------------------------------------------------------------------------------------ attention kernel
@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_the_attention_kernel_reported_is_one_that_runs_the_models_attention(dropout):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.manual_seed(0)
    model = tiny_bert(layers=1)
    model.bert.base_model.encoder.layer[0].attention.self.dropout.p = dropout
    report = model.attention_kernels(12, torch.float32, torch.device("cpu"))
    assert report.startswith("scaled_dot_product_attention (") and report.endswith(
        ") on batches padded to their length"
    )
    kernel = report.split("(")[1].split(")")[0]
    mask = (torch.arange(12)[None] < torch.tensor([12, 5])[:, None]).long()
    inputs = {"input_ids": torch.randint(5, 50, (2, 12)) * mask, "attention_mask": mask}
    name = "MATH" if kernel == "math" else f"{kernel.upper()}_ATTENTION"
    for unpad in (False, True):
        model.unpad = unpad
        with sdpa_kernel([SDPBackend.__members__[name]]):  # SDPA raises if the kernel cannot run these inputs
            model.train()(inputs).sum().backward()
    assert ("math" in report) == (dropout > 0)  # torch's CPU Flash kernel has no dropout
