"""Causal language modelling: the GPT's switches by numbers, causal masking, token windows with
document separators, the task's shift and sums, and a real run whose quality is a loss."""

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import resume_after_step_6, run_here

from trainrun.config import compose
from trainrun.data.causal_text import TokenWindows
from trainrun.errors import ConfigError, DataError
from trainrun.kinds import task_spec
from trainrun.models.gpt import (
    GPT,
    Attend,
    apply_rotary,
    document_ids,
    padded_vocabulary,
    rotary_tables,
    value_tables,
    visible_keys,
)
from trainrun.registry import builder, names
from trainrun.schema import GPTConfig
from trainrun.tasks.causal_lm import CausalLanguageModeling, NextTokenEvaluator, next_token_cross_entropy
from trainrun.validation import validate

SEPARATOR = 7


def gpt(**switches) -> GPT:
    torch.manual_seed(0)
    return GPT(
        GPTConfig(**{"layers": 2, "heads": 2, "width": 16, "max_seq_len": 12, **switches}),
        vocab_size=50,
        separator=SEPARATOR,
    ).eval()


def test_rotary_turns_each_pair_by_position_times_its_frequency():
    cos, sin = rotary_tables(5, 4, base=100.0)
    x = torch.randn(1, 1, 5, 4)
    rotated = apply_rotary(x, cos, sin)
    for p in range(5):
        for i in range(2):  # pairs (x_i, x_{i+2}), frequency 100^(-2i/4)
            angle = p * 100.0 ** (-2 * i / 4)
            a, b = x[0, 0, p, i].item(), x[0, 0, p, i + 2].item()
            expected = (a * math.cos(angle) - b * math.sin(angle), a * math.sin(angle) + b * math.cos(angle))
            assert rotated[0, 0, p, i].item() == pytest.approx(expected[0], abs=1e-5)
            assert rotated[0, 0, p, i + 2].item() == pytest.approx(expected[1], abs=1e-5)


def test_value_embeddings_mix_each_tables_token_rows_into_the_values_of_the_first_and_last_blocks(monkeypatch):
    assert value_tables(3, 12) == [0, 1, 2, None, None, None, None, None, None, 0, 1, 2]  # the speedrun's
    assert value_tables(1, 2) == [0, 0] and value_tables(0, 3) == [None] * 3
    model = gpt(layers=3, value_embeddings=1)
    assert len(model.value_embeds) == 1 and model.value_embeds[0].weight.shape == (64, 16)
    mixes = [block.attention.value_mix for block in model.blocks]
    assert mixes[1] is None and all(torch.equal(mix, torch.tensor([0.5, 0.5])) for mix in (mixes[0], mixes[2]))
    # by hand, in block 0: v = 0.3 · (x W_v) + 0.9 · table[token], split into heads as the projection is
    attention, tokens = model.blocks[0].attention, torch.randperm(50)[:10].view(2, 5)
    mixes[0].data = torch.tensor([0.3, 0.9])
    x, table = torch.randn(2, 5, 16), model.value_embeds[0](tokens)
    values = []
    attend = F.scaled_dot_product_attention
    monkeypatch.setattr(
        F, "scaled_dot_product_attention", lambda q, k, v, **kw: values.append(v) or attend(q, k, v, **kw)
    )
    attention(x, None, Attend(), table)
    monkeypatch.undo()
    plain = (x @ attention.qkv.weight[32:].T).view(2, 5, 2, 8).transpose(1, 2)
    torch.testing.assert_close(values[0], 0.3 * plain + 0.9 * table.view(2, 5, 2, 8).transpose(1, 2))
    # a token's row changes its own position's logits and later ones, never earlier ones (distinct tokens)
    before = model(tokens)
    model.value_embeds[0].weight.data[tokens[0, 3]] += 1.0
    after = model(tokens)
    assert torch.equal(before[0, :3], after[0, :3]) and not torch.allclose(before[0, 3], after[0, 3])
    assert torch.equal(before[1], after[1])  # the other sequence does not have that token


@pytest.mark.parametrize("positions", ["learned", "rotary", "alibi"])
def test_no_position_sees_a_later_token(positions):
    model, tokens = gpt(positions=positions), torch.randint(0, 50, (2, 10))
    changed = tokens.clone()
    changed[:, 6:] = (changed[:, 6:] + 1) % 50
    before, after = model(tokens), model(changed)
    assert torch.equal(before[:, :6], after[:, :6]) and not torch.allclose(before[:, 6:], after[:, 6:])


def test_documents_end_at_their_separator_and_masks_keep_to_the_document_and_window():
    tokens = torch.tensor([[1, 7, 2, 3, 7, 4]])
    assert document_ids(tokens, 7).tolist() == [[0, 0, 1, 1, 1, 2]]  # a separator ends its document
    visible = visible_keys(6, 2, document_ids(tokens, 7), torch.device("cpu"))[0, 0].int().tolist()
    assert visible == [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [0, 0, 1, 0, 0, 0],  # a new document: not its predecessor's separator
        [0, 0, 1, 1, 0, 0],
        [0, 0, 0, 1, 1, 0],  # window 2: itself and one back (2 is in its document but too far)
        [0, 0, 0, 0, 0, 1],
    ]
    assert visible_keys(3, None, None, torch.device("cpu")).shape == (1, 1, 3, 3)  # one mask for every window


