"""Models a user brings: any timm architecture, any transformers architecture, a module of their own,
trained a few steps each with the methods that apply to them (found in the built model), resumed,
exported, sharded, estimated, and refused in one line where they cannot run."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import assert_equal_to_summation_order, resume_after_step_6, run_here
from safetensors.torch import load_file

# a small image run on generated images (the torch loader): a few steps, one evaluation
IMAGES = ["data=synthetic", "data.num_samples=16", "data.val_samples=8", "train_batch_size=8", "eval_batch_size=8"]
IMAGES += ["max_duration=2ba", "progress=false"]

# one architecture a timm family, at a side it takes, with methods that change it
TIMM_FAMILIES = [
    ("resnet10t", 32, "blurpool,ghost_batchnorm,channels_last"),
    ("resnext26ts", 32, "blurpool,squeeze_excite"),
    ("convnext_atto", 64, "blurpool,stochastic_depth,ema"),
    ("efficientnet_b0", 32, "stochastic_depth,mixup"),
    ("mobilenetv3_small_050", 32, "blurpool,cutmix"),
    ("regnetx_002", 32, "blurpool,label_smoothing"),
    ("densenet121", 32, "blurpool,channels_last"),
    ("vit_tiny_patch16_224", 32, "stochastic_depth,low_precision_layernorm"),
    ("deit_tiny_patch16_224", 32, "stochastic_depth,label_smoothing,gated_linear_units"),
    ("swin_tiny_patch4_window7_224", 56, "stochastic_depth"),
    ("mixer_s16_224", 32, "stochastic_depth,low_precision_layernorm"),
    ("inception_v3", 75, "blurpool"),
]


def timm_run(arch: str, side: int, *more: str) -> list[str]:
    return [
        "model=timm",
        f"model.arch={arch}",
        *IMAGES,
        f"data.resolution={side}",
        f"data.eval_resolution={side}",
        *more,
    ]


@pytest.mark.slow
@pytest.mark.parametrize(("arch", "side", "methods"), TIMM_FAMILIES, ids=[family[0] for family in TIMM_FAMILIES])
def test_a_timm_family_trains_with_the_methods_that_apply_to_it(arch, side, methods, tmp_path):
    result = run_here(*timm_run(arch, side, f"algorithms=[{methods}]", f"hydra.run.dir={tmp_path}"))
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["batches"] == 2
    assert summary["provenance"]["model_source"]["file"].endswith(".py")  # timm's file of the architecture


def test_a_fixed_size_architecture_is_built_for_the_runs_side():
    from trainrun.models.timm_models import build
    from trainrun.schema import ModelConfig

    vit = build(ModelConfig(name="timm", arch="vit_tiny_patch16_224", num_classes=7, image_size=64))
    assert vit.patch_embed.img_size == (64, 64) and vit.head.out_features == 7
    convnext = build(
        ModelConfig(name="timm", arch="convnext_atto", num_classes=3, image_size=64, kwargs={"drop_path_rate": 0.1})
    )
    assert convnext.head.fc.out_features == 3 and convnext.stages[3].blocks[1].drop_path.drop_prob > 0


def test_stochastic_depth_sets_a_timm_models_own_drop_paths_by_depth():
    from torchvision.ops import StochasticDepth

    from trainrun.algorithms.specs.stochastic_depth import StochasticDepthConfig
    from trainrun.algorithms.stochastic_depth import apply_stochastic_depth
    from trainrun.models.timm_models import build
    from trainrun.schema import ModelConfig

    vit = build(ModelConfig(name="timm", arch="vit_tiny_patch16_224", image_size=32))
    changed = apply_stochastic_depth(vit, StochasticDepthConfig(drop_rate=0.24, distribution="linear"))
    assert len(changed) == 24 and all(isinstance(layer, StochasticDepth) for layer in changed)
    assert [vit.blocks[index].drop_path1.p for index in (0, 11)] == pytest.approx([0.02, 0.24])


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["model.arch=convnxt_tiny"], "'convnxt_tiny' is not in timm's registry; closest: convnext_tiny"),
        (["model.arch=resnet10t", "model.kwargs.widht=3"],
         "bad value for 'model.kwargs': timm.create_model('resnet10t') refuses it"),
        (["model.arch=convnext_atto"], "fails on the run's inputs (2, 3, 8, 8)"),
        (["model.arch=vit_tiny_patch16_224", "data.resolution=32"],
         "'data.eval_resolution': model=timm vit_tiny_patch16_224 fails on the evaluation's inputs (2, 3, 8, 8)"),
        (["model.arch=vit_tiny_patch16_224", "data.resolution=32", "data.eval_resolution=32",
          "algorithms=[progressive_resizing]"],
         "algorithm 'progressive_resizing' changes nothing in model=timm vit_tiny_patch16_224: it needs a model that"),
        (["model.arch=vit_tiny_patch16_224", "data.resolution=32", "data.eval_resolution=32", "algorithms=[blurpool]"],
         "algorithm 'blurpool' changes nothing in model=timm vit_tiny_patch16_224: it finds no strided convolutions"),
        (["model.arch=resnet10t", "model.weights=WEIGHTS"], "lacks the model's weight 'conv1.0.weight'"),
    ],
)  # fmt: skip
def test_a_timm_run_that_cannot_run_is_refused_in_one_line(args, line, tmp_path):
    weights = tmp_path / "other.safetensors"
    from safetensors.torch import save_file

    save_file({"fc.weight": torch.zeros(2, 2)}, weights)
    args = [arg.replace("WEIGHTS", str(weights)) for arg in args]
    result = run_here("model=timm", *args, f"hydra.run.dir={tmp_path / 'run'}")
    assert result.returncode == 2 and line in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_a_recipe_trains_a_timm_model_with_the_methods_that_apply(tmp_path):
    """``recipe=mild`` on a ViT: BlurPool finds nothing to blur, and progressive resizing a model built for
    one side: both are left out, saying so; the others stay (on a ConvNeXt, every one)."""
    args = ["recipe=mild", *timm_run("vit_tiny_patch16_224", 32), "data.eval_resize=null", "--cfg", "job"]
    result = run_here(*args)
    assert result.returncode == 0, result.stderr
    assert "the recipe's blurpool is left out: it finds no strided convolutions" in result.stderr
    assert "the recipe's progressive_resizing is left out: it needs a model that takes images of any side" in (
        result.stderr
    )
    assert "blurpool:" not in result.stdout and "progressive_resizing:" not in result.stdout
    assert "label_smoothing:" in result.stdout and "ema:" in result.stdout
    convnext = run_here("recipe=mild", *timm_run("convnext_atto", 64), "data.eval_resize=null", "--cfg", "job")
    assert convnext.returncode == 0 and "progressive_resizing:" in convnext.stdout, convnext.stderr


def test_a_recipe_none_of_whose_methods_applies_is_refused(tmp_path):
    recipe = tmp_path / "blurred.yaml"
    recipe.write_text("# @package _global_\ndefaults:\n  - override /algorithms: [blurpool]\n")
    args = [f"recipe={recipe}", *timm_run("vit_tiny_patch16_224", 32), f"hydra.run.dir={tmp_path / 'run'}"]
    result = run_here(*args)
    assert result.returncode == 2, result.stderr
    assert "none of the recipe's methods applies to model=timm vit_tiny_patch16_224 (blurpool finds no" in result.stderr
    assert result.stderr.count("\n") == 1 and result.stderr.rstrip().endswith(
        "algorithms=[] trains with the rest of the recipe"
    )
    rest = run_here(*args, "algorithms=[]", "--cfg", "job")  # the recipe's other settings, no method
    assert rest.returncode == 0 and "blurpool" not in rest.stdout, rest.stderr


@pytest.mark.slow
def test_a_timm_model_resumes_to_the_whole_runs_weights_and_exports_them(tmp_path):
    args = [*timm_run("convnext_atto", 64, "algorithms=[stochastic_depth]"), "data.num_samples=96", "eval_interval=5ba"]
    args = [arg for arg in args if arg != "max_duration=2ba"]
    whole, resumed = resume_after_step_6(args, tmp_path)
    assert_equal_to_summation_order(resumed["model"], whole["model"])
    exported = load_file(tmp_path / "whole" / "model.safetensors")
    assert exported.keys() == whole["model"].keys()
    again = run_here(*timm_run("convnext_atto", 64), f"model.weights={tmp_path / 'whole' / 'model.safetensors'}",
                     f"hydra.run.dir={tmp_path / 'again'}")  # fmt: skip
    assert again.returncode == 0, again.stderr


# a transformers language model small enough for a CPU, and the settings each architecture needs beside it
TINY = ["model.config.hidden_size=32", "model.config.intermediate_size=64", "model.config.num_hidden_layers=2"]
TINY += ["model.config.num_attention_heads=2"]
CAUSAL = [
    ("qwen3", ["model.config.num_key_value_heads=1", "model.config.head_dim=16"]),
    ("mistral", ["model.config.num_key_value_heads=1"]),
    ("gemma3_text", ["model.config.num_key_value_heads=1", "model.config.head_dim=16"]),
    ("phi3", []),
]
MASKED = [("modernbert", []), ("roberta", []), ("deberta-v2", [])]
TEXT = ["data.text.max_seq_len=32", "train_batch_size=8", "eval_batch_size=8", "optimizer=adamw", "progress=false"]


def tiny_transformers(arch: str, head: str, **settings: object) -> torch.nn.Module:
    """A transformers architecture at width 32, 2 layers, over a 64-token vocabulary."""
    from trainrun.data.interface import TextFacts
    from trainrun.models.hf_models import build
    from trainrun.schema import ModelConfig

    shape = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2}
    return build(
        ModelConfig(name="transformers", arch=arch, head=head, config=shape | settings), TextFacts(64, 16, None, 0)
    )


def causal_run(arch: str, extra: list[str]) -> list[str]:
    return ["task=causal_lm", "data=stdlib_stream", "model=transformers", f"model.arch={arch}", *TINY, *extra, *TEXT,
            "data.text.val_tokens=256"]  # fmt: skip


def masked_run(arch: str, extra: list[str]) -> list[str]:
    return ["task=masked_lm", "data=stdlib_docs", "model=transformers", f"model.arch={arch}", *TINY, *extra, *TEXT]


@pytest.mark.slow
@pytest.mark.parametrize(
    "args", [causal_run(*entry) for entry in CAUSAL] + [masked_run(*entry) for entry in MASKED],
    ids=[f"causal-{entry[0]}" for entry in CAUSAL] + [f"masked-{entry[0]}" for entry in MASKED],
)  # fmt: skip
def test_a_transformers_architecture_trains_and_exports_as_its_own_class(args, tmp_path):
    from transformers import AutoModel

    result = run_here(*args, "max_duration=2ba", "eval_interval=2ba", f"hydra.run.dir={tmp_path}")
    assert result.returncode == 0, result.stderr
    arch = next(arg.split("=")[1] for arg in args if arg.startswith("model.arch="))
    exported = AutoModel.from_pretrained(tmp_path / "hf_model")
    assert exported.config.model_type == arch and exported.config.hidden_size == 32


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["model.arch=qwn3"], "'qwn3' is not a model type transformers knows; closest: qwen3"),
        (["model.arch=qwen3", "model.config.hiden_size=8"],
         "'model.config.hiden_size': qwen3's config has no such setting (closest: hidden_size"),
        (["model.arch=qwen3", "model.config.hidden_act=nope"],
         "bad value for 'model.config': transformers' qwen3 refuses it: KeyError 'nope'"),
    ],
)  # fmt: skip
def test_a_transformers_run_that_cannot_run_is_refused_in_one_line(args, line, tmp_path):
    base = ["task=causal_lm", "data=stdlib_stream", "model=transformers", "data.text.max_seq_len=32"]
    result = run_here(*base, *args, f"hydra.run.dir={tmp_path}")
    assert result.returncode == 2 and line in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_a_transformers_setting_may_be_the_common_name_its_config_maps(tmp_path):
    """GPT-2's n_embd, n_layer and n_head are hidden_size, num_hidden_layers and num_attention_heads, as
    other configs name them (its attribute_map): either name is taken, and sets the same setting."""
    common = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2}
    args = ["task=causal_lm", "data=stdlib_stream", "model=transformers", "model.arch=gpt2", *TEXT, "--cfg", "job"]
    result = run_here(*args, *(f"model.config.{key}={value}" for key, value in common.items()))
    assert result.returncode == 0, result.stderr
    built = tiny_transformers("gpt2", "causal_lm", num_hidden_layers=3).model.config
    assert (built.n_layer, built.n_embd) == (3, 32)


def test_a_masked_task_needs_an_architecture_with_a_masked_head(tmp_path):
    result = run_here(*masked_run("qwen3", []), f"hydra.run.dir={tmp_path}")
    assert result.returncode == 2
    assert (
        "transformers has no AutoModelForMaskedLM for qwen3 (task masked_lm needs a ForMaskedLM head)" in result.stderr
    )


def test_a_mixture_of_experts_runs_its_experts_in_the_runs_precision():
    """torch's autocast has no rule for grouped products (a mixture of experts' experts): trainrun's
    precision gives them one, so their products read bf16 operands, as a dense layer's do, and the
    float32 weights still get their gradients."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from trainrun.core.precision import Precision

    class GroupedProducts(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.dtypes: set[torch.dtype] = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket is torch.ops.aten._grouped_mm:
                self.dtypes |= {args[0].dtype, args[1].dtype}
            return func(*args, **(kwargs or {}))

    model = tiny_transformers(
        "qwen3_moe",
        "causal_lm",
        num_key_value_heads=1,
        num_local_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
    )
    seen = GroupedProducts()
    with seen, Precision("bf16", "cpu", torch.bfloat16).autocast():
        logits = model(torch.randint(0, 64, (2, 16)))
    logits.float().sum().backward()
    experts = [parameter for name, parameter in model.named_parameters() if "experts" in name]
    assert seen.dtypes == {torch.bfloat16}
    assert experts and all(p.dtype == torch.float32 and p.grad is not None for p in experts)


def test_the_repeated_blocks_of_a_transformers_model_are_its_sharding_units():
    from trainrun.data.interface import TextFacts
    from trainrun.models.hf_models import build
    from trainrun.schema import ModelConfig

    config = ModelConfig(name="transformers", arch="modernbert", head="masked_lm",
                         config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 3,
                                 "num_attention_heads": 2})  # fmt: skip
    model = build(config, TextFacts(100, 32, None, 0))
    assert [type(block).__name__ for block in model.blocks] == ["ModernBertEncoderLayer"] * 3  # not the embeddings


