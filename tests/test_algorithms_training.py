"""What the optimizer-side and model-surgery methods do, checked against hand computations."""

import copy
import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn
from torchvision.models import resnet18, resnet50
from torchvision.ops import SqueezeExcitation

from trainrun.algorithms import build_algorithms
from trainrun.algorithms.ghost_batchnorm import GhostBatchNorm2d, apply_ghost_batchnorm
from trainrun.algorithms.label_smoothing import smooth
from trainrun.algorithms.layer_freezing import freeze_leading, frozen_fraction, layers
from trainrun.algorithms.selective_backprop import select, selection_weights
from trainrun.algorithms.specs import SPECS
from trainrun.algorithms.specs.gradient_clipping import GradientClippingConfig
from trainrun.algorithms.specs.label_smoothing import LabelSmoothingConfig
from trainrun.algorithms.specs.layer_freezing import LayerFreezingConfig
from trainrun.algorithms.specs.sam import SAMConfig
from trainrun.algorithms.specs.selective_backprop import SelectiveBackpropConfig
from trainrun.algorithms.specs.squeeze_excite import SqueezeExciteConfig
from trainrun.algorithms.specs.swa import SWAConfig
from trainrun.algorithms.squeeze_excite import apply_squeeze_excite
from trainrun.core.engine import Callback, Engine
from trainrun.core.events import Event
from trainrun.core.precision import Precision
from trainrun.core.state import State
from trainrun.core.time import Timeline
from trainrun.core.trainer import Trainer, TrainerSettings
from trainrun.data.interface import DataSpec
from trainrun.models.build import build_model
from trainrun.schema import ModelConfig
from trainrun.tasks.image_classification import ImageClassification
from trainrun.tasks.losses import binary_cross_entropy, soft_cross_entropy


class FixedBatches(DataSpec):
    """The same batch every step."""

    batches_per_epoch = 1

    def __init__(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        self.batch = (images, labels)

    def train_batches(self, epoch, skip=0):
        return iter([self.batch])

    def eval_batches(self):
        return [self.batch]


class Snapshots(Callback):
    """Weights after every step (after the algorithms' BATCH_END work)."""

    def __init__(self):
        self.weights = {}

    def run_event(self, event, state):
        if event is Event.BATCH_END:
            self.weights[state.batch] = [p.detach().clone() for p in state.raw_model.parameters()]


def fixed_batch_state(model, images, labels, steps, num_classes) -> State:
    """A State that trains ``model`` for ``steps`` steps on the one batch (images, labels)."""
    return State(
        model=model,
        optimizer=None,
        timeline=Timeline(batches_per_epoch=1, samples_per_batch=len(labels), max_batches=steps),
        device=torch.device("cpu"),
        precision=Precision("fp32", "cpu"),
        loss_fn=soft_cross_entropy,
        task=ImageClassification(),
        data=FixedBatches(images, labels),
        num_classes=num_classes,
    )


def train(model, algorithms, steps, lr=0.1, callbacks=(), labels=None):
    """``steps`` plain-SGD steps of ``model`` on one fixed random batch."""
    torch.manual_seed(1)
    images = torch.randint(0, 256, (8, 3, 2, 2), dtype=torch.uint8)
    labels = torch.randint(0, 3, (8,)) if labels is None else labels
    state = fixed_batch_state(model, images, labels, steps, num_classes=3)

    def optimization(final_model):
        optimizer = torch.optim.SGD(final_model.parameters(), lr=lr)
        return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)

    trainer = Trainer(state, optimization, Engine(algorithms, callbacks), TrainerSettings("1000ba", 1))
    trainer.fit()
    return state, state.task.normalise(images.float()), labels


class ScriptedQuality(ImageClassification):
    """Reports the next of ``values`` as the top-1 of each evaluation."""

    def __init__(self, values):
        super().__init__()
        self.values = iter(values)

    def evaluator(self, state):
        value = next(self.values)
        return SimpleNamespace(update=lambda outputs, targets: None, compute=lambda: {"top1": value, "eval_loss": 1.0})