@pytest.mark.parametrize("positions", ["learned", "rotary", "alibi"])
def test_no_token_sees_another_document_or_past_its_window(positions):
    tokens = torch.randint(8, 50, (2, 12))
    tokens[:, 4] = SEPARATOR  # documents 0-4 and 5-11
    changed = tokens.clone()
    changed[:, 2] = torch.where(tokens[:, 2] == 8, 9, 8)  # another ordinary token, inside the first document
    masked, plain = gpt(positions=positions, document_mask=True), gpt(positions=positions)
    assert torch.equal(masked(tokens)[:, 5:], masked(changed)[:, 5:])  # the second document never sees it
    assert not torch.allclose(plain(tokens)[:, 5:], plain(changed)[:, 5:])
    assert not torch.allclose(masked(tokens)[:, 2:5], masked(changed)[:, 2:5])
    # window 3 over 2 layers: a token reaches at most 2 x (3 - 1) = 4 positions ahead
    windowed = gpt(positions=positions, window=3)
    before, after = windowed(tokens), windowed(changed)
    assert not torch.allclose(before[:, 6], after[:, 6]) and torch.equal(before[:, 7:], after[:, 7:])


@pytest.mark.parametrize("positions", ["learned", "alibi"])
def test_flex_attention_attends_as_the_written_out_mask(positions):
    """The GPU's path (FlexAttention's block mask and ALiBi score modification), run here uncompiled,
    gives the CPU's SDPA path's attention."""
    model = gpt(positions=positions, document_mask=True, window=4)
    tokens = torch.randint(8, 50, (2, 10))
    tokens[0, 3], tokens[1, 6] = SEPARATOR, SEPARATOR
    x, attention = torch.randn(2, 10, 16), model.blocks[0].attention
    with torch.no_grad():  # uncompiled FlexAttention has no backward on a CPU
        written_out, flex = (
            attention(x, None, model.attend(tokens, flex=False)),
            attention(x, None, model.attend(tokens, flex=True)),
        )
    torch.testing.assert_close(flex, written_out, rtol=1e-5, atol=1e-6)
    assert model.attend(tokens, flex=True).block_mask is not None and model.attend(tokens, flex=False).mask is not None