def test_compile_compiles_a_transformers_model_block_by_block():
    """``compile=true`` on a transformers model compiles each of its repeated blocks in place (one graph
    they share), as for trainrun's own transformers; the model around them stays eager."""
    from trainrun.core.compiled import compile_model, is_compiled

    model = tiny_transformers("qwen3", "causal_lm", num_key_value_heads=1, head_dim=16)
    assert compile_model(model, print, backend="eager") is model and is_compiled(model)
    assert all(block._compiled_call_impl is not None for block in model.blocks) and len(model.blocks) == 2


@pytest.mark.slow
@pytest.mark.distributed
def test_fsdp_trains_a_transformers_model_to_ddps_weights(tmp_path):
    """Two ranks, the model's decoder layers sharded: the weights of the same run under DDP, and the
    sharded checkpoint consolidated as transformers' folder (``trainrun consolidate --hf``)."""
    args = [*causal_run(*CAUSAL[0]), "launcher.devices=2", "max_duration=3ba", "eval_interval=3ba", "optimizer=sgd"]
    for name, parallel in (("ddp", "parallel=ddp"), ("fsdp", "parallel=fsdp")):
        result = run_here(*args, parallel, f"hydra.run.dir={tmp_path / name}")
        assert result.returncode == 0, result.stderr
    ddp, fsdp = (load_file(tmp_path / name / "hf_model" / "model.safetensors") for name in ("ddp", "fsdp"))
    assert_equal_to_summation_order(fsdp, ddp)
    (sharded,) = (tmp_path / "fsdp" / "checkpoints").iterdir()  # a DCP folder of the ranks' shards
    consolidated = run_here("consolidate", str(sharded), "--hf", str(tmp_path / "consolidated"))
    assert consolidated.returncode == 0, consolidated.stderr
    assert "Qwen3ForCausalLM and its tokenizer" in consolidated.stdout
    assert_equal_to_summation_order(load_file(tmp_path / "consolidated" / "model.safetensors"), fsdp)


