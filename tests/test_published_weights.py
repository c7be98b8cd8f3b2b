"""Published weights in (``model.weights=HF_FOLDER``) for trainrun's Llama and GPT: tiny random
``LlamaForCausalLM`` and ``GPT2LMHeadModel`` saved with ``save_pretrained`` (one file and sharded)
give transformers' logits, round-trip through the export to the same tensors, a folder of another
shape or missing a weight is one line, and a run started from a folder scores transformers' loss."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from conftest import read_metrics, run_here

from trainrun.errors import ConfigError
from trainrun.models.gpt import GPT
from trainrun.models.llama import Llama
from trainrun.models.weights import load_weights
from trainrun.schema import GPTConfig, LlamaConfig

VOCAB = 300
LLAMA = LlamaConfig(layers=2, heads=4, kv_heads=2, width=64, ffn_hidden=96, max_seq_len=64, rope_factor=32.0)


def saved_llama(folder, config: LlamaConfig = LLAMA, vocab: int = VOCAB, shard: str | None = None):
    """A random ``LlamaForCausalLM`` of trainrun's settings ``config``, saved (sharded at ``shard``)."""
    from transformers import LlamaForCausalLM

    from trainrun.models.llama_export import hf_llama_config

    torch.manual_seed(0)
    model = LlamaForCausalLM(hf_llama_config(config, vocab)).eval()
    model.save_pretrained(folder, **({"max_shard_size": shard} if shard else {}))
    return model