@pytest.mark.parametrize("window", [None, 64, 200, 300])
def test_the_block_mask_from_document_boundaries_is_the_one_the_rule_gives_at_every_query_and_key(window):
    """Built from each block's first and last document (no batch x length x length pass), the block
    mask sorts blocks as create_block_mask, which evaluates the rule everywhere, does: the same blocks
    skipped, the same run without the mask, the same partly masked; 300 tokens: a partial last block."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from trainrun.models.gpt import document_ids, flex_attend

    tokens = torch.randint(8, 50, (3, 300))
    tokens[0, [5, 127, 128, 250]] = SEPARATOR  # window 0: documents ending inside and at block edges
    tokens[1, 140] = SEPARATOR  # window 1: two documents; window 2: one
    documents = document_ids(tokens, SEPARATOR)
    ours = flex_attend(300, None if window is None else torch.tensor(float(window)), documents, None, tokens.device)
    rule = ours.block_mask.mask_mod
    reference = create_block_mask(rule, 3, None, 300, 300, device="cpu")
    for name in ("kv_num_blocks", "full_kv_num_blocks"):
        assert torch.equal(getattr(ours.block_mask, name), getattr(reference, name)), name
    assert torch.equal(ours.block_mask.to_dense(), reference.to_dense())
    q = k = v = torch.randn(3, 2, 300, 8)
    written_out = visible_keys_mask(300, window, documents)
    torch.testing.assert_close(
        flex_attention(q, k, v, block_mask=ours.block_mask),
        F.scaled_dot_product_attention(q, k, v, attn_mask=written_out),
        rtol=1e-5,
        atol=1e-5,
    )


def visible_keys_mask(length: int, window: int | None, documents: torch.Tensor) -> torch.Tensor:
    from trainrun.models.gpt import visible_keys

    return visible_keys(length, window, documents, documents.device)


def test_alibi_biases_each_heads_scores_by_its_slope_times_the_distance_back():
    model = gpt(positions="alibi")
    assert model.positions is None and model.alibi_slopes.tolist() == [2**-4, 2**-8]  # 2^(-8h/2), h = 1, 2
    bias = model.causal_bias(4)
    for h, slope in enumerate((2**-4, 2**-8)):
        for i in range(4):
            for j in range(4):
                assert bias[h, i, j].item() == (-slope * (i - j) if j <= i else float("-inf"))
    tokens = torch.randint(0, 50, (2, 30))  # longer than max_seq_len 12: ALiBi has no position table
    assert model(tokens).shape == (2, 30, 50)
    model.alibi_slopes = torch.zeros(2)  # no bias: plain causal attention without positions
    plain = gpt(positions="rotary")
    plain.load_state_dict(model.state_dict(), strict=False)
    plain.config.positions = "none"  # neither rotary nor a table
    torch.testing.assert_close(model(tokens), plain(tokens), rtol=1e-5, atol=1e-6)


def test_the_alibi_method_turns_a_gpt_to_alibi_and_splits_training_sequences():
    from trainrun.algorithms.alibi import Alibi
    from trainrun.algorithms.specs.alibi import AlibiConfig
    from trainrun.core.events import Event

    model, task = gpt(), CausalLanguageModeling()
    method = Alibi(AlibiConfig(train_sequence_length_scaling=0.25))
    windows = torch.arange(2 * 17).view(2, 17)
    state = SimpleNamespace(raw_model=model, task=task, inputs=windows[:, :-1], targets=windows[:, 1:])
    method.apply(Event.INIT, state)
    assert model.positions is None and model.alibi_slopes is not None
    method.apply(Event.AFTER_DATALOADER, state)
    assert state.inputs.tolist() == [list(range(s, s + 4)) for s in (0, 4, 8, 12, 17, 21, 25, 29)]
    assert torch.equal(state.targets, state.inputs + 1)  # every piece scored on its own next tokens
    inputs, targets = windows[:, :-1], windows[:, 1:]
    whole = SimpleNamespace(task=SimpleNamespace(sequence_length=task.sequence_length), inputs=inputs, targets=targets)
    Alibi(AlibiConfig()).apply(Event.AFTER_DATALOADER, whole)  # a task without split (masked LM): never called
    assert whole.inputs is inputs and whole.targets is targets  # scaling 1: untouched
    uneven = SimpleNamespace(task=task, inputs=torch.arange(18)[None], targets=torch.arange(1, 19)[None])
    method.apply(Event.AFTER_DATALOADER, uneven)  # round(18 · 0.25) = 4: four pieces, the last 2 tokens left out
    assert uneven.inputs.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    short = SimpleNamespace(task=task, inputs=torch.arange(2)[None], targets=torch.arange(1, 3)[None])
    Alibi(AlibiConfig(train_sequence_length_scaling=0.2)).apply(Event.AFTER_DATALOADER, short)
    assert short.inputs.tolist() == [[0], [1]]  # round(0.4) = 0: pieces of at least one token


def test_sequence_length_warmup_cuts_causal_windows_to_their_first_tokens():
    from types import SimpleNamespace

    from trainrun.algorithms.seq_length_warmup import SeqLengthWarmup
    from trainrun.algorithms.specs.seq_length_warmup import SeqLengthWarmupConfig
    from trainrun.core.events import Event

    windows = torch.arange(2 * 65).view(2, 65)
    state = SimpleNamespace(
        task=CausalLanguageModeling(), inputs=windows[:, :-1], targets=windows[:, 1:], progress=0.15
    )
    SeqLengthWarmup(SeqLengthWarmupConfig(duration=0.3, min_seq_length=8, step_size=8)).apply(
        Event.AFTER_DATALOADER, state
    )
    # half-way through the warmup: 8 + 8 · floor(0.5 · (64 - 8) / 8) = 32 tokens
    assert torch.equal(state.inputs, windows[:, :32]) and torch.equal(state.targets, windows[:, 1:33])


def test_softcap_bounds_logits_as_c_tanh_of_the_raw_ones():
    raw, capped = gpt(), gpt(logit_softcap=2.0)
    tokens = torch.randint(0, 50, (1, 8))
    torch.testing.assert_close(capped(tokens), 2.0 * torch.tanh(raw(tokens) / 2.0))
    assert capped(tokens).shape == (1, 8, 50)  # the padded vocabulary cut back to the store's


def test_relu_squared_mlp_zero_init_and_residual_init():
    model = gpt(mlp="relu2", zero_init=True)
    mlp = model.blocks[0].mlp
    x = torch.randn(3, 16)
    torch.testing.assert_close(mlp(x), mlp.proj(F.relu(mlp.up(x)).square()))
    assert all(not block.attention.proj.weight.any() and not block.mlp.proj.weight.any() for block in model.blocks)
    assert model.head.weight.any()  # tied: the head is the token table, not zeroed
    assert not gpt(zero_init=True, tie_head=False).head.weight.any()
    torch.manual_seed(0)
    wide = GPT(GPTConfig(layers=8, heads=4, width=256, max_seq_len=8), vocab_size=64)
    assert wide.blocks[0].mlp.proj.weight.std().item() == pytest.approx(0.02 / math.sqrt(16), rel=0.05)
    assert wide.blocks[0].mlp.up.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert wide.head.weight is wide.embed.weight and wide.embed.weight.shape[0] == padded_vocabulary(64) == 64
    assert padded_vocabulary(50257) == 50304  # nanoGPT's GPT-2 vocabulary


def test_qk_norm_makes_attention_blind_to_the_scale_of_queries_and_keys():
    model, tokens = gpt(qk_norm=True, norm="rmsnorm"), torch.randint(0, 50, (1, 8))
    before = model(tokens)
    with torch.no_grad():
        for block in model.blocks:
            block.attention.qkv.weight[:32] *= 7.0  # the query and key rows
    torch.testing.assert_close(model(tokens), before, rtol=1e-4, atol=1e-5)
    plain = gpt()
    with torch.no_grad():
        plain.blocks[0].attention.qkv.weight[:32] *= 7.0
    assert not torch.allclose(plain(tokens), gpt()(tokens), atol=1e-3)  # without it the scale matters


class Store:
    """A token store's parts the windows read: documents [1 2 3] and [4 5], separator 9."""

    tokens = np.array([1, 2, 3, 4, 5], dtype=np.uint16)
    offsets = np.array([0, 3, 5])
    separator = 9