@pytest.mark.slow
def test_a_transformers_model_continues_from_a_folder_and_resumes(tmp_path):
    """``model.path``: the architecture and weights of an exported run; a resumed run ends at the whole
    run's weights."""
    first = run_here(
        *causal_run(*CAUSAL[0]), "max_duration=2ba", "eval_interval=2ba", f"hydra.run.dir={tmp_path / 'first'}"
    )
    assert first.returncode == 0, first.stderr
    folder = tmp_path / "first" / "hf_model"
    args = ["task=causal_lm", "data=stdlib_stream", "model=transformers", f"model.path={folder}", *TEXT,
            "eval_interval=5ba",
            "data.text.val_tokens=256"]  # fmt: skip
    whole, resumed = resume_after_step_6(args, tmp_path)
    assert_equal_to_summation_order(resumed["model"], whole["model"])
    started = load_file(folder / "model.safetensors")
    continued = run_here(
        *args, "max_duration=1ba", "optimizer.lr=1e-12", "eval_interval=1ba", f"hydra.run.dir={tmp_path / 'zero'}"
    )
    assert continued.returncode == 0, continued.stderr
    after = load_file(tmp_path / "zero" / "hf_model" / "model.safetensors")
    assert_equal_to_summation_order(after, started)  # one step at a learning rate of 1e-12: the folder's own weights


