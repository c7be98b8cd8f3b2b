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
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from trainrun.core.checkpoint import atomic_torch_save
from trainrun.errors import ConfigError
from trainrun.run_files import check_output_dir, check_output_file

if TYPE_CHECKING:
    from trainrun.schema import TrainConfig


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
    check_output_file("--output", output)  # a folder that cannot be made: one line, before any work
    config = None
    if args.hf:
        check_output_dir("--hf", str(args.hf))  # a file there, or in its way: one line
        from trainrun.commands.sample import run_config

        config = run_config(run, "consolidate --hf", "CHECKPOINT")  # a causal-LM run, before the shards are read
    payload = sharded_checkpoint.one_file(path, with_optimizer=not args.weights_only)  # one line if incomplete
    written_hf = export_hf(config, run, path, args.hf) if config else None  # atomic: whole or not at all
    try:
        atomic_torch_save(payload, output)
    except BaseException:  # a consolidation that fails leaves nothing it wrote
        if written_hf is not None:
            shutil.rmtree(args.hf, ignore_errors=True)
        raise
    print(f"wrote {output} ({len(payload['model'])} weights{'' if args.weights_only else ' and optimizer state'})")
    if written_hf:
        print(f"wrote {args.hf} ({written_hf} and its tokenizer, for transformers' from_pretrained)")
    return 0


def export_hf(config: TrainConfig, run: Path, path: Path, directory: Path) -> str:
    """Write checkpoint ``path`` of ``run`` (trained with ``config``) as transformers' folder
    ``directory``; its class name."""
    from trainrun.commands.sample import run_model

    model, text = run_model(config, run, path)
    unwritten = model.export_pretrained(text.tokenizer_file, text.separator, directory)
    if unwritten:
        raise ConfigError(f"bad value for '--hf': {unwritten}")
    return model.transformers_class
