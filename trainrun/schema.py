"""The run's configuration: one dataclass per group of ``conf/``, the whole run in :class:`TrainConfig`.

Torch-free, so that a bad key, type or value fails in a fraction of a second
(:func:`trainrun.validation.validate`). Each method's hyperparameters live with its spec under
``trainrun/algorithms/specs/``; ``algorithms`` maps the chosen names to them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trainrun.core.time import Time, TimeUnit
from trainrun.fields import (
    choice_field,
    coefficient_field,
    coefficients_field,
    fraction_field,
    interval_field,
    non_negative_field,
    open_fraction_field,
    positive_field,
    positive_fraction_field,
    time_field,
)
from trainrun.hardware import HardwareConfig
from trainrun.loggers.settings import MlflowConfig, WandbConfig
from trainrun.registry import names

INITIALIZERS = ("kaiming_normal", "bn_uniform", "linear_log_constant_bias")


@dataclass
class TaskConfig:
    """The kind of problem (conf/task/, trainrun/tasks/): inputs, losses, metrics and the quality metric."""

    name: str = choice_field("image_classification", *names("task"))


@dataclass
class SmallResNetConfig:
    """``model=resnet_small``: a ResNet for 8-32 px images."""

    width: int = positive_field(32)  # channels of the first stage
    blocks: list[int] = field(default_factory=lambda: [1, 1, 1])  # blocks per stage
    norm: str = choice_field("batch", "batch", "group")  # group norm is independent of the batch


@dataclass
class BertConfig:
    """``model=bert_*``: Hugging Face's BertForMaskedLM built from these (no download); the
    vocabulary comes from the token store."""

    layers: int = positive_field(2)
    hidden_size: int = positive_field(128)
    heads: int = positive_field(2)
    intermediate_size: int = positive_field(512)
    max_position_embeddings: int = positive_field(512)
    hidden_dropout: float = fraction_field(0.1)
    attention_dropout: float = fraction_field(0.1)
    # auto | sdpa | varlen | flex (trainrun/models/bert.py says which runs where)
    attention: str = choice_field("auto", "auto", "sdpa", "varlen", "flex")


@dataclass
class GPTConfig:
    """``model=gpt_*``: trainrun's GPT (trainrun/models/gpt.py); the vocabulary comes from the token store."""

    layers: int = positive_field(2)
    heads: int = positive_field(2)
    width: int = positive_field(128)
    max_seq_len: int = positive_field(256)  # the longest window (learned positions, rotary tables; alibi: none)
    positions: str = choice_field("learned", "learned", "rotary", "alibi")
    norm: str = choice_field("layernorm", "layernorm", "rmsnorm")
    qk_norm: bool = False  # RMS-normalise queries and keys per head before attention
    mlp: str = choice_field("gelu", "gelu", "gelu_tanh", "relu2")  # gelu_tanh: published GPT-2's approximation
    tie_head: bool = True  # the output head shares the token embedding
    logit_softcap: float | None = field(default=None, metadata={"exclusive_min": 0})  # c * tanh(logits / c)
    zero_init: bool = False  # attention and MLP output projections (and an untied head) start at zero
    bias: bool = False  # biases in the linear layers (nanoGPT's GPT-2 124M run has none)
    dropout: float = fraction_field(0.0)  # on embeddings, attention weights and residual branches (GPT-2: 0.1)
    document_mask: bool = False  # no token attends to another document's (documents end at the store's separator)
    window: int | None = field(default=None, metadata={"min": 1})  # sliding window: itself and window - 1 tokens back
    value_embeddings: int = field(default=0, metadata={"min": 0})  # extra token tables mixed into values (speedrun)