USER_MODULES = textwrap.dedent(
    """
    import torch
    from torch import nn


    class SmallConvNet(nn.Module):
        def __init__(self, num_classes: int, width: int = 8):
            super().__init__()
            self.features = nn.Sequential(
                nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
                nn.Conv2d(width, 2 * width, 3, stride=2, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
            )
            self.head = nn.Linear(2 * width, num_classes)

        def forward(self, images):
            return self.head(self.features(images))


    class BagOfWords(nn.Module):
        def __init__(self, vocab_size: int, width: int = 16):
            super().__init__()
            self.embed = nn.Embedding(vocab_size, width)
            self.mix = nn.Linear(width, width)
            self.head = nn.Linear(width, vocab_size)

        def forward(self, ids):
            return self.head(torch.relu(self.mix(self.embed(ids))))


    class WrongHead(nn.Module):
        def __init__(self):
            super().__init__()
            self.head = nn.Linear(3, 5)

        def forward(self, images):
            return self.head(images.mean((2, 3)))
    """
)


@pytest.fixture
def user_package(tmp_path, monkeypatch) -> Path:
    """A folder holding the user's own ``nets.py``, the working directory of their runs (a ``nets`` an
    earlier test of this process imported from its own folder forgotten)."""
    (tmp_path / "nets.py").write_text(USER_MODULES)
    monkeypatch.delitem(sys.modules, "nets", raising=False)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.slow