def test_windows_cut_the_stream_of_documents_and_separators():
    windows = TokenWindows.of_store(Store(), 2)  # stream 1 2 3 9 4 5 9: (7 - 1) // 2 = 3 windows of 3
    assert len(windows) == 3
    assert [windows[i].tolist() for i in range(3)] == [[1, 2, 3], [3, 9, 4], [4, 5, 9]]
    assert windows[0].dtype == torch.int64
    with pytest.raises(IndexError):
        windows[3]


@pytest.mark.parametrize("vocab", [50, 64])  # padded to 64, and not
def test_the_gpt_returns_fresh_logits_not_a_view(vocab):
    """An FSDP2 root hooks its output: a view would lose the hook to an in-place op downstream."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(layers=1, heads=2, width=16, max_seq_len=8), vocab_size=vocab, separator=SEPARATOR)
    logits = model(torch.randint(0, vocab, (2, 8)))
    assert logits.shape == (2, 8, vocab) and not logits._is_view()


def test_a_validation_cap_reads_the_first_windows_of_the_stream_by_value(tmp_path):
    capped = TokenWindows.of_store(Store(), 2, tokens=4)  # the first 4 tokens: 2 windows of 2 (+1)
    assert [capped[i].tolist() for i in range(len(capped))] == [[1, 2, 3], [3, 9, 4]]
    assert len(TokenWindows.of_store(Store(), 2, tokens=6)) == 3  # every window the stream holds
    with pytest.raises(
        DataError,
        match=r"^bad value for 'data.text.val_tokens': 8, but the store's validation split holds 6 tokens in windows",
    ):
        TokenWindows.of_store(Store(), 2, tokens=8)  # one window more than there is: refused, not cut
    # from the command line, before the run: one line, and no run folder
    (tmp_path / "corpus.txt").write_text("\n\n".join(f"document {n} " + "words of text " * 40 for n in range(40)))
    store = tmp_path / "store"
    assert (
        run_here(
            "write-text", str(tmp_path / "corpus.txt"), str(store), "--tokenizer-kind", "bpe", "--vocab-size", "300"
        ).returncode
        == 0
    )
    held_out = json.loads((store / "store.json").read_text())["val"]["tokens"]
    asked = (held_out // 64 + 2) * 64
    args = ["task=causal_lm", "data=token_stream", f"data.path={store}", "model=gpt_tiny", "data.text.max_seq_len=64"]
    result = run_here(*args, f"data.text.val_tokens={asked}", "max_duration=1ba", f"hydra.run.dir={tmp_path / 'run'}")
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith(f"trainrun: error: bad value for 'data.text.val_tokens': {asked:,}, but ")
    assert not (tmp_path / "run").exists()
    base = ["task=causal_lm", "data=stdlib_stream", "model=gpt_tiny", "data.text.max_seq_len=64"]
    with pytest.raises(ConfigError, match=r"^bad value for 'data.text.val_tokens': 100 \(a multiple of"):
        validate(compose([*base, "data.text.val_tokens=100"]), files=False)
    with pytest.raises(ConfigError, match=r"^bad value for 'data.text.val_tokens': data=text \(masked LM\)"):
        validate(
            compose(["task=masked_lm", "data=stdlib_docs", "model=bert_tiny", "data.text.val_tokens=128"]), files=False
        )


BPE_DOCUMENTS = ["Déjà vu: naïve café ✓ 🚀", "def main():\n    return 'Hello, World!'", "Zürich 42\t€"] * 20


def test_byte_level_bpe_stores_round_trip_any_text_and_end_documents_with_endoftext(tmp_path):
    from tokenizers import Tokenizer

    from trainrun.data.store_writer import write_token_store
    from trainrun.data.token_store import TokenStore, check_vocab_size
    from trainrun.errors import ConfigError

    path = write_token_store(BPE_DOCUMENTS[3:], BPE_DOCUMENTS[:3], tmp_path / "bpe", 300, kind="bpe")
    train = TokenStore.open(path, "train")
    assert train.meta["special"] == {"<|endoftext|>": 0} and train.separator == 0
    assert 257 <= train.vocab_size <= 300  # every byte, <|endoftext|> and merges
    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    documents = list(train.documents())
    assert [tokenizer.decode(ids.tolist()) for ids in documents] == BPE_DOCUMENTS[3:]  # exact: case, accents, emoji
    assert tokenizer.encode("never seen: 𝔘 ∮").tokens and tokenizer.token_to_id("[UNK]") is None  # no unknown text
    stream = np.concatenate([np.append(ids, 0) for ids in documents])
    windows = TokenWindows.of_store(train, 8)
    assert [windows[i].tolist() for i in range(3)] == [stream[i * 8 : i * 8 + 9].tolist() for i in range(3)]
    # a given byte-level tokenizer (GPT-2's kind) keeps its <|endoftext|> as the separator
    given = write_token_store(BPE_DOCUMENTS[:6], BPE_DOCUMENTS[:3], tmp_path / "given", 0, path / "tokenizer.json")
    assert TokenStore.open(given, "val").meta["separator"] == "<|endoftext|>"
    with pytest.raises(ConfigError, match=r"^bad value for '--vocab-size': 256 \(at least 257 for bpe \(every byte "):
        check_vocab_size(256, "bpe")
    with pytest.raises(ConfigError, match=r"^bad value for '--vocab-size': 15 \(at least 16 for wordpiece\)$"):
        check_vocab_size(15, "wordpiece")
    check_vocab_size(257, "bpe"), check_vocab_size(16, "wordpiece")


def test_the_task_scores_each_position_on_the_next_token_summed_over_batches():
    task = CausalLanguageModeling()
    state = type("S", (), {"device": torch.device("cpu"), "world_size": 1, "data": SimpleNamespace(text=None)})()
    inputs, targets, count = task.batch(torch.tensor([[1, 2, 3], [4, 5, 6]]), state)
    assert inputs.tolist() == [[1, 2], [4, 5]] and targets.tolist() == [[2, 3], [5, 6]] and count == 2
    evaluator = task.evaluator(state)
    logits = torch.randn(2, 2, 7)
    evaluator.update(logits[:1], targets[:1])
    evaluator.update(logits[1:], targets[1:])
    mean = F.cross_entropy(logits.flatten(0, 1), targets.flatten()).item()
    assert evaluator.compute() == {"eval_loss": pytest.approx(mean), "perplexity": pytest.approx(math.exp(mean))}
    assert isinstance(evaluator, NextTokenEvaluator) and task.quality_rule.higher_is_better is False
    assert evaluator.sums.dtype == torch.float64  # exact token counts past float32's 2^24
    on_device = type("S", (), {"device": torch.device("meta"), "world_size": 1, "data": state.data})()  # as a GPU run
    inputs, _, _ = task.batch(torch.tensor([[1, 2, 3]]), on_device)
    assert inputs.device.type == "meta" and task.evaluator(on_device).sums.device.type == "meta"
    # the training loss: the mean of -log p(next token), by hand
    by_hand = -torch.stack([logits[b, t].log_softmax(-1)[targets[b, t]] for b in range(2) for t in range(2)]).mean()
    torch.testing.assert_close(next_token_cross_entropy(logits, targets), by_hand)


def test_evaluation_adds_the_other_ranks_sums_before_the_mean(monkeypatch):
    import trainrun.tasks.causal_lm as causal

    other_rank = torch.tensor([30.0, 10.0], dtype=torch.float64)  # its loss sum and tokens
    monkeypatch.setattr(causal.dist, "all_reduce", lambda sums: sums.add_(other_rank))
    evaluator = NextTokenEvaluator(torch.device("cpu"), world_size=2)
    logits, targets = torch.zeros(1, 2, 5), torch.tensor([[1, 2]])  # uniform: ln 5 per token
    evaluator.update(logits, targets)
    assert evaluator.compute()["eval_loss"] == pytest.approx((2 * math.log(5) + 30.0) / 12)


def test_every_task_names_the_quality_metric_its_table_entry_names():
    for name in names("task"):
        task = builder("task", name)()
        rule = task_spec(name).quality
        assert (task.quality, task.metrics[task.quality]) == (rule.metric, rule.label), name


@pytest.mark.slow
def test_a_tiny_gpt_trains_on_the_standard_library_and_stops_at_a_loss(tmp_path):
    args = [
        "task=causal_lm",
        "data=stdlib_stream",
        "data.text.tokenizer=bpe",
        "data.text.vocab_size=2048",
        "model=gpt_tiny",
        "data.text.max_seq_len=32",
    ]
    args += ["train_batch_size=16", "eval_batch_size=64", "max_duration=40ba", "eval_interval=10ba", "progress=false"]
    args += ["algorithms=[ema]", "algorithms.ema.half_life=1ba", "algorithms.ema.update_interval=1ba"]
    result = run_here(*args, f"hydra.run.dir={tmp_path / 'run'}", "optimizer=adamw", "optimizer.lr=3e-3")
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["eval_loss"] for r in records]
    assert len(losses) == 4 and losses == sorted(losses, reverse=True) and losses[-1] < losses[0] - 0.3  # it learns
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert (summary["quality_metric"], summary["quality_higher_is_better"]) == ("eval_loss", False)
    assert summary["best_eval_loss"] == min(losses)
    target = losses[1] + 1e-6  # the second evaluation reaches it: lower is better
    stopped = run_here(
        *args, f"hydra.run.dir={tmp_path / 'stop'}", "optimizer=adamw", "optimizer.lr=3e-3", f"stop_at={target}"
    )
    assert stopped.returncode == 0, stopped.stderr
    summary = json.loads((tmp_path / "stop" / "summary.json").read_text())
    assert summary["status"] == "target_reached" and summary["batches"] == 20
    # the finished run as transformers reads it, and trainrun sample's greedy reply equal to its generate()
    from transformers import AutoTokenizer, GPT2LMHeadModel

    from trainrun.commands.sample import load_run
    from trainrun.core.checkpoint import list_checkpoints, load_checkpoint

    exported = tmp_path / "run" / "hf_model"
    gpt2, tokenizer = GPT2LMHeadModel.from_pretrained(exported), AutoTokenizer.from_pretrained(exported)
    final = load_checkpoint(list_checkpoints(tmp_path / "run" / "checkpoints")[-1])
    average = final["algorithms"]["ema"]["average"]  # EMA's: what the reported losses were measured with
    evaluated = {key.removeprefix("module."): value for key, value in average.items() if key != "n_averaged"}
    assert not torch.equal(evaluated["embed.weight"], final["model"]["embed.weight"])
    for weights in (gpt2.state_dict()["transformer.wte.weight"], load_run(tmp_path / "run")[0].embed.weight):
        torch.testing.assert_close(weights, evaluated["embed.weight"], rtol=0, atol=0)
    ends = (gpt2.config.bos_token_id, gpt2.config.eos_token_id, gpt2.generation_config.eos_token_id)
    assert ends == (tokenizer.eos_token_id,) * 3  # the store's separator, where generate stops
    prompt = tokenizer("def main", return_tensors="pt").input_ids
    greedy = gpt2.generate(prompt, max_new_tokens=6, do_sample=False, pad_token_id=tokenizer.eos_token_id)[0]
    sampled = run_here("sample", str(tmp_path / "run"), "--prompt", "def main", "--tokens", "6", "--temperature", "0")
    assert sampled.returncode == 0, sampled.stderr
    separator = tokenizer.convert_tokens_to_ids("<|endoftext|>")  # a byte-level BPE store's
    drawn = greedy[prompt.shape[1] :].tolist()
    drawn = drawn[: drawn.index(separator)] if separator in drawn else drawn
    assert sampled.stdout == "def main" + tokenizer.decode(drawn, skip_special_tokens=True) + "\n"


@pytest.mark.parametrize(
    ("kind", "tokens"), [("wordpiece", ("[SEP]", "[PAD]", "[UNK]")), ("bpe", ("<|endoftext|>",) + (None,) * 2)]
)
def test_the_task_exports_a_gpt2_shaped_model_and_says_why_not_for_others(tmp_path, kind, tokens):
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    from trainrun.data.store_writer import write_token_store
    from trainrun.data.token_store import TokenStore

    documents = ["def main(): return 1", "print(main())"] * 20
    store = TokenStore.open(write_token_store(documents, documents[:2], tmp_path / "store", 300, kind=kind), "train")
    text = SimpleNamespace(tokenizer_file=store.path / "tokenizer.json", separator=store.separator)
    task = CausalLanguageModeling()
    state = SimpleNamespace(raw_model=gpt(), data=SimpleNamespace(text=text))
    assert task.export(state, tmp_path) == [
        f"wrote {tmp_path / 'hf_model'} (GPT2LMHeadModel and its tokenizer, for transformers' from_pretrained)"
    ]
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in (tmp_path / "hf_model").iterdir()}
    exported = AutoTokenizer.from_pretrained(tmp_path / "hf_model")
    assert (exported.eos_token, exported.pad_token, exported.unk_token) == tokens  # the store's separator ends text
    decoded = exported.decode(exported("print(main())").input_ids)
    assert decoded == ("print(main())" if kind == "bpe" else "print ( main ( ) )")  # WordPiece splits punctuation
    state.raw_model = gpt(norm="rmsnorm")
    assert task.export(state, tmp_path / "other") == [
        "note: no hf_model (GPT2LMHeadModel cannot hold this GPT: its norm is RMSNorm); 'trainrun sample' reads the run"
    ]
    assert not (tmp_path / "other").exists()


@pytest.mark.parametrize("switches", [{}, {"bias": True, "tie_head": False}])
def test_a_gpt_of_gpt2s_shape_is_a_gpt2lmheadmodel_with_equal_logits(switches):
    from trainrun.models.gpt2_export import gpt2_mismatch, to_gpt2

    model = gpt(**switches)
    for block in model.blocks:  # biases and norms away from their initial values, so the mapping shows
        for parameter in block.parameters():
            parameter.data += 0.01 * torch.randn_like(parameter)
    tokens = torch.randint(0, 50, (2, 12))
    logits = to_gpt2(model)(tokens).logits
    torch.testing.assert_close(logits[..., :50], model(tokens), rtol=1e-4, atol=1e-5)
    assert logits.shape[-1] == padded_vocabulary(50)  # the padding rows after the store's vocabulary
    assert gpt2_mismatch(model) is None
    for other, reason in (
        ({"positions": "rotary"}, "positions are not learned"),
        ({"norm": "rmsnorm"}, "its norm is RMSNorm"),
        ({"qk_norm": True}, "it normalises queries and keys"),
        ({"mlp": "relu2"}, "its MLP is ReLU²"),
        ({"logit_softcap": 15.0}, "its logits are soft-capped"),
        ({"positions": "alibi"}, "positions are not learned"),
        ({"document_mask": True}, "it masks attention by document"),
        ({"window": 8}, "its attention is windowed"),
        ({"value_embeddings": 1}, "it has value embeddings"),
    ):
        assert gpt2_mismatch(gpt(**other)) == reason


def test_sample_refuses_what_is_not_a_finished_causal_run_in_one_line(tmp_path):
    result = run_here("sample", str(tmp_path), "--prompt", "x")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"trainrun: error: bad value for 'RUN': '{tmp_path}' has no config.yaml (not a trainrun run directory)"
    ]
    result = run_here("sample", str(tmp_path), "--prompt", "x", "--tokens", "0")
    assert result.returncode == 2 and "'--tokens', '--top-k' or '--temperature'" in result.stderr


@pytest.mark.slow
@pytest.mark.distributed
def test_one_rank_and_two_ranks_train_the_same_gpt(tmp_path):
    """Windows ordered by (seed, epoch) and split between ranks by position in the step, no dropout,
    a mean over every rank's tokens, evaluation summed over the ranks' windows: 2 gloo ranks train
    the 1-rank GPT, with ALiBi's shorter sequences on, to float summation order. (Muon's bfloat16
    iteration amplifies that order: with optimizer=muon the two differ by about 4e-6 in the loss.)"""
    from trainrun.core.checkpoint import list_checkpoints

    args = ["task=causal_lm", "data=stdlib_stream", "model=gpt_tiny", "data.text.max_seq_len=32", "optimizer=adamw"]
    args += ["optimizer.lr=3e-3", "train_batch_size=16", "eval_batch_size=32", "max_duration=12ba"]
    args += [
        "eval_interval=12ba",
        "progress=false",
        "algorithms=[alibi]",
        "algorithms.alibi.train_sequence_length_scaling=0.5",
    ]
    for name, split in (("one", []), ("two", ["launcher.devices=2"])):
        result = run_here(*args, *split, f"hydra.run.dir={tmp_path / name}")
        assert result.returncode == 0, result.stderr
    first, other = (
        [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        for name in ("one", "two")
    )
    assert len(first) == len(other) == 1
    for key in ("train_loss", "eval_loss"):
        assert other[0][key] == pytest.approx(first[0][key], rel=1e-6), key
    one, two = (
        torch.load(list_checkpoints(tmp_path / name / "checkpoints")[-1], weights_only=True)["model"]
        for name in ("one", "two")
    )
    assert "positions.weight" not in one  # trained with ALiBi
    for key, value in one.items():
        torch.testing.assert_close(two[key], value, rtol=1e-4, atol=2e-5, msg=key)


@pytest.mark.slow
def test_a_gpt_run_resumed_mid_epoch_ends_where_the_uninterrupted_one_ends(tmp_path):
    """Dropout on, Muon (its momentum warmup and step count in the checkpoint), ALiBi's split:
    resuming at step 6 gives the uninterrupted run's weights bit for bit, and its metrics."""
    args = ["task=causal_lm", "data=stdlib_stream", "model=gpt_tiny", "data.text.max_seq_len=32", "optimizer=muon"]
    args += ["optimizer.muon.momentum_warmup=8ba", "scheduler=wsd", "model.gpt.tie_head=false", "model.gpt.dropout=0.1"]
    args += ["algorithms=[alibi]", "algorithms.alibi.train_sequence_length_scaling=0.5", "train_batch_size=16"]
    expected, got = resume_after_step_6([*args, "eval_interval=5ba"], tmp_path)
    assert all(torch.equal(expected["model"][key], got["model"][key]) for key in expected["model"])
    assert got["optimizer"]["steps"] == 10