def run_to_stop_at(task, stop_at: float) -> State:
    """Five one-batch steps, an evaluation after each, scripted by ``task``, with ``stop_at``."""
    images, labels = torch.randint(0, 256, (4, 3, 2, 2), dtype=torch.uint8), torch.tensor([0, 1, 2, 0])
    state = fixed_batch_state(nn.Sequential(nn.Flatten(), nn.Linear(12, 3)), images, labels, 5, num_classes=3)
    state.task = task

    def optimization(final_model):
        optimizer = torch.optim.SGD(final_model.parameters(), lr=0.1)
        return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)

    Trainer(state, optimization, Engine([]), TrainerSettings("1ba", 1, stop_at=stop_at)).fit()
    return state


@pytest.mark.parametrize(("second", "stops_at"), [(0.5, 2), (0.4999, 3)])
def test_a_quality_exactly_at_stop_at_ends_the_run_there(second, stops_at):
    state = run_to_stop_at(ScriptedQuality([0.25, second, 0.75, 0.8, 0.9]), 0.5)
    assert (state.batch, state.stop_reason) == (stops_at, "target_reached")


def cpu_state(model, samples_per_batch=4, **fields) -> State:
    """A State at step 0 of a 100-step run of ``model`` with plain SGD."""
    timeline = Timeline(10, samples_per_batch, 100)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return State(model, optimizer, timeline, torch.device("cpu"), Precision("fp32", "cpu"), **fields)


def tiny_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(12, 3))


def gradient(model, inputs, targets):
    model.zero_grad()
    soft_cross_entropy(model(inputs), targets).backward()
    return [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("smoothing", [None, 0.1])
def test_sam_step_equals_a_hand_written_two_pass_step(smoothing):
    rho, lr = 0.5, 0.1
    reference = tiny_model()
    configs = {"sam": SAMConfig(rho=rho, epsilon=1e-12, interval=1)}
    if smoothing:
        configs["label_smoothing"] = LabelSmoothingConfig(smoothing)
    algorithms = build_algorithms(configs)
    state, inputs, labels = train(copy.deepcopy(reference), algorithms, steps=1, lr=lr)
    targets = smooth(labels, 3, smoothing, torch.float32) if smoothing else labels
    first = gradient(reference, inputs, targets)
    norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in first]))
    start = [p.detach().clone() for p in reference.parameters()]
    with torch.no_grad():
        for p, g in zip(reference.parameters(), first):
            p.add_(rho * g / (norm + 1e-12))
    second = gradient(reference, inputs, targets)
    for got, w, g in zip(state.model.parameters(), start, second):
        assert torch.allclose(got, w - lr * g, atol=1e-6)
    plain, *_ = train(copy.deepcopy(reference), [], steps=1, lr=lr)
    assert not torch.allclose(plain.model[1].weight, state.model[1].weight)