@dataclass
class LlamaConfig:
    """``model=llama*``: Llama 3 (trainrun/models/llama.py); the defaults are ``llama_tiny``, a size
    this CPU trains; the vocabulary comes from the token store."""

    layers: int = positive_field(2)
    heads: int = positive_field(4)
    kv_heads: int = positive_field(2)  # grouped-query attention: key/value heads, dividing heads
    width: int = positive_field(128)
    ffn_hidden: int = positive_field(384)  # SwiGLU's hidden width
    max_seq_len: int = positive_field(256)  # the rotary tables' length: the longest window
    norm_eps: float = field(default=1e-5, metadata={"exclusive_min": 0})
    rope_theta: float = positive_field(500_000.0)
    # Llama 3's rotary frequency scaling (null: none); 8 for Llama 3.1, 32 for Llama 3.2 1B
    rope_factor: float | None = field(default=None, metadata={"exclusive_min": 0})
    rope_low_freq_factor: float = positive_field(1.0)
    rope_high_freq_factor: float = positive_field(4.0)
    rope_original_positions: int = positive_field(8192)  # the context the frequencies were scaled from
    tie_head: bool = False  # the output head shares the token embedding (Llama 3.2 1B: true)


@dataclass
class UNetConfig:
    """``model=unet2d|unet3d``: MONAI's DynUNet, the nnU-Net network (trainrun/models/unet.py); the
    defaults are Composer's 2D UNet for BraTS."""

    dimensions: int = choice_field(2, 2, 3)  # 2: axial slices; 3: volumes (data.segmentation.patch_size agrees)
    in_channels: int = positive_field(4)  # MRI modalities
    filters: list[int] = field(default_factory=lambda: [32, 64, 128, 256, 512, 512])  # channels per level
    # per level; every patch side divides by their product
    strides: list[int] = field(default_factory=lambda: [1, 2, 2, 2, 2, 2])
    norm: str = choice_field("batch", "batch", "instance")
    residual: bool = True  # residual blocks (Composer's); nnU-Net's plain conv-norm-act pairs when false
    # deep supervision: this many extra outputs at the decoder's lower levels, their losses weighted
    # 1/2, 1/4, ... of the full-resolution one and normalised (nnU-Net's); 0: off
    deep_supervision: int = non_negative_field(0)


@dataclass
class ModelConfig:
    """Which network to build and how to initialise it; each kind's own settings under its name."""

    name: str = choice_field("resnet_small", *names("model"))
    num_classes: int = positive_field(10)
    initializers: list[str] = field(default_factory=lambda: list(INITIALIZERS))
    # start from these weights, not the initialisers: a Hugging Face save_pretrained folder (bert,
    # gpt, llama), a torch.save'd state dict, or a trainrun checkpoint
    weights: str | None = None
    # gpt, llama (model=gpt, model=llama): the shape read from model.weights' config.json, not a preset's
    shape_from_weights: bool = False
    # a model a user brings (docs/models.md): model=timm's name in timm.list_models(), model=transformers' type
    arch: str | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)  # model=timm: to timm.create_model; model=module: to it
    config: dict[str, Any] = field(default_factory=dict)  # model=transformers: settings of its config
    path: str | None = None  # model=transformers: a folder with config.json (and weights to start from)
    target: str | None = None  # model=module: package.module.Name, a torch.nn.Module of the user's own
    head: str | None = None  # model=transformers: the run's task (causal_lm, masked_lm): its Auto class
    image_size: int | None = positive_field(None)  # model=timm: the side a ViT, Swin or Mixer is built for
    resnet_small: SmallResNetConfig = field(default_factory=SmallResNetConfig)
    bert: BertConfig = field(default_factory=BertConfig)
    gpt: GPTConfig = field(default_factory=GPTConfig)
    llama: LlamaConfig = field(default_factory=LlamaConfig)
    unet: UNetConfig = field(default_factory=UNetConfig)


@dataclass
class FFCVConfig:
    """``data.loader=ffcv``: how FFCV's loader reads .beton files."""

    order: str = choice_field("random", "random", "quasi_random", "sequential")  # training order
    os_cache: bool = True  # read through the page cache (False: FFCV's own in-process cache)
    batches_ahead: int = non_negative_field(3)
    drop_last: bool = True  # training