def test_value_embeddings_beyond_half_the_blocks_are_a_one_line_error():
    from trainrun.config import check
    from trainrun.errors import ConfigError

    gpt_run = ["task=causal_lm", "data=stdlib_stream", "model=gpt_tiny", "model.gpt.layers=3"]
    check([*gpt_run, "model.gpt.value_embeddings=1"])
    message = r"^bad value for 'model.gpt.value_embeddings': 2 tables serve the first and the last 2 blocks, more than"
    with pytest.raises(ConfigError, match=message + r" model.gpt.layers 3$"):
        check([*gpt_run, "model.gpt.value_embeddings=2"])


def test_window_warmup_grows_the_window_linearly_in_whole_blocks():
    from trainrun.algorithms.specs.window_warmup import WindowWarmupConfig
    from trainrun.algorithms.window_warmup import window_at

    config = WindowWarmupConfig()  # the speedrun's 128 -> 1,792 in blocks of 128 over the whole run
    assert [window_at(p, config) for p in (0.0, 0.01, 0.5, 0.99, 1.0, 1.5)] == [128, 256, 1024, 1792, 1792, 1792]
    for step in range(1771):  # never more than one block from record 21's next_multiple_of_n(1728 · step / 1770, 128)
        record = max(128, 128 * math.ceil(1728 * step / 1770 / 128))
        assert 0 <= window_at(step / 1770, config) - record <= 128
    short = WindowWarmupConfig(start=3, end=9, duration=0.5, multiple=2)
    assert [window_at(p, short) for p in (0.0, 0.125, 0.25, 0.5, 0.9)] == [4, 6, 6, 10, 10]  # 3, 4.5, 6, 9 rounded up


