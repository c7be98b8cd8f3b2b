"""Reading a published folder into a model (``model.weights=FOLDER``): the host memory it adds.

A random ``LlamaForCausalLM`` of ``--width`` x ``--layers`` (vocabulary ``--vocab``) is saved by
``transformers`` in shards of ``--shard`` (kept in OUT between runs), then each side builds
trainrun's Llama of that shape in its own process and loads the folder into it:

- ``trainrun``: ``load_weights`` as a run does (a tensor at a time, where it lies in the files);
- ``whole files``: every safetensors file read whole first (``safetensors.torch.load_file``), then
  ``load_state_dict``, as a loader that reads the folder before setting the model does.

Each prints the process's peak resident memory after building the model and after loading, and
the memory the load added; the ratio of the two is printed last.

    .venv/bin/python bench/published_load.py OUT [--width 1024] [--layers 16] [--vocab 32000] [--shard 200MB]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

SIDE = """
import glob, json, resource, sys
from trainrun.models.llama import Llama
from trainrun.models.llama_export import hf_name
from trainrun.models.weights import load_weights
from trainrun.schema import LlamaConfig
folder, side, shape = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
model = Llama(LlamaConfig(**shape["llama"]), shape["vocab"])
built = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
if side == "whole files":
    from safetensors.torch import load_file
    state = {}
    for file in sorted(glob.glob(folder + "/*.safetensors")):
        state |= load_file(file)
    model.load_state_dict({name: state[hf_name(name)] for name in model.state_dict()})
else:
    load_weights(model, folder)
print(json.dumps({"built": built, "loaded": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}))
"""


def saved_folder(out: Path, shape: dict, shard: str) -> Path:
    """The random Llama of ``shape`` saved by transformers in ``out`` (written once)."""
    folder = out / f"llama-{shape['llama']['width']}x{shape['llama']['layers']}-{shape['vocab']}-{shard}"
    if (folder / "config.json").is_file():
        return folder
    import torch
    from transformers import LlamaForCausalLM

    from trainrun.models.llama_export import hf_llama_config
    from trainrun.schema import LlamaConfig

    torch.manual_seed(0)
    LlamaForCausalLM(hf_llama_config(LlamaConfig(**shape["llama"]), shape["vocab"])).save_pretrained(
        folder, max_shard_size=shard
    )
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--shard", default="200MB")
    args = parser.parse_args()
    heads = max(1, args.width // 64)
    llama = {"layers": args.layers, "heads": heads, "kv_heads": max(1, heads // 4), "width": args.width}
    shape = {"llama": {**llama, "ffn_hidden": args.width * 11 // 4}, "vocab": args.vocab}
    folder = saved_folder(args.out, shape, args.shard)
    files = sorted(folder.glob("*.safetensors"))
    size = sum(file.stat().st_size for file in files) / 2**30
    print(f"{folder.name}: {len(files)} safetensors file(s), {size:.2f} GB")
    print("| side | peak GB, model built | peak GB, loaded | added GB |")
    print("|---|---|---|---|")
    added = {}
    for side in ("trainrun", "whole files"):
        command = [sys.executable, "-c", SIDE, str(folder), side, json.dumps(shape)]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"{side} failed:\n{done.stderr}")
        result = json.loads(done.stdout.strip().splitlines()[-1])
        added[side] = result["loaded"] - result["built"]
        print(f"| {side} | {result['built']:.2f} | {result['loaded']:.2f} | {added[side]:.2f} |")
    print(f"whole files / trainrun, memory added: {added['whole files'] / max(added['trainrun'], 1e-3):.1f}x")


if __name__ == "__main__":
    main()