def test_a_module_of_the_users_own_classifies_images_resumes_and_records_its_source(user_package):
    args = ["model=module", "model.target=nets.SmallConvNet", "model.kwargs.width=16", *IMAGES, "data.resolution=16",
            "data.eval_resolution=16", "data.num_samples=96", "eval_interval=5ba",
            "algorithms=[blurpool,channels_last]"]  # fmt: skip
    args = [arg for arg in args if arg != "max_duration=2ba"]
    whole, resumed = resume_after_step_6(args, user_package)
    assert_equal_to_summation_order(resumed["model"], whole["model"])
    summary = json.loads((user_package / "whole" / "summary.json").read_text())
    assert summary["provenance"]["model_source"]["file"] == str((user_package / "nets.py").resolve())
    assert (user_package / "whole" / "model.safetensors").is_file()
    (user_package / "resumed" / "checkpoints" / "ep0-ba10.pt").unlink()
    (user_package / "nets.py").write_text(USER_MODULES + "\n# changed\n")
    again = run_here(
        *args,
        "max_duration=10ba",
        "checkpoint.interval=6ba",
        f"hydra.run.dir={user_package / 'resumed'}",
        "resume=auto",
    )
    assert again.returncode == 0, again.stderr
    notices = json.loads((user_package / "resumed" / "summary.json").read_text())["notices"]
    assert any("nets.py has changed since the checkpoint was written" in notice["text"] for notice in notices)