@pytest.mark.parametrize("loss_scale", [None, 1024.0])
def test_sams_ascent_step_is_rho_over_the_norm_plus_epsilon_of_the_unscaled_gradient(loss_scale):
    """e = rho * g / (|g| + eps) with eps large enough to count; under fp16 loss scaling g is the
    unscaled gradient and the second-pass gradient is scaled again for the scaler to unscale."""
    rho, epsilon = 0.5, 0.7
    model = tiny_model()
    inputs, targets = torch.randn(8, 3, 2, 2), torch.randint(0, 3, (8,))
    scaler = torch.amp.GradScaler("cpu", init_scale=loss_scale) if loss_scale else None
    state = cpu_state(model, samples_per_batch=8, loss_fn=soft_cross_entropy)
    state.precision = Precision("fp32", "cpu", scaler=scaler)
    state.inputs, state.targets = inputs, targets
    (sam,) = build_algorithms({"sam": SAMConfig(rho=rho, epsilon=epsilon, interval=1)})
    reference = copy.deepcopy(model)
    first = gradient(reference, inputs, targets)
    loss = soft_cross_entropy(model(inputs), targets)
    (scaler.scale(loss) if scaler else loss).backward()
    start = [p.detach().clone() for p in model.parameters()]
    sam.apply(Event.AFTER_LOSS, state)
    sam.apply(Event.AFTER_BACKWARD, state)
    norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in first]))
    with torch.no_grad():
        for p, g in zip(reference.parameters(), first):
            p.add_(rho * g / (norm + epsilon))
    second = gradient(reference, inputs, targets)
    for param, w, g in zip(model.parameters(), start, second, strict=True):
        assert torch.equal(param.detach(), w)  # back at w
        assert torch.allclose(param.grad, g * (loss_scale or 1.0), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("overflow", [False, True])
def test_an_overflowing_first_pass_leaves_batchnorm_statistics_as_the_first_pass_left_them(overflow):
    """Under fp16 an overflowing first-pass gradient makes the ascent step non-finite; the second
    forward (train mode) must not write NaN into the running statistics, and the scaler skips the
    step. Without overflow the second pass updates them as any forward does."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 6), nn.BatchNorm1d(6), nn.Linear(6, 3))
    inputs, targets = torch.randn(8, 3, 2, 2), torch.randint(0, 3, (8,))
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    state = cpu_state(model, samples_per_batch=8, loss_fn=soft_cross_entropy)
    state.precision = Precision("fp32", "cpu", scaler=scaler)
    state.inputs, state.targets = inputs, targets
    (sam,) = build_algorithms({"sam": SAMConfig(rho=0.5, interval=1)})
    scaler.scale(soft_cross_entropy(model(inputs), targets)).backward()
    if overflow:
        model[1].weight.grad[0, 0] = float("inf")
    norm = model[2]
    statistics = (norm.running_mean, norm.running_var, norm.num_batches_tracked)
    after_first_pass = [b.clone() for b in statistics]
    sam.apply(Event.AFTER_LOSS, state)
    sam.apply(Event.AFTER_BACKWARD, state)
    for got, first in zip(statistics, after_first_pass, strict=True):
        assert got.shape == first.shape and torch.isfinite(got.float()).all()
        assert torch.equal(got, first) is overflow  # without overflow the second pass updated them
    assert int(norm.num_batches_tracked) == (1 if overflow else 2)
    weight_before = model[1].weight.detach().clone()
    scaler.unscale_(state.optimizer)
    scaler.step(state.optimizer)
    scaler.update()
    assert torch.equal(model[1].weight, weight_before) is overflow  # the scaler skips only the overflowed step
    assert scaler.get_scale() == (512.0 if overflow else 1024.0)


def test_sam_runs_every_interval_th_step_with_each_ranks_own_ascent_gradient():
    """Under DDP the first pass keeps each rank's gradient (no all-reduce); the second syncs."""
    from torch.nn.parallel import DistributedDataParallel

    class OneRankDDP(DistributedDataParallel):
        def __init__(self, module):
            nn.Module.__init__(self)
            self.module, self.require_backward_grad_sync = module, True

        def forward(self, *args):
            return self.module(*args)

    (sam,) = build_algorithms({"sam": SAMConfig(rho=0.5, interval=3)})
    state = cpu_state(tiny_model(), loss_fn=soft_cross_entropy)
    assert [b for b in range(8) if sam.match(Event.BEFORE_FORWARD, state_at(state, b))] == [0, 3, 6]
    assert not sam.match(Event.BATCH_END, state_at(state, 3))
    state.model = OneRankDDP(state.raw_model)
    state.inputs, state.targets = torch.randn(4, 3, 2, 2), torch.randint(0, 3, (4,))
    sam.apply(Event.BEFORE_FORWARD, state)
    assert state.model.require_backward_grad_sync is False
    soft_cross_entropy(state.model(state.inputs), state.targets).backward()
    sam.apply(Event.AFTER_LOSS, state)
    sam.apply(Event.AFTER_BACKWARD, state)
    assert state.model.require_backward_grad_sync is True


def state_at(state, batch):
    state.batch = batch
    return state


def test_sam_interval_and_gradient_clipping_order():
    """SAM every 2nd step; clipping (BEFORE_OPTIMIZER_STEP) clips the second-pass gradient."""
    reference = tiny_model()
    algorithms = build_algorithms(
        {"sam": SAMConfig(rho=0.5, interval=2), "gradient_clipping": GradientClippingConfig("norm", 1e-3)}
    )
    snapshots = Snapshots()
    state, inputs, labels = train(copy.deepcopy(reference), algorithms, steps=2, lr=1.0, callbacks=[snapshots])
    first = gradient(reference, inputs, labels)
    norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in first]))
    with torch.no_grad():
        start = [p.clone() for p in reference.parameters()]
        for p, g in zip(reference.parameters(), first):
            p.add_(0.5 * g / norm)
    second = gradient(reference, inputs, labels)
    second_norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in second]))
    for got, w, g in zip(snapshots.weights[1], start, second):
        assert torch.allclose(got, w - g * (1e-3 / second_norm), atol=1e-7)
    with torch.no_grad():
        for p, w in zip(reference.parameters(), snapshots.weights[1]):
            p.copy_(w)
    plain = gradient(reference, inputs, labels)  # step 2 (batch index 1) is an ordinary step
    plain_norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in plain]))
    for got, w, g in zip(snapshots.weights[2], snapshots.weights[1], plain):
        assert torch.allclose(got, w - g * (1e-3 / plain_norm), atol=1e-7)


