"""What the optimizer-side and model-surgery methods do, checked against hand computations."""

import copy
import math

import pytest
import torch
from torch import nn
from torchvision.models import resnet18, resnet50
from torchvision.ops import SqueezeExcitation

from trainrun.algorithms import build_algorithms
from trainrun.algorithms.bce_loss import classifier
from trainrun.algorithms.ghost_batchnorm import GhostBatchNorm2d, apply_ghost_batchnorm
from trainrun.algorithms.label_smoothing import smooth
from trainrun.algorithms.layer_freezing import freeze_leading, frozen_fraction, layers
from trainrun.algorithms.selective_backprop import select, selection_weights
from trainrun.algorithms.squeeze_excite import apply_squeeze_excite
from trainrun.core.engine import Callback, Engine
from trainrun.core.events import Event
from trainrun.core.precision import Precision
from trainrun.core.state import State
from trainrun.core.time import Timeline
from trainrun.core.trainer import Trainer, TrainerSettings
from trainrun.data.spec import DataSpec
from trainrun.loss import binary_cross_entropy, soft_cross_entropy
from trainrun.schema import (
    ALGORITHM_CONFIGS,
    DataConfig,
    GradientClippingConfig,
    LabelSmoothingConfig,
    LayerFreezingConfig,
    SAMConfig,
    SelectiveBackpropConfig,
    SqueezeExciteConfig,
    SWAConfig,
)
from trainrun.tasks.image_classification import ImageClassification


class FixedBatches(DataSpec):
    """The same batch every step."""

    batches_per_epoch = 1

    def __init__(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        super().__init__(DataConfig())
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
    return state, state.data.prepare(images.float()), labels


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
    algorithms = build_algorithms({"sam": SAMConfig(rho=rho, epsilon=1e-12, interval=1)})
    if smoothing:
        algorithms += build_algorithms({"label_smoothing": LabelSmoothingConfig(smoothing)})
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
        "ema": ALGORITHM_CONFIGS["ema"](half_life="2ba", update_interval="1ba"),
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
    assert apply_ghost_batchnorm(model, ALGORITHM_CONFIGS["ghost_batchnorm"](16)) == 20
    assert isinstance(model.bn1, GhostBatchNorm2d)


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


def test_bce_loss_replaces_the_loss_and_starts_sigmoids_at_one_over_c():
    model = resnet18(num_classes=10)
    (bce,) = build_algorithms({"bce_loss": ALGORITHM_CONFIGS["bce_loss"]()})
    state = cpu_state(model, samples_per_batch=4, loss_fn=soft_cross_entropy, num_classes=10)
    bce.apply(Event.INIT, state)
    assert state.loss_fn is binary_cross_entropy and classifier(model) is model.fc
    assert torch.allclose(model.fc.bias, torch.full((10,), -math.log(10)))


def test_selective_backprop_keeps_high_loss_examples_and_leaves_bn_alone():
    losses = torch.tensor([0.1, 5.0, 0.2, 3.0, 0.05, 1.0, 0.3, 2.0])
    weights = selection_weights(losses, keep=0.5)
    assert weights.argmax() == 1 and weights.argmin() == 4  # highest and lowest loss
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


def test_layers_added_by_model_surgery_are_trained():
    class AtStart(Callback):
        def run_event(self, event, state):
            if event is Event.FIT_START:
                self.params = {n: p.detach().clone() for n, p in state.raw_model.named_parameters()}

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(16, 3))
    configs = {"squeeze_excite": SqueezeExciteConfig(latent_channels=2, min_channels=3)}
    configs["ghost_batchnorm"] = ALGORITHM_CONFIGS["ghost_batchnorm"](ghost_batch_size=4)
    start = AtStart()
    state, *_ = train(model, build_algorithms(configs), steps=2, callbacks=[start])
    assert isinstance(model[0][1], SqueezeExcitation) and isinstance(model[1], GhostBatchNorm2d)
    for name, param in state.raw_model.named_parameters():
        assert not torch.equal(param, start.params[name]), f"{name} was not optimized"