@pytest.mark.slow
def test_a_module_of_the_users_own_trains_as_a_causal_language_model(user_package):
    args = ["task=causal_lm", "data=stdlib_stream", "model=module", "model.target=nets.BagOfWords", *TEXT,
            "max_duration=2ba",
            "eval_interval=2ba", "data.text.val_tokens=256", f"hydra.run.dir={user_package / 'run'}"]  # fmt: skip
    result = run_here(*args)
    assert result.returncode == 0, result.stderr
    assert "no hf_model (the model has no transformers class)" in result.stdout


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["model.target=nets.WrongHead"],
         "model=module nets.WrongHead returns (2, 5) for the run's inputs; task image_classification scores (2, 10)"),
        (["model.target=nets.Missing"], "'nets.Missing' names nothing"),
        (["model.target=elsewhere.Net"], "'elsewhere.Net' does not import (ModuleNotFoundError"),
        (["model.target=nets.SmallConvNet", "model.kwargs.depth=3"],
         "nets.SmallConvNet refuses it: SmallConvNet.__init__() got an unexpected keyword argument 'depth'"),
        (["model.target=torch.zeros"], "'torch.zeros' names a builtin_function_or_method, not a torch.nn.Module class"),
    ],
)  # fmt: skip
def test_a_module_that_cannot_run_is_refused_in_one_line(args, line, user_package):
    result = run_here("model=module", *args, f"hydra.run.dir={user_package / 'run'}")
    assert result.returncode == 2 and line in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_what_a_brought_model_offers_is_found_in_its_build():
    from trainrun.kinds import Capability
    from trainrun.models.found import capabilities
    from trainrun.models.timm_models import build
    from trainrun.schema import ModelConfig

    vit = capabilities(build(ModelConfig(name="timm", arch="vit_tiny_patch16_224", image_size=32)))
    convnext = capabilities(build(ModelConfig(name="timm", arch="convnext_atto")))
    assert {Capability.TRANSFORMER_BLOCKS, Capability.LAYER_NORMS} <= vit
    assert {Capability.CONVOLUTIONS, Capability.IMAGE_CONVNET} <= convnext
    assert Capability.TRANSFORMER_BLOCKS not in convnext
    # Muon's own rule of roles: a ViT's patch convolution and class token are weights it cannot take
    assert Capability.HIDDEN_MATRICES not in vit | convnext


def test_a_model_whose_build_computes_with_its_weights_is_built_on_the_host_then_moved_to_meta():
    """A build the meta device cannot run (timm's ViTamin mixes a host tensor with a weight) is built
    as the run builds it, on the host, and checked on the meta device all the same."""
    from torch import nn

    from trainrun.models.found import built_on_meta

    class Computed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(4, 4)
            self.register_buffer("scale", torch.ones(4) * self.linear.weight.sum(0))

    model = built_on_meta(Computed)
    assert all(tensor.is_meta for tensor in [*model.parameters(), *model.buffers()])


