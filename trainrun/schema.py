"""The typed schema every composed config is validated against before any work starts.

This module imports neither torch nor torchvision, so that a bad key, type or value fails in a
fraction of a second. Field metadata carries the checks OmegaConf cannot express:
``time`` (a :class:`~trainrun.core.time.Time` string), ``choices``, ``min`` and ``exclusive_min``.
Each algorithm's hyperparameters are a dataclass registered in :data:`ALGORITHM_CONFIGS`; the
module under ``trainrun/algorithms/`` of the same name builds the algorithm from it.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from trainrun.core.time import Time, TimeUnit
from trainrun.errors import ConfigError


def _time(default: str | None) -> Any:
    return field(default=default, metadata={"time": True})


def _interval(default: str | None) -> Any:
    """A time between recurring events: zero would never fire."""
    return field(default=default, metadata={"time": True, "interval": True})


def _choice(default: str, *choices: str) -> Any:
    return field(default=default, metadata={"choices": choices})


def _positive(default: Any) -> Any:
    return field(default=default, metadata={"exclusive_min": 0})


def _non_negative(default: Any) -> Any:
    return field(default=default, metadata={"min": 0})


MODEL_NAMES = ("resnet_small", "resnet18", "resnet34", "resnet50", "resnet101", "bert")
INITIALIZERS = ("kaiming_normal", "bn_uniform", "linear_log_constant_bias")
DATA_NAMES = ("digits", "mnist5k", "synthetic", "folder", "beton", "text")
TASK_NAMES = ("image_classification", "masked_lm")
LOGGER_NAMES = ("tensorboard",)  # beside metrics.jsonl, steps.jsonl and the console, which every run has


@dataclass
class TaskConfig:
    """The kind of problem (conf/task/, trainrun/tasks/): inputs, losses, metrics and the quality metric."""

    name: str = _choice("image_classification", *TASK_NAMES)


@dataclass
class ModelConfig:
    """Which network to build and how to initialise it."""

    name: str = _choice("resnet_small", *MODEL_NAMES)
    num_classes: int = _positive(10)
    initializers: list[str] = field(default_factory=lambda: list(INITIALIZERS))
    width: int = _positive(32)  # resnet_small only: channels of the first stage
    blocks: list[int] = field(default_factory=lambda: [1, 1, 1])  # resnet_small: blocks per stage
    norm: str = _choice("batch", "batch", "group")  # resnet_small: group norm is independent of the batch
    # bert: Hugging Face's BertForMaskedLM built from these (no download); vocabulary from the token store
    layers: int = _positive(2)
    hidden_size: int = _positive(128)
    heads: int = _positive(2)
    intermediate_size: int = _positive(512)
    max_position_embeddings: int = _positive(512)
    hidden_dropout: float = field(default=0.1, metadata={"min": 0, "max": 1})
    attention_dropout: float = field(default=0.1, metadata={"min": 0, "max": 1})
    # bert: auto | sdpa | varlen | flex (trainrun/models/bert.py says which runs where)
    attention: str = _choice("auto", "auto", "sdpa", "varlen", "flex")
    # start from these weights, not the initialisers: a Hugging Face save_pretrained folder (bert),
    # a torch.save'd state dict, or a trainrun checkpoint
    weights: str | None = None


@dataclass
class DataConfig:
    """Where images or text come from and how they are cut, augmented (or masked) and batched."""

    name: str = _choice("digits", *DATA_NAMES)
    loader: str = _choice("torch", "torch", "ffcv")
    path: str | None = None  # folder: a directory with train/ and val/ ImageFolder trees
    train: str | None = None  # beton: the training .beton file
    val: str | None = None  # beton: the validation .beton file
    cache_dir: str = "~/.cache/trainrun"  # ffcv: where built-in sets are written once
    num_classes: int = _positive(10)
    resolution: int = _positive(8)  # training image side
    eval_resolution: int = _positive(8)  # evaluation image side (center crop)
    eval_resize: int | None = None  # folder: shorter side before the center crop
    val_fraction: float = _positive(0.2)  # digits, mnist5k, built-in corpora: held-out share, fixed by split_seed
    split_seed: int = 0
    num_samples: int = _positive(2048)  # synthetic: training images
    val_samples: int = _positive(512)  # synthetic: validation images
    crop_scale: list[float] = field(default_factory=lambda: [0.08, 1.0])  # random-resized crop
    crop_ratio: list[float] = field(default_factory=lambda: [0.75, 4 / 3])
    random_crop_padding: int = _non_negative(0)  # built-in sets: pad-and-crop jitter in pixels
    hflip: bool = False  # built-in sets and .beton files (folders always flip)
    mean: list[float] = field(default_factory=lambda: [0.5, 0.5, 0.5])
    std: list[float] = field(default_factory=lambda: [0.25, 0.25, 0.25])
    # loader processes per training process; -1: this process's share of the node's cores
    num_workers: int = field(default=0, metadata={"min": -1})
    decode: str = _choice("full", "full", "draft")  # folder: whole images, or JPEGs at the scale the crop needs
    pin_memory: bool | None = None  # torch loader: null = pinned when training on CUDA
    persistent_workers: bool = True  # torch loader: workers live on across epochs and evaluations (no re-fork)
    prefetch_factor: int | None = None
    order: str = _choice("random", "random", "quasi_random", "sequential")  # ffcv: training order
    os_cache: bool = True  # ffcv: read through the page cache (False: FFCV's own in-process cache)
    batches_ahead: int = _non_negative(3)  # ffcv
    drop_last: bool = True  # ffcv: training
    # text (masked-language-model data): a token store at `path`, or a built-in corpus written once
    corpus: str | None = None  # built-in corpus (stdlib_docs) stored in cache_dir when path is unset
    vocab_size: int = _positive(8192)  # WordPiece vocabulary trained for a built-in corpus
    max_seq_len: int = field(default=128, metadata={"min": 3})  # [CLS] + tokens + [SEP]
    packing: str = _choice("pad", "pad", "pack")  # pad: a document per sample; pack: documents end to end
    mlm_probability: float = field(default=0.15, metadata={"exclusive_min": 0, "max": 1})  # tokens masked
    eval_mlm_probability: float = field(default=0.15, metadata={"exclusive_min": 0, "max": 1})


@dataclass
class OptimizerConfig:
    """Decoupled SGDW, AdamW, or LAMB (MLPerf BERT's closed-division optimizer)."""

    name: str = _choice("sgdw", "sgdw", "adamw", "lamb")
    lr: float = _positive(0.2)
    momentum: float = _non_negative(0.9)
    dampening: float = _non_negative(0.0)
    nesterov: bool = False
    weight_decay: float = _non_negative(5e-4)
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = _positive(1e-8)
    exclude_norm_and_bias: bool = False  # no weight decay on normalisation layers and biases
    lr_scaling: str = _choice("none", "none", "linear")  # linear: lr x train_batch_size / reference_batch_size
    reference_batch_size: int = _positive(256)  # the global batch that ``lr`` was tuned for
    max_grad_norm: float | None = field(default=None, metadata={"exclusive_min": 0})  # lamb: global-norm clip


@dataclass
class SchedulerConfig:
    """Linear warmup, then one decay shape; every time in any unit, applied every step."""

    name: str = _choice("cosine", "cosine", "linear", "step", "multistep", "constant")
    t_warmup: str = _time("1ep")
    alpha_f: float = _non_negative(0.0)  # final multiplier of cosine / linear decay
    step_size: str = _interval("30ep")  # step: decay every step_size
    gamma: float = _positive(0.1)  # step, multistep: factor per step / per milestone
    milestones: list[str] = field(default_factory=list, metadata={"time": True})  # multistep: times of x gamma
    scale_warmup: bool = True  # false: scale_schedule_ratio leaves t_warmup as written


@dataclass
class CheckpointConfig:
    """When to save and how many checkpoints to keep."""

    interval: str | None = _interval(None)  # e.g. 1ep or 500ba; null = only at the end
    keep: int = _positive(2)  # newest checkpoints kept in <run>/checkpoints
    save_final: bool = True


@dataclass
class LauncherConfig:
    """How many processes train, on how many nodes: torchrun's settings under trainrun's names."""

    devices: str = "auto"  # processes on this node: auto = every GPU (1 on a CPU-only machine), or N
    nnodes: int = _positive(1)
    node_rank: int = _non_negative(0)
    master_addr: str = "127.0.0.1"  # the node_rank 0 machine, reachable from every node
    master_port: int | None = field(default=None, metadata={"min": 1, "max": 65535})  # null: a free port
    rdzv_endpoint: str | None = None  # host:port of a c10d rendezvous, instead of master_addr/port
    # how long a collective may wait (rank 0 writing a checkpoint, a slow rank) before the run fails
    timeout_minutes: float = field(default=60.0, metadata={"min": 1})


@dataclass
class AutoConfig:
    """Settings of the choices measured before a run: ``recipe=auto`` and ``-o1``."""

    table: str | None = None  # recipe=auto: a 'trainrun report' CSV; default: the published table for model and data
    candidates: list[str] = field(default_factory=list)  # recipe=auto: recipes to consider (default: the table's)
    profile_steps: int = field(default=20, metadata={"min": 4})  # each candidate's schedule, compressed, timed


@dataclass
class HardwareConfig:
    """What one node of the run costs, for cost-to-accuracy reports (conf/hardware/*.yaml)."""

    name: str = "unpriced"
    price_per_hour: float | None = field(default=None, metadata={"min": 0})  # one node, in dollars
    description: str = ""


@dataclass
class TrainConfig:
    """The whole run. ``algorithms`` maps names to each algorithm's own config dataclass."""

    task: TaskConfig = field(default_factory=TaskConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    algorithms: dict[str, Any] = field(default_factory=dict)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    launcher: LauncherConfig = field(default_factory=LauncherConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    auto: AutoConfig = field(default_factory=AutoConfig)
    name: str | None = None  # the run's label in reports (recipes set their own name)
    loss: str = _choice("soft_ce", "soft_ce", "bce")
    precision: str = _choice("fp32", "fp32", "amp", "bf16")
    compile: bool = False  # torch.compile the model (after model surgery, before DDP)
    device: str = _choice("auto", "auto", "cpu", "cuda")
    seed: int = 42
    deterministic: bool = False  # torch's deterministic kernels, no cuDNN autotuning: bitwise-repeatable GPU runs
    max_duration: str = field(default="12ep", metadata={"time": True, "budget": True})  # or 30min, 50usd
    eval_interval: str = _interval("1ep")
    train_batch_size: int = _positive(64)  # global: divided among ranks
    # gradient accumulation: samples per forward/backward pass in each process; "auto" starts from
    # the whole batch and halves on out-of-memory; None: the whole batch in one pass
    device_train_microbatch_size: str | None = None
    eval_batch_size: int = _positive(512)  # global
    scale_schedule_ratio: float = _positive(1.0)
    accuracy_targets: list[float] = field(default_factory=lambda: [0.9, 0.95, 0.97])  # of the task's quality metric
    resume: str | None = None  # "auto" (newest checkpoint in the run dir) or a path
    log_interval: int = _positive(10)  # batches between loss checks and progress updates
    progress: bool = True  # live rich progress bar on a terminal
    profile_prefix: str | None = _time(None)  # train only this much of the schedule; extrapolate the time
    loggers: list[str] = field(default_factory=list)  # extra loggers: tensorboard
    stop_at: float | None = None  # end at the first evaluation whose quality metric reaches this (MLPerf's rule)


ALGORITHM_CONFIGS: dict[str, type] = {}


def algorithm_config(name: str):
    """Register a dataclass as the hyperparameters of algorithm ``name``."""

    def register(cls: type) -> type:
        ALGORITHM_CONFIGS[name] = cls
        return cls

    return register


@algorithm_config("channels_last")
@dataclass
class ChannelsLastConfig:
    """Store the model's weights and activations in NHWC memory format."""


@algorithm_config("blurpool")
@dataclass
class BlurPoolConfig:
    """Anti-aliased downsampling (Zhang 2019)."""

    replace_convs: bool = True
    replace_maxpools: bool = True
    blur_first: bool = True
    min_channels: int = _non_negative(16)


@algorithm_config("ema")
@dataclass
class EMAConfig:
    """Exponential moving average of weights and buffers, evaluated in place of the weights."""

    half_life: str = _interval("100ba")
    update_interval: str = _interval("20ba")


@algorithm_config("label_smoothing")
@dataclass
class LabelSmoothingConfig:
    """Mix targets with the uniform distribution."""

    smoothing: float = field(default=0.1, metadata={"min": 0, "max": 1})


@algorithm_config("gradient_clipping")
@dataclass
class GradientClippingConfig:
    """Clip gradients by global norm, by value, or adaptively (AGC) before each step."""

    type: str = _choice("norm", "norm", "value", "adaptive")
    threshold: float = _positive(1.0)


@algorithm_config("masked_head")
@dataclass
class MaskedHeadConfig:
    """Masked-language models: the output head runs on the masked positions only."""


@algorithm_config("seq_length_warmup")
@dataclass
class SeqLengthWarmupConfig:
    """Train on sequences cut short, growing linearly to full length (Li et al. 2021; Composer's schedule)."""

    duration: float = field(default=0.3, metadata={"exclusive_min": 0, "max": 1})  # fraction of the run it grows over
    min_seq_length: int = _positive(8)
    max_seq_length: int = _positive(1024)  # capped at the batch's own length
    step_size: int = _positive(8)  # lengths are min_seq_length plus multiples of this


@algorithm_config("unpadding")
@dataclass
class UnpaddingConfig:
    """Masked-language models: no work on padding tokens outside attention."""


@algorithm_config("alibi")
@dataclass
class AlibiConfig:
    """Attention biased by distance instead of learned position embeddings (Press et al. 2021)."""

    max_sequence_length: int = _positive(1024)  # the longest sequence the model will accept


@algorithm_config("gated_linear_units")
@dataclass
class GatedLinearUnitsConfig:
    """Transformer feed-forward layers become gated linear units, act(W_g x) * (W_v x) (Shazeer 2020)."""

    gated_layer_bias: bool = False  # the card found no biases best
    non_gated_layer_bias: bool = False


@algorithm_config("low_precision_layernorm")
@dataclass
class LowPrecisionLayerNormConfig:
    """LayerNorm runs in the autocast dtype (fp16 / bf16) instead of fp32; no effect without autocast."""


@algorithm_config("fused_layers")
@dataclass
class FusedLayersConfig:
    """Transformer layers: dropout-add-LayerNorm and dense-GeLU blocks compiled into fused kernels."""


@algorithm_config("progressive_resizing")
@dataclass
class ProgressiveResizingConfig:
    """Train at a reduced resolution that grows to full size (Touvron et al.; Composer's schedule)."""

    mode: str = _choice("resize", "resize", "crop")
    initial_scale: float = field(default=0.5, metadata={"exclusive_min": 0, "max": 1})
    delay: float = field(default=0.4, metadata={"min": 0, "max": 1})  # fraction of the run at initial_scale
    finetune: float = field(default=0.2, metadata={"min": 0, "max": 1})  # final fraction at full size
    size_increment: int = _positive(4)  # sizes are multiples of this


@algorithm_config("mixup")
@dataclass
class MixUpConfig:
    """Convex combinations of pairs of images and of their labels (torchvision's MixUp)."""

    alpha: float = _positive(0.2)


@algorithm_config("cutmix")
@dataclass
class CutMixConfig:
    """A box of one image pasted into another, labels mixed by area (torchvision's CutMix)."""

    alpha: float = _positive(1.0)


@algorithm_config("stochastic_depth")
@dataclass
class StochasticDepthConfig:
    """Randomly skip residual branches in training (Huang et al., 2016)."""

    drop_rate: float = field(default=0.1, metadata={"min": 0, "max": 1})  # of the last block
    mode: str = _choice("sample", "sample", "block")  # drop per sample, or the whole batch's branch
    distribution: str = _choice("linear", "linear", "uniform")  # over the blocks, first to last


@algorithm_config("colout")
@dataclass
class ColOutConfig:
    """Drop random rows and columns of each training image (Composer's ColOut)."""

    p_row: float = field(default=0.15, metadata={"min": 0, "max": 1})
    p_col: float = field(default=0.15, metadata={"min": 0, "max": 1})
    batch: bool = True  # the same rows and columns for the whole batch


@algorithm_config("bce_loss")
@dataclass
class BCELossConfig:
    """Binary cross-entropy per class instead of softmax cross-entropy."""

    bias_init: bool = True  # classifier bias at -ln(C), so sigmoid outputs start near 1/C


@algorithm_config("fixres")
@dataclass
class FixResConfig:
    """Train at a lower resolution than evaluation (Touvron et al., 2019)."""

    train_resolution: int = _positive(176)  # below data.eval_resolution (e.g. 176 -> 224)


@algorithm_config("sam")
@dataclass
class SAMConfig:
    """Sharpness-aware minimisation (Foret et al., 2021) every ``interval`` steps."""

    rho: float = _positive(0.05)
    epsilon: float = _positive(1.0e-12)
    interval: int = _positive(1)


@algorithm_config("randaugment")
@dataclass
class RandAugmentConfig:
    """``depth`` random image operations per training image (torchvision's RandAugment)."""

    depth: int = _positive(1)
    severity: int = field(default=9, metadata={"min": 0, "max": 20})  # of 20 levels; 10 = half strength


@algorithm_config("trivialaugment")
@dataclass
class TrivialAugmentConfig:
    """One random operation at a random strength per training image (TrivialAugment Wide)."""

    num_magnitude_bins: int = field(default=31, metadata={"min": 2})


@algorithm_config("squeeze_excite")
@dataclass
class SqueezeExciteConfig:
    """Channel gating after large convolutions (Hu et al., 2018)."""

    latent_channels: float = _positive(64)  # >= 1: channels; < 1: fraction of the conv's output
    min_channels: int = _non_negative(128)  # only convs with min(in, out) >= this


@algorithm_config("ghost_batchnorm")
@dataclass
class GhostBatchNormConfig:
    """Batch normalisation over small chunks of the batch (Hoffer et al., 2017)."""

    ghost_batch_size: int = _positive(32)


@algorithm_config("layer_freezing")
@dataclass
class LayerFreezingConfig:
    """Freeze the leading layers progressively towards the end of training."""

    freeze_start: float = field(default=0.5, metadata={"min": 0, "max": 1})  # fraction of the run
    freeze_level: float = field(default=1.0, metadata={"min": 0, "max": 1})  # frozen fraction at the end


@algorithm_config("swa")
@dataclass
class SWAConfig:
    """Stochastic weight averaging (Izmailov et al., 2018), loaded into the model at ``swa_end``."""

    swa_start: str = _time("0.7dur")
    swa_end: str = _time("0.97dur")
    update_interval: str = _interval("1ep")


@algorithm_config("selective_backprop")
@dataclass
class SelectiveBackpropConfig:
    """Backpropagate only a loss-weighted sample of each batch (Jiang et al., 2019)."""

    start: float = field(default=0.5, metadata={"min": 0, "max": 1})  # fraction of the run
    end: float = field(default=0.9, metadata={"min": 0, "max": 1})
    keep: float = field(default=0.5, metadata={"exclusive_min": 0, "max": 1})  # share of the batch kept
    scale_factor: float = field(default=1.0, metadata={"exclusive_min": 0, "max": 1})  # scoring resolution
    interval: int = _positive(2)  # every interval-th batch is a full one


# Pairs that cannot run together, and why.
INCOMPATIBLE_ALGORITHMS: dict[tuple[str, str], str] = {
    ("cutmix", "mixup"): "both replace each batch with mixed images and targets; choose one",
    ("randaugment", "trivialaugment"): "both draw random per-image augmentations; choose one",
}
# The one order of algorithms. At each event the engine runs the algorithms acting there in this
# order, and in reverse on events that close a bracket (AFTER_FORWARD/LOSS/BACKWARD, *_END), so
# what one method sets up before a step is unwound after it in mirror order. docs/algorithms.md
# shows the resolved order per event, generated from this table (scripts/algorithm_order.py --write).
ALGORITHM_ORDER: tuple[tuple[str, str], ...] = (
    ("stochastic_depth", "wraps whole residual blocks before any surgery inside them"),
    ("blurpool", "replaces strided convolutions before squeeze-excite gates them"),
    ("squeeze_excite", "after BlurPool, so a blurred strided convolution's inner conv gets the gate"),
    ("ghost_batchnorm", "after the surgery that adds layers (BlurPool, squeeze-excite)"),
    ("fixres", "sets the full training resolution before progressive resizing scales it"),
    ("progressive_resizing", "sizes the batch before ColOut drops rows and columns of it"),
    ("colout", "after the batch has its size for the step"),
    ("selective_backprop", "scores and keeps examples of the batch as it will train: sized, before mixing"),
    ("seq_length_warmup", "shortens the batch's sequences before anything reads their positions"),
    ("mixup", "mixes images and targets before label smoothing smooths the mixed targets"),
    ("cutmix", "as mixup"),
    ("randaugment", "per-image transforms in the data pipeline; no order with batch methods"),
    ("trivialaugment", "as randaugment"),
    ("bce_loss", "replaces the loss at INIT; no other method touches it"),
    ("label_smoothing", "smooths the (mixed) targets before the loss and restores them after it"),
    (
        "sam",
        "after label smoothing: at AFTER_LOSS (reversed) SAM records the smoothed targets before "
        "label smoothing restores the originals",
    ),
    ("gradient_clipping", "clips at BEFORE_OPTIMIZER_STEP the gradient SAM's second pass left"),
    ("layer_freezing", "freezes layers at EPOCH_END after EMA and SWA have averaged the step"),
    ("ema", "at BATCH_END (reversed) averages after SWA: the step that loads SWA's average feeds it to EMA"),
    ("swa", "at BATCH_END (reversed) loads its average into the model before EMA reads the weights"),
    ("alibi", "replaces the position embeddings at INIT; attention reads its bias from the model"),
    ("unpadding", "switches the model's forward at INIT; any layer surgery before or after applies within it"),
    ("masked_head", "switches the model's output head at INIT; no other method touches it"),
    ("gated_linear_units", "rebuilds the feed-forward layers at INIT, before their norms are replaced"),
    ("low_precision_layernorm", "replaces every LayerNorm at INIT, including any that surgery added"),
    ("fused_layers", "compiles each layer's blocks at INIT once every surgery inside them is done"),
    ("channels_last", "last model change at INIT: every layer that surgery added becomes NHWC"),
)
TORCH_LOADER_ALGORITHMS = ("randaugment", "trivialaugment")  # per-image transforms FFCV cannot run
# The tasks each algorithm applies to; any not named here acts on images or ResNets only.
ALGORITHM_TASKS: dict[str, tuple[str, ...]] = {
    "ema": TASK_NAMES,
    "gradient_clipping": TASK_NAMES,
    "sam": TASK_NAMES,
    "swa": TASK_NAMES,
    "masked_head": ("masked_lm",),
    "seq_length_warmup": ("masked_lm",),
    "alibi": ("masked_lm",),
    "unpadding": ("masked_lm",),
    "gated_linear_units": ("masked_lm",),
    "low_precision_layernorm": ("masked_lm",),
    "fused_layers": ("masked_lm",),
}


def algorithm_tasks(name: str) -> tuple[str, ...]:
    """The tasks algorithm ``name`` applies to."""
    return ALGORITHM_TASKS.get(name, ("image_classification",))


# Methods whose step cost changes along the schedule: a profiled prefix does not represent the rest.
VARYING_STEP_COST_ALGORITHMS = ("progressive_resizing", "layer_freezing", "selective_backprop", "seq_length_warmup")


def validate(cfg: DictConfig, files: bool = True) -> TrainConfig:
    """Merge ``cfg`` into the schema and check every value (and, with ``files``, that the files a
    run reads exist); raise :class:`ConfigError` if bad."""
    try:
        merged = OmegaConf.merge(OmegaConf.structured(TrainConfig), cfg)
        for name, params in (merged.algorithms or {}).items():
            if name not in ALGORITHM_CONFIGS:
                raise ConfigError(f"unknown algorithm '{name}' (choose from: {', '.join(sorted(ALGORITHM_CONFIGS))})")
            typed = OmegaConf.merge(OmegaConf.structured(ALGORITHM_CONFIGS[name]), params or {})
            merged.algorithms[name] = typed
        config: TrainConfig = OmegaConf.to_object(merged)
    except OmegaConfBaseException as error:
        raise ConfigError(describe_omegaconf_error(error)) from error
    _check_fields(config, "")
    for name, params in config.algorithms.items():
        _check_fields(params, f"algorithms.{name}.")
    _check_run(config)
    if files:
        check_files(config)
    return config


def describe_omegaconf_error(error: OmegaConfBaseException) -> str:
    """One line naming the key OmegaConf refused and why."""
    key = getattr(error, "full_key", None) or getattr(error, "key", None)
    message = str(error).splitlines()[0]
    if "not in struct" in message or "Key '" in message and "not" in message:
        return f"unknown config key '{key}'"
    if key:
        return f"bad value for '{key}': {message}"
    return message


def _check_fields(obj: Any, prefix: str) -> None:
    for spec in dataclasses.fields(obj):
        value = getattr(obj, spec.name)
        key = prefix + spec.name
        if dataclasses.is_dataclass(value):
            _check_fields(value, key + ".")
            continue
        if value is None:
            continue
        meta = spec.metadata
        if meta.get("time"):
            for time in value if isinstance(value, list) else [value]:
                _check_time(key, time, meta)
        if "choices" in meta and value not in meta["choices"]:
            raise ConfigError(f"bad value for '{key}': '{value}' (choose from: {', '.join(meta['choices'])})")
        if "exclusive_min" in meta and not value > meta["exclusive_min"]:
            raise ConfigError(f"bad value for '{key}': {value} (must be > {meta['exclusive_min']})")
        if "min" in meta and not value >= meta["min"]:
            raise ConfigError(f"bad value for '{key}': {value} (must be >= {meta['min']})")
        if "max" in meta and not value <= meta["max"]:
            raise ConfigError(f"bad value for '{key}': {value} (must be <= {meta['max']})")


def _check_time(key: str, value: str, meta: dict) -> None:
    try:
        parsed = Time.parse(value)
    except ValueError as error:
        raise ConfigError(f"bad value for '{key}': {error}") from None
    if meta.get("interval") and parsed.value <= 0:
        raise ConfigError(f"bad value for '{key}': '{value}' is an interval of zero, which never fires")
    if parsed.unit.is_budget and not meta.get("budget"):
        raise ConfigError(
            f"bad value for '{key}': '{value}' is a budget; only max_duration takes one "
            "(write times inside a run in ep, ba, sp or dur)"
        )


def check_files(config: TrainConfig) -> None:
    """The files and folders a run reads exist: checked before a run, not to print a config."""
    data = config.data
    if data.name == "folder" and not data.path:
        raise ConfigError("data=folder needs 'data.path' (a directory with train/ and val/ subfolders)")
    weights = config.model.weights
    if weights and not Path(weights).expanduser().exists():
        raise ConfigError(f"bad value for 'model.weights': '{weights}' does not exist")
    if data.path and not Path(data.path).expanduser().is_dir():
        raise ConfigError(f"bad value for 'data.path': '{data.path}' is not a directory")
    if data.name == "beton":
        for key in ("train", "val"):
            path = getattr(data, key)
            if not path:
                raise ConfigError(f"data=beton needs 'data.{key}' (a .beton file written by 'trainrun write')")
            if not Path(path).expanduser().is_file():
                raise ConfigError(f"bad value for 'data.{key}': '{path}' does not exist")
    if config.resume not in (None, "auto") and not Path(config.resume).expanduser().is_file():
        raise ConfigError(f"bad value for 'resume': checkpoint '{config.resume}' does not exist")


def budget_seconds(config: TrainConfig) -> float:
    """Training seconds a budgeted ``max_duration`` allows: wall-clock, or money at the hardware's
    price for every node of the run."""
    budget = Time.parse(config.max_duration)
    if budget.unit is not TimeUnit.DOLLAR:
        return budget.wall_seconds
    price = config.hardware.price_per_hour
    return budget.value / (price * config.launcher.nnodes) * 3600


def _check_budget(config: TrainConfig) -> None:
    """A wall-clock or cost ``max_duration`` is positive, priced, and only ``max_duration``."""
    budget = Time.parse(config.max_duration)
    if budget.value <= 0:
        raise ConfigError(f"bad value for 'max_duration': '{config.max_duration}' (a budget must be above zero)")
    if budget.unit is TimeUnit.DOLLAR and not config.hardware.price_per_hour:
        raise ConfigError(
            f"max_duration={config.max_duration} needs a price: choose a priced hardware option "
            f"(hardware={config.hardware.name} has none), e.g. hardware=1xa100_aws"
        )
    if config.profile_prefix is not None:
        raise ConfigError("'profile_prefix' extrapolates a run of fixed length: it needs max_duration in ep, ba or sp")


def _check_run(config: TrainConfig) -> None:
    """Checks that involve more than one field."""
    if Time.parse(config.max_duration).unit is TimeUnit.DURATION:
        raise ConfigError(f"bad value for 'max_duration': '{config.max_duration}' (dur is relative to it)")
    if Time.parse(config.max_duration).unit.is_budget:
        _check_budget(config)
    for name in config.model.initializers:
        if name not in INITIALIZERS:
            raise ConfigError(f"bad value for 'model.initializers': '{name}' (choose from: {', '.join(INITIALIZERS)})")
    _check_algorithms(config)
    _check_launcher(config.launcher)
    if config.launcher.devices != "auto":
        ranks = int(config.launcher.devices) * config.launcher.nnodes
        check_batch_split(config.train_batch_size, config.eval_batch_size, ranks)
        check_microbatch_size(config.device_train_microbatch_size, config.train_batch_size, ranks)
    else:
        check_microbatch_size(config.device_train_microbatch_size, config.train_batch_size, None)
    if config.device_train_microbatch_size is not None and "sam" in config.algorithms:
        raise ConfigError(
            "algorithm 'sam' cannot run with 'device_train_microbatch_size': its second pass needs the "
            "whole batch's gradient before any micro-batch can run it"
        )
    resizing = config.algorithms.get("progressive_resizing")
    if resizing is not None and resizing.delay + resizing.finetune > 1:
        raise ConfigError("bad value for 'algorithms.progressive_resizing': delay + finetune must be <= 1")
    if config.profile_prefix is not None and Time.parse(config.profile_prefix).value <= 0:
        raise ConfigError(f"bad value for 'profile_prefix': '{config.profile_prefix}' (must be above 0)")
    for name in config.loggers:
        if name not in LOGGER_NAMES:
            raise ConfigError(f"bad value for 'loggers': '{name}' (choose from: {', '.join(LOGGER_NAMES)})")
    if config.stop_at is not None and not 0 < config.stop_at <= 1:
        raise ConfigError(f"bad value for 'stop_at': {config.stop_at} (a fraction in (0, 1] of the quality metric)")
    for target in config.accuracy_targets:
        if not 0 < target <= 1:
            raise ConfigError(f"bad value for 'accuracy_targets': {target} (a fraction in (0, 1])")
    if config.data.name == "beton" and config.data.loader != "ffcv":
        raise ConfigError("data=beton reads .beton files: it needs data.loader=ffcv")
    if config.data.name == "folder" and config.data.loader == "ffcv":
        raise ConfigError(
            "data=folder reads image files with the torch loader; for FFCV write them once with "
            "'trainrun write' and use data=beton"
        )
    if len(config.data.mean) != 3 or len(config.data.std) != 3:
        raise ConfigError("bad value for 'data.mean'/'data.std': give three values (R, G, B)")
    if config.task.name == "masked_lm" or config.data.name == "text" or config.model.name == "bert":
        _check_masked_lm(config)
        return
    if config.model.num_classes != config.data.num_classes:
        raise ConfigError(
            f"bad value for 'model.num_classes': {config.model.num_classes} but data "
            f"'{config.data.name}' has {config.data.num_classes} classes"
        )


def _check_masked_lm(config: TrainConfig) -> None:
    """A language run: text data, a BERT and the masked-LM task together, and what they allow."""
    parts = {
        "task": (config.task.name, "masked_lm"),
        "data": (config.data.name, "text"),
        "model": (config.model.name, "bert"),
    }
    for key, (chosen, needed) in parts.items():
        if chosen != needed:
            others = ", ".join(f"{k}={v}" for k, (c, v) in parts.items() if c == v)
            raise ConfigError(f"bad value for '{key}.name': '{chosen}' (with {others} it must be {needed})")
    if config.loss != "soft_ce":
        raise ConfigError(f"bad value for 'loss': '{config.loss}' (task masked_lm trains with cross-entropy, soft_ce)")
    if config.data.loader != "torch":
        raise ConfigError("bad value for 'data.loader': text is read with the torch loader (data.loader=torch)")
    if not config.data.path and not config.data.corpus:
        raise ConfigError("data=text needs 'data.path' (a token store written by 'trainrun write-text')")
    alibi = config.algorithms.get("alibi")
    positions, key = (
        (alibi.max_sequence_length, "algorithms.alibi.max_sequence_length")
        if alibi
        else (config.model.max_position_embeddings, "model.max_position_embeddings")
    )
    if config.data.max_seq_len > positions:
        raise ConfigError(
            f"bad value for 'data.max_seq_len': {config.data.max_seq_len} is more than the model's "
            f"{positions} positions ({key})"
        )
    if config.model.hidden_size % config.model.heads:
        raise ConfigError(
            f"bad value for 'model.heads': {config.model.heads} does not divide model.hidden_size "
            f"{config.model.hidden_size}"
        )


def _is_this_machine(host: str) -> bool:
    """Whether ``host`` names the local machine wherever it is read (loopback or unspecified)."""
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.is_loopback or address.is_unspecified


def check_batch_split(train_batch_size: int, eval_batch_size: int, ranks: int) -> None:
    """The global batch sizes divide evenly among ``ranks`` processes."""
    for key, size in (("train_batch_size", train_batch_size), ("eval_batch_size", eval_batch_size)):
        if size % ranks:
            raise ConfigError(
                f"bad value for '{key}': {size} does not divide among {ranks} processes "
                f"({size // ranks} or {size // ranks + 1} per process; choose a multiple of {ranks})"
            )


def check_microbatch_size(setting: str | None, train_batch_size: int, ranks: int | None) -> None:
    """``device_train_microbatch_size`` is ``auto`` or a positive number no larger than each
    process's share of the batch (checked when the number of processes is known)."""
    if setting is None or setting == "auto":
        return
    if not setting.isdigit() or int(setting) == 0:
        raise ConfigError(f"bad value for 'device_train_microbatch_size': '{setting}' (auto or a positive number)")
    if ranks is not None and int(setting) > train_batch_size // ranks:
        raise ConfigError(
            f"bad value for 'device_train_microbatch_size': {setting} is more than each process's batch of "
            f"{train_batch_size // ranks} (train_batch_size {train_batch_size} over {ranks} process(es))"
        )


def _check_launcher(launcher: LauncherConfig) -> None:
    if launcher.devices != "auto" and not (launcher.devices.isdigit() and int(launcher.devices) > 0):
        raise ConfigError(f"bad value for 'launcher.devices': '{launcher.devices}' (auto or a positive number)")
    if launcher.node_rank >= launcher.nnodes:
        raise ConfigError(
            f"bad value for 'launcher.node_rank': {launcher.node_rank} (below launcher.nnodes {launcher.nnodes})"
        )
    if launcher.nnodes > 1 and launcher.master_port is None and not launcher.rdzv_endpoint:
        raise ConfigError(
            "a multi-node launch needs 'launcher.master_port' (the same on every node) or 'launcher.rdzv_endpoint'"
        )
    if launcher.nnodes > 1 and not launcher.rdzv_endpoint and _is_this_machine(launcher.master_addr):
        raise ConfigError(
            f"bad value for 'launcher.master_addr': '{launcher.master_addr}' is this machine on every node; "
            "a multi-node launch needs the address of the node_rank 0 machine that every node can reach"
        )


def _check_algorithms(config: TrainConfig) -> None:
    """Algorithms of another task, pairs that cannot combine, and algorithms the data path cannot run."""
    chosen, task = config.algorithms, config.task.name
    for name in chosen:
        if task not in algorithm_tasks(name):
            allowed = ", ".join(sorted(n for n in ALGORITHM_CONFIGS if task in algorithm_tasks(n)))
            raise ConfigError(
                f"algorithm '{name}' does not apply to task {task} (it is for {', '.join(algorithm_tasks(name))}); "
                f"choose from: {allowed}"
            )
    for (first, second), why in INCOMPATIBLE_ALGORITHMS.items():
        if first in chosen and second in chosen:
            raise ConfigError(f"algorithms '{first}' and '{second}' cannot run together: {why}")
    for name in TORCH_LOADER_ALGORITHMS:
        if name in chosen and config.data.loader == "ffcv":
            raise ConfigError(
                f"algorithm '{name}' transforms images in the torch DataLoader, which data.loader=ffcv "
                f"does not use; choose a torch-loader data set (e.g. data=folder or data=digits)"
            )
    fixres = chosen.get("fixres")
    if fixres is not None and fixres.train_resolution >= config.data.eval_resolution:
        raise ConfigError(
            f"bad value for 'algorithms.fixres.train_resolution': {fixres.train_resolution} (must be below "
            f"data.eval_resolution {config.data.eval_resolution})"
        )
    backprop = chosen.get("selective_backprop")
    if backprop is not None and backprop.start > backprop.end:
        raise ConfigError("bad value for 'algorithms.selective_backprop': start must be <= end")


def list_keys(cls: type = TrainConfig, prefix: str = "") -> set[str]:
    """Dotted keys whose value is a list (``algorithms`` included), for flag translation."""
    keys = {"algorithms"} if cls is TrainConfig else set()
    for name, hint in typing.get_type_hints(cls).items():
        if typing.get_origin(hint) is list:
            keys.add(prefix + name)
        elif dataclasses.is_dataclass(hint):
            keys |= list_keys(hint, f"{prefix}{name}.")
    return keys
