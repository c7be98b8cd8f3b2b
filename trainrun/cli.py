"""``trainrun``: dispatch argv to training (Hydra) or a subcommand (write, sweep, report).

The config is composed and validated (:mod:`trainrun.config`) before any heavy import or process
start; then Hydra's own entry point runs the job (``--cfg``, ``--help``, ``-m`` multirun all
work as in Hydra).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from trainrun.config import (
    AUTO_RECIPE,
    NO_RUN_FLAGS,
    OPTIMIZE_FLAG,
    PRINT_FLAGS,
    ConfigSource,
    check,
    compose,
    locate,
    register_schema,
    translate,
)
from trainrun.errors import ConfigError, report_error
from trainrun.provenance import record_command
from trainrun.schema import DataConfig, validate
from trainrun.versions import check_requirements


def _job(cfg: DictConfig, debug: bool) -> None:
    """Hydra's task function: validate again (cheap) and train in the job's output directory."""
    from hydra.core.hydra_config import HydraConfig

    try:
        config = validate(cfg)
        run_dir = Path(HydraConfig.get().runtime.output_dir)
        from trainrun.launch import launch

        launch(config, run_dir, OmegaConf.to_yaml(cfg, resolve=True), debug)
    except KeyboardInterrupt:
        print("trainrun: interrupted", file=sys.stderr)
        raise SystemExit(130) from None
    except Exception as error:
        raise SystemExit(report_error(error, debug)) from None


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``trainrun`` console script."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        check_requirements()
    except ImportError as error:  # a package below trainrun's floor: one line, before any work
        print(f"trainrun: error: {error}", file=sys.stderr)
        return 2
    record_command(argv)
    debug = "--debug" in argv
    if argv and argv[0] in SUBCOMMANDS:
        try:
            return SUBCOMMANDS[argv[0]]([a for a in argv[1:] if a != "--debug"])
        except KeyboardInterrupt:
            print("trainrun: interrupted", file=sys.stderr)
            return 130
        except Exception as error:
            return report_error(error, debug)
    try:
        hydra_args, overrides, debug = translate(argv)
        source, hydra_args, overrides = locate(hydra_args, overrides)
        optimize = OPTIMIZE_FLAG in hydra_args
        if optimize or AUTO_RECIPE in overrides:
            hydra_args = [a for a in hydra_args if a != OPTIMIZE_FLAG]
            if hydra_args:
                raise ConfigError(
                    f"recipe=auto and -o1 decide one training run: they do not combine with '{hydra_args[0]}'"
                )
            from rich.console import Console

            from trainrun.choose import before_run

            overrides = before_run(overrides, source, optimize, Console(highlight=False))
        if not NO_RUN_FLAGS & set(hydra_args):
            multirun = bool({"-m", "--multirun"} & set(hydra_args))
            check(overrides, multirun, files=not PRINT_FLAGS & set(hydra_args), source=source)
    except Exception as error:
        return report_error(error, debug)
    return _run_hydra(hydra_args + source.overrides(overrides), debug, source)


def _run_hydra(args: list[str], debug: bool, source: ConfigSource) -> int:
    import hydra

    register_schema()

    @hydra.main(version_base="1.3", config_path=str(source.primary), config_name=source.name)
    def entry(cfg: DictConfig) -> None:
        _job(cfg, debug)

    saved_argv = sys.argv
    sys.argv = ["trainrun", *args]
    try:
        entry()
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    finally:
        sys.argv = saved_argv
    return 0


def write_command(argv: list[str]) -> int:
    """``trainrun write SRC OUT.beton``: an image folder or a built-in set to an FFCV file."""
    import argparse

    from trainrun.data.write import WriteSettings

    defaults = WriteSettings()
    parser = argparse.ArgumentParser(
        prog="trainrun write",
        description="Write an ImageFolder tree (SRC/<class>/*.jpg) or a built-in set (digits, mnist5k, "
        "synthetic) to an FFCV .beton with an RGB 'image' and an integer 'label' field.",
    )
    parser.add_argument("source", help="a folder of class folders, or digits | mnist5k | synthetic")
    parser.add_argument("out", type=Path, help="the .beton file to write (atomically)")
    parser.add_argument("--mode", choices=["raw", "jpg", "proportion"], default=defaults.mode)
    parser.add_argument("--max-resolution", type=int, default=defaults.max_resolution)
    parser.add_argument("--jpeg-quality", type=int, default=defaults.jpeg_quality)
    parser.add_argument("--compress-probability", type=float, default=defaults.compress_probability)
    parser.add_argument("--workers", type=int, default=defaults.num_workers)
    parser.add_argument("--split", choices=["train", "val"], default="train", help="built-in sets: which split")
    parser.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    parser.add_argument("overrides", nargs="*", help="data.* overrides for built-in sets, e.g. data.num_samples=4096")
    args = parser.parse_args(argv)
    if args.out.exists() and not args.overwrite:
        raise ConfigError(f"'{args.out}' exists; pass --overwrite to replace it")
    if not 0 <= args.compress_probability <= 1:
        raise ConfigError(f"bad value for '--compress-probability': {args.compress_probability} (0 to 1)")
    settings = WriteSettings(
        mode=args.mode,
        max_resolution=args.max_resolution,
        jpeg_quality=args.jpeg_quality,
        compress_probability=args.compress_probability,
        num_workers=args.workers,
    )
    from rich.console import Console

    from trainrun.data.write import source_dataset, write_beton

    console = Console(highlight=False)
    builtin = _builtin_data_config(args.source, args.overrides)
    console.print(f"reading {args.source} ({args.split} split)" if builtin else f"reading image folder {args.source}")
    write_beton(source_dataset(args.source, args.split, builtin), args.out, settings, console)
    return 0


def write_text_command(argv: list[str]) -> int:
    """``trainrun write-text CORPUS STORE``: a text corpus to a token store for masked-LM training."""
    import argparse

    from trainrun.data.token_store import BUILTIN_CORPORA, TOKEN_DTYPES, check_token_dtype

    parser = argparse.ArgumentParser(
        prog="trainrun write-text",
        description="Tokenize a corpus (a .txt file of blank-line-separated documents, a .jsonl file of "
        f'{{"text": ...}} lines, a folder of such files, or {", ".join(BUILTIN_CORPORA)}) into a token store: '
        "a WordPiece tokenizer trained on the training documents (or --tokenizer), token ids per split.",
    )
    parser.add_argument("corpus", help="a file, a folder, or " + " | ".join(BUILTIN_CORPORA))
    parser.add_argument("out", type=Path, help="the token store (a folder) to write, atomically")
    parser.add_argument("--vocab-size", type=int, default=DataConfig().vocab_size, help="WordPiece vocabulary to train")
    parser.add_argument("--tokenizer", type=Path, help="a tokenizer.json (Hugging Face tokenizers) to use instead")
    parser.add_argument("--val-fraction", type=float, default=0.05, help="documents held out for evaluation")
    parser.add_argument("--split-seed", type=int, default=0)
    parser.add_argument(
        "--dtype", choices=["auto", *TOKEN_DTYPES], default="auto", help="token id type (auto: the smallest that fits)"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    args = parser.parse_args(argv)
    if args.out.exists() and not args.overwrite:
        raise ConfigError(f"'{args.out}' exists; pass --overwrite to replace it")
    if args.dtype != "auto" and args.tokenizer is None:
        check_token_dtype(args.vocab_size, args.dtype)
    if not 0 < args.val_fraction < 1:
        raise ConfigError(f"bad value for '--val-fraction': {args.val_fraction} (between 0 and 1)")
    if args.vocab_size < 16:
        raise ConfigError(f"bad value for '--vocab-size': {args.vocab_size} (at least 16)")
    if args.tokenizer is not None and not args.tokenizer.is_file():
        raise ConfigError(f"bad value for '--tokenizer': '{args.tokenizer}' does not exist")
    from rich.console import Console

    from trainrun.data.token_store import read_documents, split_documents, write_token_store

    console = Console(highlight=False)
    console.print(f"reading {args.corpus}")
    documents = read_documents(args.corpus)
    train, val = split_documents(documents, args.val_fraction, args.split_seed)
    console.print(f"tokenizing {len(train):,} training and {len(val):,} validation documents")
    write_token_store(train, val, args.out, args.vocab_size, args.tokenizer, args.dtype)
    meta = json.loads((args.out / "store.json").read_text())
    console.print(
        f"wrote {meta['train']['tokens']:,} training and {meta['val']['tokens']:,} validation tokens "
        f"(vocabulary {meta['vocab_size']:,}, {meta['dtype']}) to {args.out}"
    )
    return 0


def _builtin_data_config(source: str, overrides: list[str]):
    """The data config of built-in set ``source`` (None for a folder), with ``data.*`` overrides."""
    from trainrun.schema import DATA_NAMES

    if source not in DATA_NAMES:
        return None
    return validate(compose([f"data={source}", *overrides])).data


def sweep_command(argv: list[str]) -> int:
    """``trainrun sweep [OVERRIDES] budgets=[...] [seeds=[...]] [out=DIR]``: a recipe over budgets."""
    from trainrun.sweep import run_sweep

    return run_sweep(argv)


def report_command(argv: list[str]) -> int:
    """``trainrun report DIR...``: trade-off curves, time/cost to accuracy, bottlenecks."""
    from trainrun.report.build import report_command as build_report

    return build_report(argv)


SUBCOMMANDS = {
    "write": write_command,
    "write-text": write_text_command,
    "sweep": sweep_command,
    "report": report_command,
}