def test_a_models_blocks_are_the_modules_its_blocks_list_or_hold_in_one_list():
    """``blocks`` as a list (a timm ViT's), as one module holding them (``nn.TransformerEncoder``: its
    layers), or as anything else (no blocks): FSDP2's units, checkpointing's, compile's regions."""
    from torch import nn

    from trainrun.core.compiled import compiled_regions
    from trainrun.core.parallel import repeated_blocks
    from trainrun.kinds import Capability
    from trainrun.models.found import capabilities

    class Net(nn.Module):
        def __init__(self, blocks: nn.Module) -> None:
            super().__init__()
            self.blocks = blocks

    encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 2, 32, batch_first=True), 3)
    held, plain = Net(encoder), Net(nn.Linear(16, 16))
    assert repeated_blocks(held) == list(encoder.layers) and compiled_regions(held) == list(encoder.layers)
    assert Capability.TRANSFORMER_BLOCKS in capabilities(held)
    assert repeated_blocks(plain) == [] and compiled_regions(plain) == [plain]
    assert Capability.TRANSFORMER_BLOCKS not in capabilities(plain)


def test_muon_is_refused_before_the_run_where_its_rule_of_roles_would_refuse_the_model(tmp_path):
    """A ViT has a 4-D patch convolution and a 3-D class token: refused in one line before the run (the
    optimizer's build had refused it inside the run), where a transformers model trains with Muon."""
    vit = run_here(*timm_run("vit_tiny_patch16_224", 32), "optimizer=muon", f"hydra.run.dir={tmp_path / 'vit'}")
    assert vit.returncode == 2 and "'muon' takes 2-D matrices" in vit.stderr and not (tmp_path / "vit").exists()
    qwen = run_here(*causal_run(*CAUSAL[0]), "optimizer=muon", "max_duration=1ba", "eval_interval=1ba",
                    f"hydra.run.dir={tmp_path / 'qwen'}")  # fmt: skip
    assert qwen.returncode == 0, qwen.stderr


def test_gated_linear_units_find_the_ungated_feed_forwards_of_any_model():
    """timm's Mlp (a ViT's, a Mixer's for tokens and channels), a Hugging Face encoder's intermediate and a user's
    Sequential(Linear, GELU, Linear) become GLUs that compute; Qwen3's block, gated already, is not found."""
    from trainrun.algorithms.gated_linear_units import apply_glu
    from trainrun.algorithms.specs.gated_linear_units import GatedLinearUnitsConfig
    from trainrun.models.glu import GatedIntermediate, feed_forwards
    from trainrun.models.timm_models import build as build_timm
    from trainrun.schema import ModelConfig

    vit = build_timm(ModelConfig(name="timm", arch="vit_tiny_patch16_224", num_classes=3, image_size=32))
    mixer = build_timm(ModelConfig(name="timm", arch="mixer_s16_224", num_classes=3, image_size=32))
    own = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.GELU(), torch.nn.Dropout(0.1), torch.nn.Linear(32, 8))
    for model, blocks, inputs in ((vit, 12, torch.randn(2, 3, 32, 32)), (mixer, 16, torch.randn(2, 3, 32, 32)),
                                  (own, 1, torch.randn(2, 8))):  # fmt: skip
        width = sum(param.numel() for param in model.parameters())
        assert apply_glu(model, GatedLinearUnitsConfig(), std=0.02) == blocks
        assert sum(isinstance(module, GatedIntermediate) for module in model.modules()) == blocks
        assert feed_forwards(model) == [] and sum(param.numel() for param in model.parameters()) > width
        assert model(inputs).isfinite().all()
    assert isinstance(vit.blocks[0].mlp.act, torch.nn.Identity) and isinstance(own[1], torch.nn.Identity)
    assert len(feed_forwards(tiny_transformers("roberta", "masked_lm"))) == 2
    assert feed_forwards(tiny_transformers("qwen3", "causal_lm", num_key_value_heads=1, head_dim=16)) == []


