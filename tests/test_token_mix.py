"""data=token_mix: corpora mixed by weight, each epoch's shares exact and carried on from the last,
every corpus scored apart, a killed run resumed to the uninterrupted one, bad mixtures refused."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import read_metrics, resume_after_step_6, run_here

from trainrun.data.causal_text import TokenWindows
from trainrun.data.interface import TextFacts
from trainrun.data.token_mix import MixedWindows, SourcedWindows, shares, sourced_batch
from trainrun.tasks.causal_lm import NextTokenEvaluator

WEB = ["The river runs past the mill and the town.", "A cold wind came down from the hills at night."] * 30
CODE = ["def add(a, b):\n    return a + b", "for item in items:\n    print(item)"] * 30


def corpus(windows: int, first: int) -> TokenWindows:
    """``windows`` windows of 4 tokens whose first tokens are ``first``, ``first + 4``, ..."""
    return TokenWindows(np.arange(first, first + 4 * windows + 1, dtype=np.int64), 4, separator=0)


def test_shares_split_a_total_by_weight_with_the_largest_remainders():
    assert shares([0.7, 0.3], 10).tolist() == [7, 3]
    assert shares([1, 1, 1], 10).tolist() == [4, 3, 3]
    assert shares([2, 1], 110).tolist() == [73, 37] and shares([0.999, 0.001], 5).sum() == 5


def test_each_epoch_gives_each_corpus_its_share_carrying_on_where_the_last_stopped():
    big, small = corpus(100, 0), corpus(10, 100_000)
    mixed = MixedWindows([big, small], [0.5, 0.5])  # an epoch: 110 windows, 55 of each corpus
    assert len(mixed) == 110 and mixed.counts.tolist() == [55, 55]
    epochs = [mixed.gather_keyed(7, [(epoch, index) for index in range(110)]) for epoch in range(2)]
    for batch in epochs:  # every row is a whole window of one corpus
        assert torch.equal(batch[:, 1:] - batch[:, :-1], torch.ones(110, 4, dtype=torch.int64))
    firsts = [Counter(batch[:, 0].tolist()) for batch in epochs]
    for seen in firsts:
        assert sum(count for token, count in seen.items() if token < 100_000) == 55
        small_counts = [seen[100_000 + 4 * window] for window in range(10)]
        assert sorted(small_counts) == [5] * 5 + [6] * 5  # 55 reads of 10 windows, one pass after another
    read_big = [token for seen in firsts for token in seen.elements() if token < 100_000]
    assert len(set(read_big[:55])) == 55 and set(read_big) == set(range(0, 400, 4))  # epoch 2 carries on: all read
    assert max(token for token in firsts[0] if token < 100_000) > 220  # spread over the corpus, not its start
    # the same keys give the same windows, another seed another order; an index alone is epoch 0's
    assert torch.equal(mixed.gather_keyed(7, [(1, 3), (0, 80)]), torch.cat([epochs[1][[3]], epochs[0][[80]]]))
    assert not torch.equal(mixed.gather_keyed(8, [(0, index) for index in range(110)]), epochs[0])
    assert torch.equal(mixed.__getitems__([5, 60]), mixed.gather_keyed(0, [(0, 5), (0, 60)]))
    with pytest.raises(IndexError):
        mixed.__getitems__([110])


def test_validation_batches_say_each_windows_corpus_and_each_is_scored_apart(monkeypatch):
    import trainrun.tasks.causal_lm as causal

    val = SourcedWindows([corpus(3, 0), corpus(2, 1000)])
    batch = sourced_batch(val.__getitems__([0, 3, 4, 2]))
    assert batch["source"].tolist() == [0, 1, 1, 0] and batch["windows"][:, 0].tolist() == [0, 1000, 1004, 8]
    text = TextFacts(50, 4, None, 0, sources=("web", "code"), source_weights=(0.7, 0.3))
    evaluator = NextTokenEvaluator(torch.device("cpu"), world_size=2, text=text)
    other_rank = torch.tensor([[10.0, 5.0], [0.0, 0.0]], dtype=torch.float64)  # web: 5 tokens of loss 2 each
    monkeypatch.setattr(causal.dist, "all_reduce", lambda sums: sums.add_(other_rank))
    logits, next_tokens = torch.randn(4, 4, 50), torch.randint(50, (4, 4))
    evaluator.update(logits, {"next": next_tokens, "source": batch["source"]})
    own = [F.cross_entropy(logits[rows].flatten(0, 1), next_tokens[rows].flatten(), reduction="sum").item()
           for rows in (batch["source"] == 0, batch["source"] == 1)]  # fmt: skip
    metrics = evaluator.compute()
    web, code = (own[0] + 10.0) / 13, own[1] / 8
    assert metrics["eval_loss/web"] == pytest.approx(web) and metrics["eval_loss/code"] == pytest.approx(code)
    assert metrics["eval_loss"] == pytest.approx(0.7 * web + 0.3 * code)
    assert metrics["perplexity"] == pytest.approx(math.exp(0.7 * web + 0.3 * code))


@pytest.fixture
def stores(tmp_path):
    from trainrun.data.store_writer import write_token_store

    web = write_token_store(WEB, WEB[:4], tmp_path / "web", 300, kind="bpe")
    code = write_token_store(CODE, CODE[:6], tmp_path / "code", 0, web / "tokenizer.json")
    other = write_token_store(CODE, CODE[:6], tmp_path / "other", 300, kind="bpe")  # its own vocabulary
    return web, code, other


def mix_args(*sources: tuple[str, object, float]) -> list[str]:
    listed = ", ".join(f"{{name: {name}, path: {path}, weight: {weight}}}" for name, path, weight in sources)
    return [
        "task=causal_lm", "data=token_mix", f"data.mix=[{listed}]", "model=gpt_tiny", "data.text.max_seq_len=16",
        "data.text.val_tokens=48", "train_batch_size=4", "optimizer=adamw", "optimizer.lr=3e-3", "eval_interval=5ba",
    ]  # fmt: skip


def test_a_mixture_trains_scores_each_corpus_and_resumes_to_the_uninterrupted_run(stores, tmp_path):
    web, code, _ = stores
    whole, resumed = resume_after_step_6(mix_args(("web", web, 0.7), ("code", code, 0.3)), tmp_path)
    for name, tensor in whole["model"].items():
        torch.testing.assert_close(resumed["model"][name], tensor, rtol=0, atol=0)
    last = read_metrics(tmp_path / "whole")[-1]
    assert last["eval_loss"] == pytest.approx(0.7 * last["eval_loss/web"] + 0.3 * last["eval_loss/code"])
    assert last["eval_loss/web"] != last["eval_loss/code"]


def test_bad_mixtures_are_one_line_before_a_run(stores, tmp_path):
    web, code, other = stores
    tokenizer = "differs from web's; the corpora of a mixture share one tokenizer"
    missing = f"data.mix.1 (code): '{tmp_path / 'none'}' is not a token store"
    cases = {
        tokenizer: mix_args(("web", web, 1), ("other", other, 1)),
        "bad value for 'data.mix.1.name': 'web' is given twice": mix_args(("web", web, 1), ("web", code, 1)),
        "data=token_mix needs two corpora or more": mix_args(("web", web, 1)),
        "bad value for 'data.mix.1.weight': 0.0 (must be > 0)": mix_args(("web", web, 1), ("code", code, 0)),
        missing: mix_args(("web", web, 1), ("code", tmp_path / "none", 1)),
    }
    for expected, args in cases.items():
        result = run_here(*args, "max_duration=2ba", f"hydra.run.dir={tmp_path / 'run'}")
        assert result.returncode == 2 and expected in result.stderr, (expected, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "run").exists()
    shards = "{name: shards, train: /data/a_*.bin, val: /data/b_*.bin, path: /data/c}"
    result = run_here(
        *mix_args(("web", web, 1))[:2], f"data.mix=[{{name: web, path: {web}}}, {shards}]", "model=gpt_tiny"
    )
    assert result.returncode == 2 and "give a token store (path) or llm.c shards" in result.stderr, result.stderr
    assert not (tmp_path / "run").exists()  # refused before the run wrote anything


@pytest.mark.slow
def test_two_ranks_train_and_score_a_mixture_as_one_rank(stores, tmp_path):
    """The mixture's order is keyed to (seed, epoch, sample) and each validation window is scored
    by one rank (the second rank's share padded by a repeat that is left out): two gloo ranks give
    one rank's losses, per corpus too, to float summation order."""
    web, code, _ = stores
    sources = [("web", web, 0.5), ("code", code, 0.3), ("again", code, 0.2)]  # 3 windows of each: one rank pads one
    args = [*mix_args(*sources), "max_duration=10ba"]
    for name, split in {"one": [], "two": ["launcher.devices=2"]}.items():
        result = run_here(*args, *split, "progress=false", f"hydra.run.dir={tmp_path / name}")
        assert result.returncode == 0, result.stderr
    for one, two in zip(read_metrics(tmp_path / "one"), read_metrics(tmp_path / "two"), strict=True):
        for key in ("train_loss", "eval_loss", "eval_loss/web", "eval_loss/code", "eval_loss/again"):
            assert two[key] == pytest.approx(one[key], rel=1e-5), key
