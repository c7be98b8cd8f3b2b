"""``trainrun consolidate CHECKPOINT``: a sharded checkpoint (``parallel=fsdp``) as one file, and
with ``--hf DIR`` its model as a ``transformers`` folder.

The one file is a trainrun checkpoint like those ``parallel=ddp`` writes (the weights whole, the
optimizer state keyed by weight name): ``resume=``, ``model.weights=`` and ``trainrun sample`` read
it on one process. Every rank's shards are read in this one process, so it needs the host memory
of the whole model and its optimizer state (an 8B model under AdamW: about 100 GB; ``--weights-only``
leaves the optimizer out: about 32 GB).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from trainrun.core.checkpoint import atomic_torch_save
from trainrun.errors import ConfigError


def consolidate_command(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="trainrun consolidate", description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", type=Path, help="a sharded checkpoint: RUN/checkpoints/epE-baB")
    parser.add_argument("--output", type=Path, help="the one file (default: RUN/epE-baB.pt)")
    parser.add_argument("--weights-only", action="store_true", help="leave the optimizer state out")
    parser.add_argument("--hf", type=Path, metavar="DIR", help="also write the model as transformers' folder")
    args = parser.parse_args(argv)
    from trainrun.core import sharded_checkpoint

    path = args.checkpoint
    if not path.is_dir():
        raise ConfigError(f"bad value for 'CHECKPOINT': '{path}' is not a sharded checkpoint folder")
    run = path.parent.parent
    output = args.output or run / f"{path.name}.pt"
    payload = sharded_checkpoint.one_file(path, with_optimizer=not args.weights_only)  # one line if incomplete
    atomic_torch_save(payload, output)
    print(f"wrote {output} ({len(payload['model'])} weights{'' if args.weights_only else ' and optimizer state'})")
    if args.hf:
        from trainrun.commands.sample import run_config, run_model

        model, text = run_model(run_config(run), run, path)
        unwritten = model.export_pretrained(text.tokenizer_file, text.separator, args.hf)
        if unwritten:
            raise ConfigError(f"bad value for '--hf': {unwritten}")
        print(f"wrote {args.hf} ({model.transformers_class} and its tokenizer, for transformers' from_pretrained)")
    return 0
