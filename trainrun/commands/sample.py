"""``trainrun sample RUN --prompt TEXT``: a continuation from a finished causal-LM run.

The run's own ``config.yaml`` rebuilds its model (GPT or Llama) over its data's vocabulary, the
newest checkpoint in ``RUN/checkpoints`` (one file, or a sharded run's folder) gives the weights (a
GPT trained with ALiBi has no position table, and is rebuilt so), and the data's tokenizer (a
store's, or token shards' ``data.shards.tokenizer``) encodes the prompt and decodes the reply.
Tokens are drawn one at a time from the last ``data.text.max_seq_len`` tokens' next-token
distribution at ``--temperature`` among the ``--top-k`` likeliest (temperature 0: the likeliest),
seeded by ``--seed``, until ``--tokens`` are drawn or the document separator is."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from omegaconf import OmegaConf

from trainrun import run_files
from trainrun.atomic_io import read_yaml
from trainrun.core.checkpoint import directory, is_sharded, list_checkpoints, load_checkpoint
from trainrun.core.distributed import SINGLE_PROCESS
from trainrun.errors import ConfigError
from trainrun.kinds import Capability, task_spec, tasks_offering
from trainrun.schema import TrainConfig
from trainrun.validation import validate


def sample_command(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="trainrun sample", description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a finished (or checkpointed) run of task=causal_lm")
    parser.add_argument("--prompt", required=True, help="the text to continue")
    parser.add_argument("--tokens", type=int, default=60, help="the most tokens to draw")
    parser.add_argument("--temperature", type=float, default=0.8, help="0: always the likeliest token")
    parser.add_argument("--top-k", type=int, default=40, help="draw among this many likeliest tokens")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.tokens < 1 or args.top_k < 1 or args.temperature < 0:
        raise ConfigError(
            "bad value for '--tokens', '--top-k' or '--temperature': tokens, top-k >= 1; temperature >= 0"
        )
    model, tokenizer, separator, context = load_run(args.run)
    prompt = tokenizer.encode(args.prompt).ids
    if not prompt:
        raise ConfigError(f"bad value for '--prompt': {args.prompt!r} has no token in this run's vocabulary")
    generator = torch.Generator().manual_seed(args.seed)
    drawn = continuation(model, prompt, args.tokens, context, args.temperature, args.top_k, separator, generator)
    print(args.prompt + continued_text(tokenizer, prompt, drawn))
    return 0


def continued_text(tokenizer, prompt: list[int], drawn: list[int]) -> str:
    """The text ``drawn`` adds after ``prompt``, spaced as the tokenizer decodes the two together (a
    WordPiece decoder puts a space between words; a byte-level BPE token carries its own)."""
    whole = tokenizer.decode(prompt + drawn, skip_special_tokens=True)
    before = tokenizer.decode(prompt, skip_special_tokens=True)
    if whole.startswith(before):
        return whole[len(before) :]
    return " " + tokenizer.decode(drawn, skip_special_tokens=True)


def load_run(run: Path):
    """(the run's model with its newest checkpoint's weights as its evaluation saw them (EMA's
    average where it ran), in evaluation mode; its store's tokenizer and document separator; the
    longest context it was trained on)."""
    from trainrun.data.token_store import load_tokenizer

    config = run_config(run)
    checkpoints = list_checkpoints(directory(run))
    if not checkpoints:
        raise ConfigError(f"bad value for 'RUN': '{run}' has no checkpoint in {directory(run)}")
    model, text = run_model(config, run, checkpoints[-1])
    return model.eval(), load_tokenizer(text.tokenizer_file), text.separator, text.max_seq_len


def run_config(run: Path, command: str = "sample", key: str = "RUN") -> TrainConfig:
    """Causal-LM run ``run``'s validated config, or one line saying why ``run`` is not one (naming
    ``key`` of ``trainrun command``)."""
    config_file = run / run_files.CONFIG
    if not config_file.is_file():
        raise ConfigError(f"bad value for '{key}': '{run}' has no {run_files.CONFIG} (not a trainrun run directory)")
    config = validate(OmegaConf.create(read_yaml(config_file)), files=False)
    if Capability.CAUSAL_SEQUENCES not in task_spec(config.task.name).offers:
        generating = " or ".join(tasks_offering({Capability.CAUSAL_SEQUENCES}))
        task = config.task.name
        raise ConfigError(f"bad value for '{key}': '{run}' trained task {task}; {command} needs {generating}")
    return config


def run_model(config: TrainConfig, run: Path, path: Path):
    """(run ``run``'s model with checkpoint ``path``'s weights (one file or shards) as its
    evaluations saw them; the run's text facts, its tokenizer file among them)."""
    from trainrun.algorithms import build_algorithms
    from trainrun.core.sharded_checkpoint import whole_weights
    from trainrun.data.interface import datasets

    text = datasets(config.data, SINGLE_PROCESS, augment=False).text
    if text.tokenizer_file is None:
        raise ConfigError(
            f"bad value for 'RUN': '{run}' read token shards without data.shards.tokenizer (sample needs it)"
        )
    from trainrun.run import model_holding

    payload = load_checkpoint(path)
    model = model_holding(config, text, whole_weights(path) if is_sharded(path) else payload["model"])
    for method in build_algorithms(config.algorithms):  # what each method's evaluations saw (EMA's average)
        method.restore_evaluated(model, payload["algorithms"].get(method.name, {}))
    return model, text


@torch.no_grad()
def continuation(
    model: torch.nn.Module,
    prompt: list[int],
    count: int,
    context: int,
    temperature: float,
    top_k: int,
    stop: int | None,
    generator: torch.Generator,
) -> list[int]:
    """Up to ``count`` token ids drawn after ``prompt`` (ending early at ``stop``)."""
    tokens, drawn = list(prompt), []
    for _ in range(count):
        logits = model(torch.tensor([tokens[-context:]]))[0, -1]
        if temperature == 0:
            token = int(logits.argmax())
        else:
            top = torch.topk(logits / temperature, min(top_k, logits.numel()))
            token = int(top.indices[torch.multinomial(top.values.softmax(-1), 1, generator=generator)])
        if token == stop:
            break
        tokens.append(token)
        drawn.append(token)
    return drawn