def test_swa_averages_the_window_and_loads_it_at_the_end_before_ema():
    snapshots = Snapshots()
    configs = {
        "swa": SWAConfig(swa_start="2ba", swa_end="8ba", update_interval="2ba"),
        "ema": SPECS["ema"].config(half_life="2ba", update_interval="1ba"),
    }
    algorithms = build_algorithms(configs)
    ema = next(a for a in algorithms if a.name == "ema")
    averages = {}

    class EMAWatch(Callback):
        def run_event(self, event, state):
            if event is Event.BATCH_END:
                averages[state.batch] = [p.detach().clone() for p in ema.average.module.parameters()]

    state, *_ = train(tiny_model(), algorithms, steps=10, callbacks=[snapshots, EMAWatch()])
    swa = next(a for a in algorithms if a.name == "swa")
    assert int(swa.average.n_averaged) == 3 and swa.loaded
    mean = [torch.stack(ws).mean(0) for ws in zip(snapshots.weights[2], snapshots.weights[4], snapshots.weights[6])]
    for got, want in zip(snapshots.weights[8], mean):
        assert torch.allclose(got, want, atol=1e-6)  # the model holds the SWA average after step 8
    s = 2**-0.5
    for got, before, loaded in zip(averages[8], averages[7], mean):
        assert torch.allclose(got, s * before + (1 - s) * loaded, atol=1e-6)  # EMA saw the loaded weights
    assert not torch.allclose(snapshots.weights[10][1], mean[1])  # training went on after swa_end


def test_swa_state_round_trips():
    algorithms = build_algorithms({"swa": SWAConfig(swa_start="1ba", swa_end="10ba", update_interval="1ba")})
    state, *_ = train(tiny_model(), algorithms, steps=4)
    saved = algorithms[0].state_dict()
    (restored,) = build_algorithms({"swa": SWAConfig(swa_start="1ba", swa_end="10ba", update_interval="1ba")})
    restored.apply(Event.FIT_START, state)  # builds the average; a resume restores it right after
    restored.load_state_dict(saved)
    assert int(restored.average.n_averaged) == 4
    for a, b in zip(restored.average.parameters(), algorithms[0].average.parameters()):
        assert torch.equal(a, b)


def test_swa_averages_every_interval_from_the_start_and_loads_the_average_at_the_end():
    (swa,) = build_algorithms({"swa": SWAConfig(swa_start="3ba", swa_end="13ba", update_interval="4ba")})
    assert swa.state_dict() == {}  # nothing to save before the run starts
    state = cpu_state(nn.Linear(2, 2))
    swa.apply(Event.FIT_START, state)
    assert swa.match(Event.FIT_START, state) and not swa.match(Event.EPOCH_END, state)
    matched = []
    for batch in range(20):
        state.batch = batch
        if swa.match(Event.BATCH_END, state):
            matched.append(batch)
            swa.apply(Event.BATCH_END, state)
    assert matched == [3, 7, 11, 13]  # 13 = swa_end, though 13 - 3 is not a multiple of 4: the average loads
    assert swa.loaded and int(swa.average.n_averaged) == 3
    saved = swa.state_dict()
    (resumed,) = build_algorithms({"swa": SWAConfig(swa_start="3ba", swa_end="13ba", update_interval="4ba")})
    resumed.apply(Event.FIT_START, state)
    resumed.load_state_dict(saved)
    state.batch = 15
    assert resumed.loaded is True and not resumed.match(Event.BATCH_END, state)  # loaded once, never again


@pytest.mark.parametrize(("progress", "fraction"), [(0.0, 0.0), (0.5, 0.0), (0.75, 0.5), (0.9, 0.8), (1.0, 1.0)])
def test_layer_freezing_fraction_over_training(progress, fraction):
    assert frozen_fraction(progress, 0.5, 1.0) == pytest.approx(fraction)