@dataclass
class TextConfig:
    """``data=text`` and ``data=token_stream``: language-model data from a token store at
    ``data.path``, or a built-in corpus written once to ``data.cache_dir``."""

    corpus: str | None = None  # built-in corpus (stdlib_docs) used when data.path is unset
    vocab_size: int = positive_field(8192)  # vocabulary trained for a built-in corpus
    # tokenizer trained for a built-in corpus: wordpiece (BERT's; masked and causal LM) or bpe (GPT-2's
    # byte-level BPE; causal LM only)
    tokenizer: str = choice_field("wordpiece", "wordpiece", "bpe")
    max_seq_len: int = field(default=128, metadata={"min": 3})  # [CLS] + tokens + [SEP]
    packing: str = choice_field("pad", "pad", "pack")  # pad: a document per sample; pack: documents end to end
    mlm_probability: float = positive_fraction_field(0.15)  # tokens masked
    eval_mlm_probability: float = positive_fraction_field(0.15)
    # data=token_stream: validation reads the first this many held-out tokens, in order, the same on
    # any number of ranks (a multiple of max_seq_len, at most the store holds; null: every held-out window)
    val_tokens: int | None = positive_field(None)


@dataclass
class SegmentationDataConfig:
    """``data=synthetic_brats|decathlon``: multi-channel volumes with a label per voxel, preprocessed
    once into ``data.cache_dir`` (trainrun/data/segmentation.py)."""

    patch_size: list[int] = field(default_factory=lambda: [192, 160])  # training crop: (H, W) slices or (D, H, W)
    foreground_oversampling: float = fraction_field(0.33)  # share of crops centred on a foreground voxel
    samples_per_volume: int = positive_field(1)  # training crops drawn from each volume per epoch
    folds: int = field(default=5, metadata={"min": 2})  # seeded k-fold split of the cases (data.split_seed)
    fold: int = non_negative_field(0)  # the fold held out for validation
    augment: bool = True  # flips, noise, blur, brightness, contrast (nnU-Net's, Composer's probabilities)
    # nested regions, each a list of labels, learned with sigmoid outputs (one per region, model.num_classes
    # of them) and Dice + BCE, as BraTS21's [[1,2,3],[1,3],[3]]: whole tumour, tumour core, enhancing
    # tumour; empty: one softmax class per label, Dice + cross-entropy (Composer's)
    regions: list[list[int]] = field(default_factory=list)
    synthetic_cases: int = field(default=40, metadata={"min": 2})  # synthetic_brats: volumes generated
    synthetic_shape: list[int] = field(default_factory=lambda: [32, 64, 64])  # synthetic_brats: (D, H, W)
    # evaluation of whole volumes (trainrun/tasks/segmentation.py): windows (3D) or axial slices (2D) per
    # forward pass, which bounds its memory; None: one window (nnU-Net's), 64 slices (Composer's)
    window_batch: int | None = positive_field(None)
    # where the blended prediction of a volume and its Gaussian weights live: beside the model, or
    # in host memory (the windows still run on the model's device; MONAI's sw_device / device)
    blend_device: str = choice_field("model", "model", "cpu")
    # test-time mirroring: volume axes (0 depth, 1 height, 2 width) flipped, the logits averaged over
    # every combination (nnU-Net's [0, 1, 2]: 8 passes; a 2D model flips 1 and 2)
    mirror_axes: list[int] = field(default_factory=list)
    # BraTS post-processing: a predicted enhancing tumour (the last class or region) of fewer voxels
    # is removed (its voxels take their next most likely class); 0: off
    enhancing_min_voxels: int = non_negative_field(0)


@dataclass
class ShardsConfig:
    """``data=token_shards``: llm.c / modded-nanogpt token shards matched by ``data.train`` and
    ``data.val`` (trainrun/data/token_shards.py)."""

    val_tokens: int = positive_field(10_485_760)  # validation reads the first this many (the speedrun's)
    tokenizer: str | None = None  # the shards' tokenizer.json (trainrun sample, the hf_model export)


@dataclass
class MixSourceConfig:
    """One corpus of ``data=token_mix`` (trainrun/data/token_mix.py): a token store at ``path``, or
    llm.c token shards matched by the globs ``train`` and ``val``."""

    name: str | None = None  # how metrics name it: eval_loss/<name>
    weight: float = positive_field(1.0)  # its share of the training windows (the weights are normalised)
    path: str | None = None  # a token store written by trainrun write-text
    train: str | None = None  # a glob of llm.c training shards
    val: str | None = None  # a glob of llm.c validation shards