def test_window_warmup_gives_the_gpt_the_window_for_the_runs_progress_without_recompiling():
    from types import SimpleNamespace

    from trainrun.algorithms import build_algorithms
    from trainrun.algorithms.specs.window_warmup import WindowWarmupConfig
    from trainrun.core.events import Event
    from trainrun.errors import ConfigError
    from trainrun.models.gpt2_export import gpt2_mismatch

    method = build_algorithms({"window_warmup": WindowWarmupConfig(start=2, end=10, multiple=2)})[0]
    model, tokens = gpt(), torch.randint(0, 50, (2, 12))
    state = SimpleNamespace(raw_model=model, progress=0.0)
    method.apply(Event.INIT, state)
    assert float(model.window) == 2
    state.progress = 0.5
    method.apply(Event.BATCH_START, state)
    assert float(model.window) == 6 and method.state_dict() == {"window": 6}  # what a checkpoint records
    restored = gpt()  # as trainrun sample builds it from a checkpoint
    method.restore_evaluated(restored, method.state_dict())
    assert float(restored.window) == 6
    method.restore_evaluated(restored, {})  # a checkpoint that does not record it: the last window
    assert float(restored.window) == 10
    fixed = gpt(window=6)  # the same weights (same seed), a window fixed at 6
    torch.testing.assert_close(model(tokens), fixed(tokens), rtol=0, atol=0)
    state.progress = 1.0
    method.apply(Event.EVAL_START, state)  # evaluation at the end attends with the last window
    assert float(model.window) == 10
    assert gpt2_mismatch(model) == "its attention is windowed"

    graphs = []
    compiled = torch.compile(model, backend=lambda graph, inputs: graphs.append(graph) or graph.forward)
    for window in (4, 6, 8):
        model.set_window(window)
        torch.testing.assert_close(compiled(tokens), gpt(window=window)(tokens), rtol=1e-5, atol=1e-6)
    assert len(graphs) == 1  # the window is a tensor the graph reads, not a constant it was traced with

    with pytest.raises(
        ConfigError, match=r"^algorithm 'window_warmup' needs trainrun's GPT \(model=gpt\*\), not Linear$"
    ):
        method.apply(Event.INIT, SimpleNamespace(raw_model=torch.nn.Linear(2, 2), progress=0.0))