def test_layer_freezing_freezes_the_leading_layers_and_they_stop_changing():
    model = resnet18(num_classes=3)
    all_layers = layers(model)
    assert len(all_layers) == 41 and all_layers[0] is model.conv1 and all_layers[-1] is model.fc
    (freezing,) = build_algorithms({"layer_freezing": LayerFreezingConfig(freeze_start=0.5, freeze_level=1.0)})
    state = cpu_state(model, samples_per_batch=4)
    state.batch = 75
    freezing.apply(Event.EPOCH_END, state)
    frozen = [not p.requires_grad for layer in all_layers for p in layer.parameters()]
    count = int(0.5 * 41)
    assert sum(not layer.weight.requires_grad for layer in all_layers) == count
    assert frozen == sorted(frozen, reverse=True)  # leading layers only
    before = model.conv1.weight.clone()
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    state.optimizer.step()
    assert torch.equal(model.conv1.weight, before) and model.conv1.weight.grad is None
    assert model.fc.weight.grad is not None
    assert freeze_leading(model, 1.0) == 41


def test_layer_freezing_never_freezes_when_it_starts_at_the_end_and_tells_ddp_about_frozen_layers():
    assert frozen_fraction(1.0, 1.0, 1.0) == 0.0 and frozen_fraction(1.0, 0.5, 0.6) == pytest.approx(0.6)
    (freezing,) = build_algorithms({"layer_freezing": LayerFreezingConfig(freeze_start=0.5, freeze_level=1.0)})
    state = cpu_state(nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2)))
    freezing.apply(Event.INIT, state)
    assert state.find_unused_parameters is True  # DDP must not wait for gradients of frozen layers
    assert [type(m) for m in layers(state.raw_model)] == [nn.Linear, nn.Linear]  # ReLU has no parameters