@dataclass
class DataConfig:
    """Where images or text come from and how they are cut, augmented (or masked) and batched."""

    name: str = choice_field("digits", *names("data"))
    loader: str = choice_field("torch", "torch", "ffcv")
    path: str | None = None  # folder: a directory with train/ and val/ ImageFolder trees; text: a token store
    train: str | None = None  # beton: the training .beton file; token_shards: a glob of training shards
    val: str | None = None  # beton: the validation .beton file; token_shards: a glob of validation shards
    cache_dir: str = "~/.cache/trainrun"  # where built-in sets (.beton files, token stores) are written once
    num_classes: int = positive_field(10)
    resolution: int = positive_field(8)  # training image side
    eval_resolution: int = positive_field(8)  # evaluation image side (center crop)
    eval_resize: int | None = None  # shorter side before the center crop
    # digits, mnist5k, built-in corpora: held-out share, fixed by split_seed
    val_fraction: float = open_fraction_field(0.2)
    split_seed: int = non_negative_field(0)
    num_samples: int = positive_field(2048)  # synthetic: training images
    val_samples: int = positive_field(512)  # synthetic: validation images
    crop_scale: list[float] = field(default_factory=lambda: [0.08, 1.0])  # random-resized crop
    crop_ratio: list[float] = field(default_factory=lambda: [0.75, 4 / 3])
    random_crop_padding: int = non_negative_field(0)  # built-in sets: pad-and-crop jitter in pixels
    hflip: bool = False  # built-in sets and .beton files (folders always flip)
    mean: list[float] = field(default_factory=lambda: [0.5, 0.5, 0.5])
    std: list[float] = field(default_factory=lambda: [0.25, 0.25, 0.25])
    # loader processes per training process; -1: this process's share of the node's cores
    num_workers: int = field(default=0, metadata={"min": -1})
    decode: str = choice_field("full", "full", "draft")  # folder: whole images, or JPEGs at the scale the crop needs
    pin_memory: bool | None = None  # torch loader: null = pinned when training on CUDA
    persistent_workers: bool = True  # torch loader: workers live on across epochs and evaluations (no re-fork)
    prefetch_factor: int | None = None
    ffcv: FFCVConfig = field(default_factory=FFCVConfig)
    # (training, validation) samples of the data set, for trainrun estimate's epochs where its files are
    # not at hand (data=imagenet_ffcv states ImageNet-1k's; empty: not said)
    samples: list[int] = field(default_factory=list, metadata={"length": 2, "optional": True, "exclusive_min": 0})
    text: TextConfig = field(default_factory=TextConfig)
    segmentation: SegmentationDataConfig = field(default_factory=SegmentationDataConfig)
    shards: ShardsConfig = field(default_factory=ShardsConfig)
    mix: list[MixSourceConfig] = field(default_factory=list)  # data=token_mix: the corpora, each named


@dataclass
class MuonConfig:
    """``optimizer=muon``: which parameters Adam takes and at what rates (trainrun/optim/muon.py);
    Muon takes the other 2-D matrices at ``optimizer.lr``."""

    embedding_lr: float = positive_field(0.6)  # Adam: every nn.Embedding table (a tied head too)
    head_lr: float = positive_field(0.008)  # Adam: parameters of the modules named in head_modules
    scalar_lr: float = positive_field(0.04)  # Adam: every parameter below 2-D (norm gains, biases)
    head_modules: list[str] = field(default_factory=lambda: ["head"])  # the output projection's module names
    momentum_start: float = coefficient_field(0.85)  # Muon's momentum warms from this to optimizer.momentum
    momentum_warmup: str = time_field("300ba")  # over this long


@dataclass
class OptimizerConfig:
    """Decoupled SGDW, SGD (L2 weight decay, nnU-Net's), AdamW, LAMB (MLPerf BERT's closed-division
    optimizer), Muon with Adam or RAdam."""

    name: str = choice_field("sgdw", "sgdw", "sgd", "adamw", "lamb", "muon", "radam")
    lr: float = positive_field(0.2)
    momentum: float = coefficient_field(0.9)
    dampening: float = fraction_field(0.0)
    nesterov: bool = False
    weight_decay: float = non_negative_field(5e-4)
    betas: list[float] = coefficients_field(0.9, 0.999)
    eps: float = positive_field(1e-8)
    exclude_norm_and_bias: bool = False  # no weight decay on normalisation layers and biases
    lr_scaling: str = choice_field("none", "none", "linear")  # linear: lr x train_batch_size / reference_batch_size
    reference_batch_size: int = positive_field(256)  # the global batch that ``lr`` was tuned for
    max_grad_norm: float | None = field(default=None, metadata={"exclusive_min": 0})  # lamb: global-norm clip
    muon: MuonConfig = field(default_factory=MuonConfig)