@pytest.mark.slow
def test_a_checkpoint_records_the_window_its_weights_last_attended_with_and_sample_takes_it(tmp_path):
    from trainrun.commands.sample import load_run
    from trainrun.core.checkpoint import list_checkpoints

    run = tmp_path / "run"
    warmup = [
        "algorithms.window_warmup.start=8",
        "algorithms.window_warmup.end=64",
        "algorithms.window_warmup.multiple=8",
    ]
    args = ["task=causal_lm", "data=stdlib_stream", "model=gpt_tiny", "data.text.max_seq_len=64", "optimizer=adamw"]
    args += ["model.gpt.positions=rotary", "algorithms=[window_warmup]", *warmup, "train_batch_size=8"]
    args += ["max_duration=4ba", "eval_interval=4ba", "checkpoint.interval=2ba", f"hydra.run.dir={run}"]
    result = run_here(*args)
    assert result.returncode == 0, result.stderr
    assert float(load_run(run)[0].window) == 64  # evaluated at the end: the schedule's last window
    *earlier, final = list_checkpoints(run / "checkpoints")
    final.unlink()  # as if the run had been stopped after step 2, whose window was 8 + 56 / 4 -> 24
    assert [path.name for path in earlier] == ["ep0-ba2.pt"] and float(load_run(run)[0].window) == 24
    reply = run_here("sample", str(run), "--prompt", "def main", "--tokens", "4", "--temperature", "0")
    assert reply.returncode == 0 and reply.stdout.startswith("def main"), reply.stderr