def test_gated_linear_units_on_a_model_gated_already_is_refused_in_one_line(tmp_path):
    result = run_here(*causal_run(*CAUSAL[0]), "algorithms=[gated_linear_units]", f"hydra.run.dir={tmp_path}")
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "'gated_linear_units' changes nothing in model=transformers qwen3: it needs ungated feed-forward" in (
        result.stderr
    )


def test_muon_gives_the_output_projection_a_brought_model_declares_to_adam():
    """A transformers model's ``lm_head`` and a timm classifier under another name (``head.fc``,
    ``classifier``) are the head, by what the model declares, not by the name ``head``."""
    from trainrun.optim.muon import parameter_roles

    qwen = tiny_transformers("qwen3", "causal_lm", num_key_value_heads=1, head_dim=16, tie_word_embeddings=False)
    roles = parameter_roles(qwen, ["head"])
    assert [name.rsplit(".", 1)[0].rsplit(".", 1)[-1] for name, _ in roles["head"]] == ["lm_head"]
    assert not any("lm_head" in name for name, _ in roles["matrices"])

    class Classifier(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body, self.classifier = torch.nn.Linear(4, 8), torch.nn.Linear(8, 3)

        def get_classifier(self) -> torch.nn.Module:
            return self.classifier

    head = parameter_roles(Classifier(), ["head"])["head"]
    assert [name for name, _ in head] == ["classifier.weight", "classifier.bias"]


@pytest.mark.slow
def test_trainrun_estimate_sizes_a_brought_model(tmp_path):
    args = ["estimate", "model=timm", "model.arch=vit_base_patch16_224", "data=imagenet_ffcv", "data.resolution=224",
            "train_batch_size=256", "max_duration=100ba", "launcher.devices=8", "hardware=8xa100_aws",
            "precision=bf16", "--json"]  # fmt: skip
    result = run_here(*args)
    assert result.returncode == 0, result.stderr
    estimate = json.loads(result.stdout)
    # ViT-B/16 at 224 px: 17.6 GMACs a forward pass (timm's table), 2 FLOPs a MAC, three passes' worth a sample
    assert estimate["step_flops"] / 256 == pytest.approx(3 * 2 * 17.6e9, rel=0.02)


TIMM_IMPORT_WHILE_OTHERS_PARSE = """
import ast, threading, time, weakref
stop = threading.Event()

def parse_deeper(depth):
    return parse_deeper(depth - 1) if depth else ast.parse("x = 1\\n" * 50)

def parse_until_stopped():  # another thread parsing, as numba's compiler does
    while not stop.is_set():
        try:
            parse_deeper(16)
        except SystemError:
            pass
        time.sleep(0.0005)

class Cycle:
    pass

def garbage_until_stopped():  # garbage whose collection runs Python code
    while not stop.is_set():
        for _ in range(50):
            cycle = Cycle()
            cycle.itself = cycle
            weakref.finalize(cycle, sum, range(100)).atexit = False
            del cycle
        time.sleep(0.0005)

threads = [threading.Thread(target=work) for work in (parse_until_stopped, garbage_until_stopped)]
for thread in threads:
    thread.start()
try:
    from trainrun.models.timm_models import timm_library
    timm_library()
finally:
    stop.set()
    for thread in threads:
        thread.join()
"""


def test_timm_is_imported_while_other_threads_parse_python(tmp_path):
    """timm's import parses Python (pydantic reads W&B's settings' source for its docstrings); with
    another thread parsing and garbage collected inside it, CPython 3.11 failed it with 'AST
    constructor recursion depth mismatch' (four tries of four here, and twice in make test-bench's
    forward/backward bench) unless the collector was paused. A fresh interpreter: timm not imported."""
    script = tmp_path / "import_timm.py"
    script.write_text(TIMM_IMPORT_WHILE_OTHERS_PARSE)
    imported = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert imported.returncode == 0, imported.stderr[-2000:]