@dataclass
class SchedulerConfig:
    """Linear warmup, then one decay shape; every time in any unit, applied every step."""

    name: str = choice_field("cosine", "cosine", "linear", "poly", "step", "multistep", "constant", "wsd")
    t_warmup: str = time_field("1ep")
    alpha_f: float = non_negative_field(0.0)  # final multiplier of cosine / linear / poly / wsd decay
    power: float = positive_field(0.9)  # poly: the multiplier falls as (1 - share of the decay done) ** power
    cooldown: float = positive_fraction_field(0.4)  # wsd: the run's last share, decaying linearly to alpha_f
    step_size: str = interval_field("30ep")  # step: decay every step_size
    gamma: float = positive_field(0.1)  # step, multistep: factor per step / per milestone
    milestones: list[str] = field(default_factory=list, metadata={"time": True})  # multistep: times of x gamma
    scale_warmup: bool = True  # false: scale_schedule_ratio leaves t_warmup as written


@dataclass
class CheckpointConfig:
    """When to save and how many checkpoints to keep."""

    interval: str | None = interval_field(None)  # e.g. 1ep or 500ba; null = only at the end
    keep: int = positive_field(2)  # newest checkpoints kept in <run>/checkpoints
    save_final: bool = True
    # parallel=fsdp: write each sharded checkpoint in the background, training on meanwhile
    async_save: bool = False


@dataclass
class ParallelConfig:
    """How the ranks share the model (conf/parallel/): each a whole copy (ddp) or a shard (fsdp)."""

    name: str = choice_field("ddp", "ddp", "fsdp")  # fsdp: FSDP2, per block and on the whole model
    # fsdp: free each block's gathered weights after its forward, gather again for its backward (false: keep)
    reshard_after_forward: bool = True
    # recompute in the backward: none; selective (products, attention kept; element-wise redone); full
    activation_checkpointing: str = choice_field("none", "none", "selective", "full")
    # selective: keep all of each block's products, or every other one (alternate: torchtitan's op policy)
    selective_products: str = choice_field("all", "all", "alternate")
    # checkpoint every k-th block only (the first, then each k on; 1: all): less recompute for more memory
    checkpoint_every: int = positive_field(1)


@dataclass
class LauncherConfig:
    """How many processes train, on how many nodes: torchrun's settings under trainrun's names."""

    devices: str = "auto"  # processes on this node: auto = every GPU (1 on a CPU-only machine), or N
    nnodes: int = positive_field(1)
    node_rank: int = non_negative_field(0)
    master_addr: str = "127.0.0.1"  # the node_rank 0 machine, reachable from every node
    master_port: int | None = field(default=None, metadata={"min": 1, "max": 65535})  # null: a free port
    rdzv_endpoint: str | None = None  # host:port of a c10d rendezvous, instead of master_addr/port
    # how long a collective may wait (rank 0 writing a checkpoint, a slow rank) before the run fails
    timeout_minutes: float = field(default=60.0, metadata={"min": 1})
    # across nodes: seconds a node may go unheard (its link down, its host hung) before every node ends
    node_timeout: float = field(default=30.0, metadata={"min": 5})
    # across nodes: seconds a node waits for all to join (the master to come up) before it ends, naming it
    rendezvous_timeout: int = field(default=600, metadata={"min": 5})
    requeue: bool = True  # under Slurm, a run stopped by SIGUSR1 requeues its job after its checkpoint
    # replicas: each node a replica group (torchft); a lost node's share is trained by the others, and a
    # node started again joins live; none: a lost node ends the job (resume=auto continues it)
    fault_tolerance: str = choice_field("none", "none", "replicas")
    # fault_tolerance=replicas: host:port of `trainrun lighthouse`; null: node 0 starts one at master_port
    lighthouse: str | None = None
    # fault_tolerance=replicas: keep: the nodes left train a lost node's share too (the batch and result stay
    # the uninterrupted run's); shrink: they do not (torchft's way: a smaller batch while it is missing)
    replica_batch: str = choice_field("keep", "keep", "shrink")
    # fault_tolerance=replicas: seconds a collective between nodes may wait before its step is redone
    # without the node that did not answer (bounds the time a node cut off costs)
    replica_timeout: float = field(default=10.0, metadata={"min": 1})