def saved_gpt2(folder, vocab: int = VOCAB):
    """A random ``GPT2LMHeadModel`` as transformers builds one (tanh GELU, biases, tied head), saved."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_positions=64, n_embd=64, n_layer=2, n_head=4)).eval()
    model.save_pretrained(folder)
    return model


GPT2_SHAPE = GPTConfig(layers=2, heads=4, width=64, max_seq_len=64, bias=True, mlp="gelu_tanh", tie_head=True)


@pytest.mark.parametrize(("kind", "shard"), [("llama", None), ("llama", "60KB"), ("gpt2", None)])
def test_a_published_model_gives_transformers_logits_and_round_trips(tmp_path, kind, shard):
    """Read in, the model's logits are transformers'; exported again, its tensors are the folder's
    (trainrun's GPT-2 export has the padded vocabulary's rows beyond them)."""
    from trainrun.models.gpt2_export import to_gpt2
    from trainrun.models.llama_export import to_llama

    if kind == "llama":
        published, model, export = saved_llama(tmp_path / "hf", shard=shard), Llama(LLAMA, VOCAB), to_llama
    else:
        published, model, export = saved_gpt2(tmp_path / "hf"), GPT(GPT2_SHAPE, VOCAB), to_gpt2
    assert (tmp_path / "hf" / "model.safetensors.index.json").is_file() == bool(shard)
    load_weights(model.eval(), str(tmp_path / "hf"))
    tokens = torch.randint(VOCAB, (2, 24))
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), published(tokens).logits, rtol=1e-4, atol=1e-5)
    exported = export(model).state_dict()
    for name, tensor in published.state_dict().items():
        if not name.endswith(".attn.bias"):  # GPT-2's causal-mask buffer, where it keeps one
            torch.testing.assert_close(exported[name][: tensor.shape[0]], tensor, rtol=0, atol=0)


def test_a_folder_of_another_shape_or_missing_a_weight_is_one_line(tmp_path):
    from safetensors.torch import load_file, save_file

    saved_llama(tmp_path / "hf")
    narrow = Llama(LlamaConfig(**{**vars(LLAMA), "width": 32}), VOCAB)
    with pytest.raises(ConfigError, match=r"does not fit the model: its hidden_size is 64, model.llama.width 32$"):
        load_weights(narrow, str(tmp_path / "hf"))
    unscaled = Llama(LlamaConfig(**{**vars(LLAMA), "rope_factor": None}), VOCAB)
    with pytest.raises(ConfigError, match=r"its rope factor is 32.0, model.llama.rope_factor None$"):
        load_weights(unscaled, str(tmp_path / "hf"))
    with pytest.raises(ConfigError, match=r"its vocabulary is 300, the data's 256"):
        load_weights(Llama(LLAMA, 256), str(tmp_path / "hf"))
    tensors = load_file(tmp_path / "hf" / "model.safetensors")
    del tensors["model.layers.1.mlp.down_proj.weight"]
    save_file(tensors, tmp_path / "hf" / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ConfigError, match=r"lacks the weight 'model.layers.1.mlp.down_proj.weight'$"):
        load_weights(Llama(LLAMA, VOCAB), str(tmp_path / "hf"))
    saved_gpt2(tmp_path / "gpt2")
    with pytest.raises(ConfigError, match=r"GPT-2's linear layers have biases: set model.gpt.bias=true$"):
        load_weights(GPT(GPTConfig(**{**vars(GPT2_SHAPE), "bias": False}), VOCAB), str(tmp_path / "gpt2"))
    with pytest.raises(ConfigError, match=r"its activation is gelu_new: set model.gpt.mlp=gelu_tanh$"):
        load_weights(GPT(GPTConfig(**{**vars(GPT2_SHAPE), "mlp": "gelu"}), VOCAB), str(tmp_path / "gpt2"))
    with pytest.raises(ConfigError, match=r"it is a gpt2 model, not a Llama$"):
        load_weights(Llama(LLAMA, VOCAB), str(tmp_path / "gpt2"))


@pytest.mark.slow
def test_a_run_started_from_a_published_llama_scores_transformers_loss_and_trains(tmp_path):
    """A store written with a tokenizer, a random Llama of its vocabulary saved as Hugging Face
    saves it, then ``model.weights=FOLDER``: the first evaluation (after one step at a rate of
    1e-12, which moves no weight measurably) is transformers' mean loss on the same windows, on 1
    rank and on 2 fsdp ranks; ``trainrun sample`` continues text from the run."""
    from trainrun.data.causal_text import TokenWindows
    from trainrun.data.store_writer import write_token_store
    from trainrun.data.token_store import TokenStore

    documents = [f"The river {index} runs past the mill and the town of {index * 7}." for index in range(300)]
    store = write_token_store(documents[20:], documents[:20], tmp_path / "store", 300, kind="bpe")
    vocab = TokenStore.open(store, "train").vocab_size
    published = saved_llama(tmp_path / "hf", vocab=vocab)
    shape = [f"model.llama.{name}={getattr(LLAMA, name)}" for name in ("layers", "heads", "kv_heads", "width")]
    shape += ["model.llama.ffn_hidden=96", "model.llama.max_seq_len=64", "model.llama.rope_factor=32.0"]
    args = ["task=causal_lm", "data=token_stream", f"data.path={store}", "model=llama_tiny", *shape]
    args += [f"model.weights={tmp_path / 'hf'}", "data.text.max_seq_len=32", "data.text.val_tokens=128"]
    args += ["train_batch_size=4", "optimizer=adamw", "optimizer.lr=1e-12", "max_duration=1ba", "progress=false"]
    windows = TokenWindows.of_store(TokenStore.open(store, "val"), 32, 128).__getitems__(list(range(4)))
    with torch.no_grad():
        logits = published(windows[:, :-1]).logits
    expected = F.cross_entropy(logits.flatten(0, 1), windows[:, 1:].flatten()).item()
    for name, extra in {"one": [], "two": ["parallel=fsdp", "launcher.devices=2"]}.items():
        result = run_here(*args, *extra, f"hydra.run.dir={tmp_path / name}")
        assert result.returncode == 0, result.stderr
        (record,) = read_metrics(tmp_path / name)
        assert record["eval_loss"] == pytest.approx(expected, rel=1e-5), name
    sampled = run_here("sample", str(tmp_path / "one"), "--prompt", "The river", "--tokens", "5")
    assert sampled.returncode == 0 and sampled.stdout.startswith("The river"), sampled.stderr
    assert json.loads((tmp_path / "one" / "hf_model" / "config.json").read_text())["model_type"] == "llama"


def test_each_rank_reads_the_rows_torch_chunk_gives_it():
    """FSDP2 shards dimension 0 as ``torch.chunk`` cuts it (ceil(rows / ranks) a rank, the last
    shorter, trailing ranks empty): the rows a rank reads of a published tensor are those."""
    from types import SimpleNamespace

    from trainrun.models.llama import rows_of_rank

    for rows in (301, 300, 3):
        for ranks in (2, 3, 4, 8):
            chunks = torch.arange(rows).chunk(ranks)
            for rank in range(ranks):
                mesh = SimpleNamespace(size=lambda ranks=ranks: ranks, get_local_rank=lambda rank=rank: rank)
                held = chunks[rank] if rank < len(chunks) else torch.arange(0)
                first, end = rows_of_rank(SimpleNamespace(shape=(rows, 8), device_mesh=mesh), len(held))
                assert torch.equal(torch.arange(rows)[first:end], held), (rows, ranks, rank)


def test_a_published_folders_tokenizer_must_be_the_datas(tmp_path):
    """The folder's tokenizer.json against the store's: the same file passes; another vocabulary
    of the same size, or of another size, is one line naming the first difference."""
    import shutil

    from trainrun.data.store_writer import write_token_store
    from trainrun.models.published import same_tokenizer

    texts = [f"The river {index} runs past the mill." for index in range(200)]
    store = write_token_store(texts, texts[:5], tmp_path / "store", 300, kind="bpe")
    smaller = write_token_store(texts, texts[:5], tmp_path / "smaller", 280, kind="bpe")
    swapped = json.loads((store / "tokenizer.json").read_text())  # the same size, two tokens' ids exchanged
    vocabulary = swapped["model"]["vocab"]
    first, second = list(vocabulary)[-2:]
    vocabulary[first], vocabulary[second] = vocabulary[second], vocabulary[first]
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "tokenizer.json").write_text(json.dumps(swapped))
    other = tmp_path / "other"
    (tmp_path / "hf").mkdir()
    shutil.copy(store / "tokenizer.json", tmp_path / "hf" / "tokenizer.json")
    same_tokenizer(tmp_path / "hf", store / "tokenizer.json")  # the data written with the folder's tokenizer
    same_tokenizer(tmp_path / "hf", None)  # token shards without a tokenizer: nothing to compare
    with pytest.raises(ConfigError, match=r"has \d+ tokens, the data.s tokenizer .*smaller.* 2\d\d \(write the data"):
        same_tokenizer(tmp_path / "hf", smaller / "tokenizer.json")
    with pytest.raises(ConfigError, match=r"gives '.*' id \d+, the data's tokenizer .*other.*\(write the data with"):
        same_tokenizer(tmp_path / "hf", other / "tokenizer.json")


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["llama", "gpt"])
def test_model_llama_or_gpt_takes_the_published_folders_shape(tmp_path, kind):
    """``model=llama`` / ``model=gpt`` name no preset: the shape is the folder's config.json's,
    written into the run's config.yaml (so that sample and a resume build it), and the run starts
    from the folder's weights; without a folder it is one line."""
    import yaml

    from trainrun.data.store_writer import write_token_store
    from trainrun.data.token_store import TokenStore

    documents = [f"The river {index} runs past the mill and the town of {index * 7}." for index in range(300)]
    store = write_token_store(documents[20:], documents[:20], tmp_path / "store", 300, kind="bpe")
    vocab = TokenStore.open(store, "train").vocab_size
    (saved_llama if kind == "llama" else saved_gpt2)(tmp_path / "hf", vocab=vocab)
    args = ["task=causal_lm", "data=token_stream", f"data.path={store}", f"model={kind}", "data.text.max_seq_len=32"]
    args += ["train_batch_size=4", "optimizer=adamw", "max_duration=2ba", "progress=false"]
    result = run_here(*args, f"model.weights={tmp_path / 'hf'}", f"hydra.run.dir={tmp_path / 'run'}")
    assert result.returncode == 0, result.stderr
    written = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["model"][kind]
    expected = {"layers": 2, "heads": 4, "width": 64}  # the context: the folder's max_position_embeddings
    llama = {"kv_heads": 2, "ffn_hidden": 96, "rope_factor": 32.0, "max_seq_len": 8193}
    expected |= llama if kind == "llama" else {"mlp": "gelu_tanh", "max_seq_len": 64}
    assert {key: written[key] for key in expected} == expected
    assert run_here("sample", str(tmp_path / "run"), "--prompt", "The river", "--tokens", "3").returncode == 0
    missing = run_here(*args, f"hydra.run.dir={tmp_path / 'other'}")
    assert missing.returncode == 2 and "has no config.json to read model=" in missing.stderr
