"""The estimate's forward and training step of timm models against timm's published inference and
training rates of the same models on one RTX 3090: where a model's error lies, forward or backward.

timm published both for the same GPU and software (PyTorch 1.12, CUDA 11.3, AMP, channels-last):
results/benchmark-train-amp-nhwc-pt112-cu113-rtx3090.csv, and the inference file of the same run,
results/benchmark-infer-amp-nhwc-pt112-cu113-rtx3090.csv (batch 1024; in timm's history before its
commit ef570e26). The estimate's forward is an evaluation forward's operations at the training
batch, its step the validation's (bench/published_times.yaml's timm_3090 settings), both on
``hardware=1xrtx3090``. A training step takes about three of its forwards where its backward is
the forward's products again, twice; the published ratio says where a model's backward runs slower
than that, which its estimate (whose ratio is its own operations') does not see.

    .venv/bin/python bench/forward_backward.py [--models resnet50 efficientnet_b0 ...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from estimate_validation import composed, rows  # noqa: E402

# model: (inference img/s, training img/s, training batch), from the two files above
PUBLISHED = {
    "resnet50": (3676.35, 1218.01, 512),
    "resnext50_32x4d": (3092.67, 1001.03, 384),
    "convnext_tiny": (2379.5, 819.24, 256),
    "vit_base_patch16_224": (1133.45, 392.99, 192),
    "efficientnet_b0": (8015.36, 1751.72, 512),
    "mobilenetv2_100": (9591.46, 2313.1, 512),
    "mobilenetv3_large_100": (12955.77, 2732.43, 512),
    "regnetx_004": (10946.78, 1780.61, 512),
    "regnetx_016": (3808.7, 682.73, 512),
    "regnety_016": (3516.07, 650.07, 512),
}


def timm_settings() -> list[str]:
    """The validation's settings of timm's RTX 3090 rows (model and batch apart)."""
    return next(row["overrides"] for row in rows() if row["id"] == "timm_3090_resnet50")


def estimated_ms(model: str, batch: int) -> tuple[float, float]:
    """The estimate's forward and training step of ``model`` at ``batch``, in ms a sample."""
    from trainrun.estimate import run_shape, sized_task
    from trainrun.estimate.device import device_of
    from trainrun.estimate.memory import pass_operations

    config = composed([*timm_settings(), f"model.arch={model}", f"train_batch_size={batch}"])
    shape, task, device = run_shape(config, None, 1.0), sized_task(config), device_of(config)
    forward = pass_operations(config, task, None, shape.micro_batch, train=False)
    step = pass_operations(config, task, None, shape.micro_batch, shape.checkpointing)
    return (device.seconds(forward) * 1e3 / shape.micro_batch, device.seconds(step) * 1e3 / shape.micro_batch)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", choices=sorted(PUBLISHED), help="only these (default: all)")
    chosen = parser.parse_args().models or list(PUBLISHED)
    columns = ["model", "forward: published / estimated", "step: published / estimated"]
    print("| " + " | ".join([*columns, "step / forward: published", "estimated"]) + " |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for model in chosen:
        inference, training, batch = PUBLISHED[model]
        forward, step = estimated_ms(model, batch)
        published_forward, published_step = 1e3 / inference, 1e3 / training
        print(
            f"| {model} | {published_forward / forward:.2f} | {published_step / step:.2f} | "
            f"{published_step / published_forward:.2f} | {step / forward:.2f} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
