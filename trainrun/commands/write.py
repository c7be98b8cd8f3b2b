"""``trainrun write``: an image folder or a built-in set written once to an FFCV .beton for fast loading.

The command parses its own arguments (defaults from the writer it drives) and calls
:mod:`trainrun.data.write`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from trainrun.data.write import WriteSettings, source_dataset, write_beton
from trainrun.errors import ConfigError
from trainrun.run_files import check_output_file


def write_command(argv: list[str]) -> int:
    """``trainrun write SRC OUT.beton``: an image folder or a built-in set to an FFCV file."""
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
    args = parser.parse_intermixed_args(argv)  # overrides before and after the flags
    check_output_file("OUT", args.out)
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
    console = Console(highlight=False)
    builtin = _builtin_data_config(args.source, args.overrides)
    console.print(f"reading {args.source} ({args.split} split)" if builtin else f"reading image folder {args.source}")
    write_beton(source_dataset(args.source, args.split, builtin), args.out, settings, console)
    return 0


def _builtin_data_config(source: str, overrides: list[str]):
    """The data config of built-in set ``source`` (None for a folder), with ``data.*`` overrides."""
    from trainrun.config import compose
    from trainrun.registry import names
    from trainrun.validation import validate

    if source not in names("data"):
        return None
    return validate(compose([f"data={source}", *overrides])).data