@dataclass
class AutoConfig:
    """Settings of the choices measured before a run: ``recipe=auto`` and ``-o1``."""

    table: str | None = None  # recipe=auto: a 'trainrun report' CSV; default: the published table for model and data
    candidates: list[str] = field(default_factory=list)  # recipe=auto: recipes to consider (default: the table's)
    profile_steps: int = field(default=20, metadata={"min": 4})  # each candidate's schedule, compressed, timed


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
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    launcher: LauncherConfig = field(default_factory=LauncherConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    auto: AutoConfig = field(default_factory=AutoConfig)
    name: str | None = None  # the run's label in reports (recipes set their own name)
    loss: str = choice_field("soft_ce", "soft_ce", "bce")
    # fp8: bf16 with torchao's float8 matrix products (a GPU of compute capability 8.9 or newer)
    precision: str = choice_field("fp32", "fp32", "amp", "bf16", "fp8")
    compile: bool = False  # torch.compile the model (after model surgery, before DDP)
    device: str = choice_field("auto", "auto", "cpu", "cuda")
    seed: int = non_negative_field(42)
    deterministic: bool = False  # torch's deterministic kernels, no cuDNN autotuning: bitwise-repeatable GPU runs
    # reuse: freed host memory stays in the process for the next step (no page faults; up to 2 GiB
    # kept free); system: the C library's defaults (big blocks handed back to the kernel at once)
    host_memory: str = choice_field("reuse", "reuse", "system")
    max_duration: str = field(default="12ep", metadata={"time": True, "budget": True})  # or 30min, 50usd
    eval_interval: str = interval_field("1ep")
    train_batch_size: int = positive_field(64)  # global: divided among ranks
    # gradient accumulation: samples per forward/backward pass in each process; "auto" starts from
    # the whole batch and halves on out-of-memory; None: the whole batch in one pass
    device_train_microbatch_size: str | None = None
    eval_batch_size: int = positive_field(512)  # global
    scale_schedule_ratio: float = positive_field(1.0)
    quality_targets: list[float] = field(default_factory=lambda: [0.9, 0.95, 0.97])  # of the task's quality metric
    accuracy_targets: list[float] | None = None  # quality_targets' former name: read as it, with a notice
    resume: str | None = None  # "auto" (newest checkpoint in the run dir) or a path
    log_interval: int = positive_field(10)  # batches between loss checks and progress updates
    progress: bool = True  # live rich progress bar on a terminal
    profile_prefix: str | None = time_field(None)  # train only this much of the schedule; extrapolate the time
    # loggers beside metrics.jsonl, steps.jsonl and the console, which every run has: tensorboard, mlflow, wandb
    loggers: list[str] = field(default_factory=list)
    mlflow: MlflowConfig = field(default_factory=MlflowConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)
    stop_at: float | None = None  # end at the first evaluation whose quality metric reaches this (MLPerf's rule)
    # the training samples a published run of this recipe took to reach stop_at (the recipe's header
    # names the source): trainrun estimate prices the run to the target with it
    target_samples: int | None = positive_field(None)
    # at the end, the task's export of the final model (<run>/hf_model for transformers, model.pt for
    # trainrun ensemble); a sharded model is gathered whole on rank 0 for it: false skips that
    export: bool = True


def budget_seconds(config: TrainConfig) -> float:
    """Training seconds a budgeted ``max_duration`` allows: wall-clock, or money at the hardware's
    price for every node of the run."""
    budget = Time.parse(config.max_duration)
    if budget.unit is not TimeUnit.DOLLAR:
        return budget.wall_seconds
    price = config.hardware.price_per_hour
    return budget.value / (price * config.launcher.nnodes) * 3600


FORMER_NAMES = {"accuracy_targets": "quality_targets"}  # a renamed key -> its name now