def test_window_warmup_is_for_causal_runs_and_starts_below_its_end():
    from trainrun.config import check
    from trainrun.errors import ConfigError

    gpt_run = ["task=causal_lm", "data=stdlib_stream", "model=gpt_tiny", "algorithms=[window_warmup]"]
    assert check(gpt_run)[0].algorithms["window_warmup"].end == 1792
    check([*gpt_run, "algorithms.window_warmup.start=128", "algorithms.window_warmup.end=128"])  # a fixed window
    with pytest.raises(
        ConfigError, match=r"^bad value for 'algorithms.window_warmup.start': 256 is more than its end 128$"
    ):
        check([*gpt_run, "algorithms.window_warmup.start=256", "algorithms.window_warmup.end=128"])
    with pytest.raises(ConfigError, match="algorithm 'window_warmup' does not apply to task masked_lm"):
        check(["task=masked_lm", "data=stdlib_docs", "model=bert_tiny", "algorithms=[window_warmup]"])


@pytest.mark.parametrize("kind", ["wordpiece", "bpe"])
def test_sample_spaces_the_continuation_as_the_tokenizer_decodes_prompt_and_continuation_together(kind):
    from trainrun.commands.sample import continued_text
    from trainrun.data.token_store import train_tokenizer

    documents = ["return the value of the call", "the value is returned to the caller"] * 50
    tokenizer = train_tokenizer(documents, 300, kind)
    prompt, drawn = tokenizer.encode("return").ids, tokenizer.encode(" the value").ids
    assert continued_text(tokenizer, prompt, drawn) == " the value"


def test_compiled_blocks_take_each_batchs_block_mask_without_recompiling():
    """The GPU's path (FlexAttention with the document mask, a window and ALiBi) through blocks compiled
    in place: each batch's block mask and score modification are inputs, so after the batch that makes
    the size dynamic nothing more compiles, and the outputs are the uncompiled blocks'."""
    from torch._dynamo.utils import counters

    from trainrun.core.compiled import compile_model

    model, reference = (
        gpt(positions="alibi", document_mask=True, window=6),
        gpt(positions="alibi", document_mask=True, window=6),
    )
    torch._dynamo.reset()
    compile_model(model, print, backend="eager")
    graphs = []
    with torch.no_grad():
        for batch in (2, 3, 2, 4, 5):  # not 1: dynamo specialises a size of 1 (one graph more)
            tokens = torch.randint(8, 50, (batch, 10))
            tokens[:, batch] = SEPARATOR
            outputs = []
            for net in (model, reference):
                attend, x = (
                    net.attend(tokens, flex=True),
                    torch.randn(batch, 10, 16, generator=torch.Generator().manual_seed(batch)),
                )
                for block in net.blocks:
                    x = block(x, None, attend)
                outputs.append(x)
            torch.testing.assert_close(*outputs, rtol=1e-5, atol=1e-5)
            graphs.append(counters["frames"]["ok"])
    assert sum(counters["graph_break"].values()) == 0 and graphs[1] == graphs[-1], graphs