def test_a_compiled_model_is_recompiled_once_per_new_freeze_level(monkeypatch):
    resets = []
    monkeypatch.setattr(torch.compiler, "reset", lambda: resets.append(True))
    model = nn.Sequential(*(nn.Linear(2, 2) for _ in range(4)))
    (freezing,) = build_algorithms({"layer_freezing": LayerFreezingConfig(freeze_start=0.0, freeze_level=1.0)})
    state = cpu_state(model)
    state.model = torch.compile(model)  # compiled lazily: nothing is compiled here
    log = []
    for event, batch in [(Event.FIT_START, 0), (Event.EPOCH_END, 10), (Event.EPOCH_END, 20), (Event.EPOCH_END, 25)]:
        state.batch = batch
        freezing.apply(event, state)
        log.append((sum(not p.requires_grad for p in model.parameters()) // 2, len(resets)))
    assert log == [(0, 0), (0, 0), (0, 0), (1, 1)]  # 10 %, 20 %: none of 4 layers; 25 %: one, one recompile
    assert [n["text"] for n in state.notices] == [
        "layer_freezing: 1 layers frozen; torch.compile recompiles the model once"
    ]
    plain = cpu_state(nn.Sequential(*(nn.Linear(2, 2) for _ in range(4))))
    plain.batch = 50
    freezing.apply(Event.EPOCH_END, plain)  # not compiled: nothing to reset
    assert len(resets) == 1 and plain.notices == []


def test_ghost_batchnorm_normalises_each_chunk_and_divides_the_momentum():
    torch.manual_seed(0)
    bn = nn.BatchNorm2d(3)
    ghost = GhostBatchNorm2d(copy.deepcopy(bn), ghost_batch_size=4)
    x = torch.randn(10, 3, 5, 5) * 3 + 1
    out = ghost(x)
    expected, running = [], torch.zeros(3)
    for chunk in x.split(4):  # chunks of 4, 4, 2
        mean, var = chunk.mean((0, 2, 3)), chunk.var((0, 2, 3), unbiased=False)
        expected.append((chunk - mean.view(1, 3, 1, 1)) / torch.sqrt(var.view(1, 3, 1, 1) + bn.eps))
        running = (1 - 0.1 / 3) * running + 0.1 / 3 * mean
    assert torch.allclose(out, torch.cat(expected), atol=1e-5)
    assert torch.allclose(ghost.running_mean, running, atol=1e-6)
    ghost.eval(), bn.eval()
    bn.load_state_dict(ghost.state_dict())
    assert torch.allclose(ghost(x), bn(x))
    model = resnet18()
    assert apply_ghost_batchnorm(model, SPECS["ghost_batchnorm"].config(16)) == 20
    assert isinstance(model.bn1, GhostBatchNorm2d)


def ghost_by_formula(x, size, eps, weight=None, bias=None):
    """Each chunk of ``size`` samples normalised with its own mean and (biased) variance."""
    parts = []
    for chunk in x.split(size):
        mean, var = chunk.mean((0, 2, 3), keepdim=True), chunk.var((0, 2, 3), unbiased=False, keepdim=True)
        part = (chunk - mean) / torch.sqrt(var + eps)
        if weight is not None:
            part = part * weight.view(1, -1, 1, 1) + bias.view(1, -1, 1, 1)
        parts.append(part)
    return torch.cat(parts)


def test_ghost_batchnorm_keeps_every_batchnorm_setting():
    torch.manual_seed(0)
    x = torch.randn(10, 3, 4, 4) * 2 + 1
    wide_eps = nn.BatchNorm2d(3, eps=0.5)
    nn.init.normal_(wide_eps.weight), nn.init.normal_(wide_eps.bias)
    ghost = GhostBatchNorm2d(copy.deepcopy(wide_eps), ghost_batch_size=4)
    out = ghost(x)
    assert out.shape == x.shape and torch.allclose(
        out, ghost_by_formula(x, 4, 0.5, wide_eps.weight, wide_eps.bias), atol=1e-5
    )
    assert int(ghost.num_batches_tracked) == 1  # one step, whatever the number of chunks
    for plain in (nn.BatchNorm2d(3, affine=False), nn.BatchNorm2d(3, track_running_stats=False)):
        ghost = GhostBatchNorm2d(copy.deepcopy(plain), ghost_batch_size=4)
        assert (ghost.weight is None, ghost.running_mean is None) == (plain.weight is None, plain.running_mean is None)
        assert torch.allclose(ghost(x), ghost_by_formula(x, 4, 1e-5, plain.weight, plain.bias), atol=1e-5)
    cumulative = nn.BatchNorm2d(3, momentum=None)  # a cumulative average has no per-chunk momentum: plain BN
    ghost = GhostBatchNorm2d(copy.deepcopy(cumulative), ghost_batch_size=4)
    assert torch.allclose(ghost(x), cumulative(x), atol=1e-6) and torch.allclose(
        ghost.running_var, cumulative.running_var
    )
    with torch.device("meta"):
        on_device = nn.BatchNorm2d(3)
    assert {t.device.type for t in GhostBatchNorm2d(on_device, 4).state_dict().values()} == {"meta"}


def test_squeeze_excite_gates_exactly_the_large_convs_of_resnet50():
    model = resnet50()
    large = sum(1 for m in model.modules() if isinstance(m, nn.Conv2d) and min(m.in_channels, m.out_channels) >= 128)
    assert large == 13 + 19 + 10  # every conv of layers 2-4 (incl. downsample), none of layer 1
    assert apply_squeeze_excite(model, SqueezeExciteConfig()) == large
    gates = [m for m in model.modules() if isinstance(m, SqueezeExcitation)]
    assert len(gates) == large and gates[0].fc1.out_channels == 64
    conv, gate = model.layer2[0].conv2
    x = torch.randn(2, 128, 8, 8)
    ratio = gate(conv(x)) / conv(x)
    per_channel = ratio[:, :, 0, 0][:, :, None, None].expand_as(ratio)
    assert torch.allclose(ratio, per_channel, atol=1e-4) and (ratio > 0).all() and (ratio < 1).all()
    assert model(torch.randn(1, 3, 64, 64)).shape == (1, 1000)


def test_bce_is_the_loss_choice_and_the_default_initialisers_start_sigmoids_at_one_over_c():
    assert ImageClassification().loss("bce") is binary_cross_entropy
    model = build_model(ModelConfig(name="resnet18", num_classes=10))
    assert torch.allclose(model.fc.bias, torch.full((10,), -math.log(10)))


def test_selective_backprop_keeps_high_loss_examples_and_leaves_bn_alone():
    losses = torch.tensor([0.1, 5.0, 0.2, 3.0, 0.05, 1.0, 0.3, 2.0])
    weights = selection_weights(losses, keep=0.5)
    assert weights.argmax() == 1 and weights.argmin() == 4  # highest and lowest loss
    assert selection_weights(losses.to("meta"), keep=0.5).device.type == "meta"  # losses on a GPU stay there
    torch.manual_seed(0)
    picks = torch.stack([select(losses, 0.5) for _ in range(500)])
    assert picks.shape == (500, 4)
    counts = torch.bincount(picks.flatten(), minlength=8)
    assert counts[1] > 3 * counts[4]
    model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(16, 3))
    (backprop,) = build_algorithms({"selective_backprop": SelectiveBackpropConfig(start=0.5, end=0.9, keep=0.25)})
    state = cpu_state(model, samples_per_batch=8)
    state.inputs, state.targets = torch.randn(8, 3, 2, 2), torch.randint(0, 3, (8,))
    active = []
    for batch in range(100):
        state.batch = batch
        active.append(backprop.match(Event.AFTER_DATALOADER, state))
    assert active.index(True) == 50 and sum(active) == 20  # steps 50-89, every second one full
    stats = model[1].running_mean.clone()
    state.batch = 50
    backprop.apply(Event.AFTER_DATALOADER, state)
    assert state.inputs.shape[0] == 2 and state.targets.shape == (2,)
    assert torch.equal(model[1].running_mean, stats)


def test_selective_backprop_weights_are_the_rank_percentile_to_the_power_one_over_keep_minus_one():
    losses = torch.tensor([0.3, 0.1, 0.9, 0.5])  # ranks 1, 0, 3, 2
    for keep in (0.25, 0.5, 0.8):
        expected = ((torch.tensor([1.0, 0.0, 3.0, 2.0]) + 0.5) / 4) ** (1 / keep - 1)
        weights = selection_weights(losses, keep)
        assert weights.shape == expected.shape and torch.allclose(weights, expected)
    assert select(torch.tensor([0.3, 0.1, 0.9]), 0.1).shape == (1,)  # at least one example
    torch.manual_seed(0)
    draws = [select(torch.rand(8), 0.75) for _ in range(200)]
    assert all(len(set(d.tolist())) == 6 for d in draws)  # without replacement


def test_selective_backprop_skips_every_interval_th_batch_and_acts_only_after_the_dataloader():
    config = SelectiveBackpropConfig(start=0.0, end=1.0, keep=0.5, interval=3)
    (backprop,) = build_algorithms({"selective_backprop": config})
    state = cpu_state(nn.Linear(2, 2))
    active = []
    for batch in range(9):
        state.batch = batch
        active.append(backprop.match(Event.AFTER_DATALOADER, state))
    assert active == [True, True, False] * 3  # the 3rd, 6th, 9th batches train in full
    state.batch = 0
    assert not any(backprop.match(event, state) for event in Event if event is not Event.AFTER_DATALOADER)


def test_squeeze_excite_width_is_a_fraction_below_one_and_a_channel_count_from_one():
    from trainrun.algorithms.squeeze_excite import latent

    assert latent(256, 0.125) == 32 and latent(256, 64) == 64 and latent(256, 1) == 1 and latent(256, 1.5) == 1
    assert latent(8, 0.01) == 1 and latent(100, 0.999) == 99
    model = nn.Sequential(nn.Conv2d(8, 16, 1))
    apply_squeeze_excite(model, SqueezeExciteConfig(latent_channels=0.25, min_channels=8))
    assert model[0][1].fc1.out_channels == 4  # a quarter of the conv's 16 outputs
    with torch.device("meta"):
        on_device = nn.Sequential(nn.Conv2d(8, 16, 1))
    apply_squeeze_excite(on_device, SqueezeExciteConfig(min_channels=8))
    assert {p.device.type for p in on_device.parameters()} == {"meta"}  # the gate joins the conv's device


def test_layers_added_by_model_surgery_are_trained():
    class AtStart(Callback):
        def run_event(self, event, state):
            if event is Event.FIT_START:
                self.params = {n: p.detach().clone() for n, p in state.raw_model.named_parameters()}

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(16, 3))
    configs = {"squeeze_excite": SqueezeExciteConfig(latent_channels=2, min_channels=3)}
    configs["ghost_batchnorm"] = SPECS["ghost_batchnorm"].config(ghost_batch_size=4)
    start = AtStart()
    state, *_ = train(model, build_algorithms(configs), steps=2, callbacks=[start])
    assert isinstance(model[0][1], SqueezeExcitation) and isinstance(model[1], GhostBatchNorm2d)
    for name, param in state.raw_model.named_parameters():
        assert not torch.equal(param, start.params[name]), f"{name} was not optimized"
