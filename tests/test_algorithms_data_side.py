"""Progressive resizing, FixRes, MixUp, CutMix, ColOut, stochastic depth and per-image augmentation."""

import pytest
import torch
from test_engine_algorithms import make_state

from trainrun.algorithms import build_algorithms
from trainrun.algorithms.progressive_resizing import size_at
from trainrun.core.engine import Engine
from trainrun.core.events import Event
from trainrun.data import TorchData
from trainrun.data.builtin import builtin_datasets
from trainrun.data.spec import DataSpec
from trainrun.schema import (
    CutMixConfig,
    DataConfig,
    FixResConfig,
    MixUpConfig,
    ProgressiveResizingConfig,
    RandAugmentConfig,
    TrivialAugmentConfig,
)

MILD = ProgressiveResizingConfig(initial_scale=0.5, delay=0.4, finetune=0.2, size_increment=4)


@pytest.mark.parametrize(
    ("progress", "size"), [(0.0, 88), (0.4, 88), (0.45, 100), (0.6, 132), (0.7, 152), (0.8, 176), (1.0, 176)]
)
def test_mild_sizes_over_training(progress, size):
    """scale · 176 to the nearest multiple of 4, as the reference rounds it: at 45 % the scale is
    0.5625, 99 px, and 100 px (flooring would give 96); at 70 % 154 px is a tie, and round() gives 152."""
    assert size_at(progress, 176, MILD) == size


def test_hot_settings_start_larger_and_ramp_earlier():
    hot = ProgressiveResizingConfig(initial_scale=0.6, delay=0.2, finetune=0.2, size_increment=4)
    assert [size_at(p, 176, hot) for p in (0.0, 0.2, 0.5, 0.8)] == [104, 104, 140, 176]


def test_crop_mode_cuts_one_random_window_of_the_size_per_batch_anywhere_in_the_image():
    """``mode=crop``: every image of the batch is cut at the same (top, left), drawn uniformly so
    that every window position, the last row and column included, occurs."""
    (resizing,) = build_algorithms({"progressive_resizing": ProgressiveResizingConfig(mode="crop")})
    images = torch.arange(2 * 3 * 7 * 9.0).view(2, 3, 7, 9)
    corners = set()
    torch.manual_seed(0)
    for _ in range(400):
        crop = resizing.shrink(images, 4)
        assert crop.shape == (2, 3, 4, 4)
        top, left = divmod(int(crop[0, 0, 0, 0]), 9)
        assert torch.equal(crop, images[..., top : top + 4, left : left + 4])
        corners.add((top, left))
    assert corners == {(top, left) for top in range(7 - 4 + 1) for left in range(9 - 4 + 1)}


def test_fixres_shrinks_with_antialiasing_so_fine_detail_keeps_its_mean_brightness():
    """A 1-in-4 line pattern (mean 0.25) shrunk 4x: an antialiased filter averages it (0.25 inside,
    0.18-0.29 at the borders); plain bilinear sampling reads between the lines and gives 0."""
    (fixres,) = build_algorithms({"fixres": FixResConfig(train_resolution=4)})
    lines = (torch.arange(16) % 4 == 0).float().expand(1, 1, 16, 16)
    small = fixres.shrink(lines, 4)
    assert small.shape == (1, 1, 4, 4)
    assert torch.allclose(small[..., 1:3], torch.full((1, 1, 4, 2), 0.25))
    assert float(small.min()) > 0.15 and float(small.mean()) == pytest.approx(0.25, abs=0.01)


def test_resize_mode_is_nearest_neighbour_from_the_formula():
    """Output pixel (i, j) of an ``s`` x ``s`` resize of an H x W image is input pixel
    (floor(i·H/s), floor(j·W/s)), for sizes that do not divide the image too."""
    (resizing,) = build_algorithms({"progressive_resizing": ProgressiveResizingConfig(mode="resize")})
    images = torch.arange(2 * 12 * 10.0).view(1, 2, 12, 10)
    out = resizing.shrink(images, 7)
    assert out.shape == (1, 2, 7, 7)
    rows, cols = [i * 12 // 7 for i in range(7)], [j * 10 // 7 for j in range(7)]
    assert torch.equal(out, images[..., rows, :][..., cols])


class Decoding(DataSpec):
    """A loader that can decode at any size, recording the sizes asked for (as FFCV's can)."""

    def __init__(self):
        super().__init__(DataConfig())
        self.sizes = []

    def train_batches(self, epoch, skip=0):
        return iter(())

    def eval_batches(self):
        return ()

    def set_train_resolution(self, size):
        self.sizes.append(size)
        return True


def test_resizes_batches_or_asks_the_loader_to_decode_smaller():
    (resizing,) = build_algorithms({"progressive_resizing": MILD})
    state = make_state(max_batches=100)
    state.train_resolution, state.batch = 16, 0
    resizing.apply(Event.EPOCH_START, state)  # no loader that decodes: resize on the device
    state.inputs = torch.arange(256.0).view(1, 1, 16, 16)
    resizing.apply(Event.AFTER_DATALOADER, state)
    assert state.inputs.shape[-1] == 8
    assert torch.equal(state.inputs[0, 0, 0], torch.arange(0.0, 16, 2))  # nearest neighbour
    state.data, state.batch = Decoding(), 60
    engine = Engine([resizing])
    engine.run(Event.EPOCH_START, state)
    state.inputs = torch.zeros(1, 3, 16, 16)  # larger than the target: only a resize could change it
    engine.run(Event.AFTER_DATALOADER, state)
    assert state.data.sizes == [12] and state.inputs.shape[-1] == 16  # the loader decodes; batches left alone


@pytest.mark.parametrize(("name", "config"), [("mixup", MixUpConfig(alpha=0.4)), ("cutmix", CutMixConfig())])
def test_mixing_targets_sum_to_one_and_use_the_drawn_lambda(name, config):
    torch.manual_seed(0)
    (mixing,) = build_algorithms({name: config})
    state = make_state()
    state.num_classes = 5
    images = torch.arange(4.0).view(4, 1, 1, 1).expand(4, 3, 8, 8).contiguous()  # sample i is all i
    labels = torch.tensor([0, 1, 2, 3])
    state.inputs, state.targets = images.clone(), labels.clone()
    mixing.apply(Event.BEFORE_FORWARD, state)
    assert torch.allclose(state.targets.sum(1), torch.ones(4))
    partner = labels.roll(1)
    for i in range(4):
        own = float((state.inputs[i] == images[i]).float().mean()) if name == "cutmix" else None
        if name == "mixup":  # pixel = lam * i + (1 - lam) * partner
            lam = (float(state.inputs[i, 0, 0, 0]) - float(partner[i])) / (i - float(partner[i]))
        else:  # the share of pixels still the sample's own is the label weight
            lam = own
        expected = torch.zeros(5)
        expected[labels[i]] += lam
        expected[partner[i]] += 1 - lam
        assert torch.allclose(state.targets[i], expected, atol=1e-5), (name, i)


def test_colout_keeps_rows_and_columns_in_order():
    from trainrun.algorithms.colout import colout

    images = torch.arange(176.0).view(1, 1, 1, 176).expand(4, 3, 176, 176).contiguous()
    for batch in (True, False):
        out = colout(images, 0.15, 0.15, batch)
        assert out.shape == (4, 3, int(0.85 * 176), int(0.85 * 176)) == (4, 3, 149, 149)
        columns = out[:, 0, 0]  # each row of the image is 0..175: the kept columns, in order
        assert bool((columns[:, 1:] > columns[:, :-1]).all())
        same = all(torch.equal(columns[0], columns[i]) for i in range(4))
        assert same == batch  # batch mode: the same columns for every sample


def test_stochastic_depth_rates_are_linear_over_the_16_resnet50_blocks():
    from torchvision.models import resnet50

    from trainrun.algorithms.stochastic_depth import apply_stochastic_depth
    from trainrun.schema import StochasticDepthConfig

    model = resnet50()
    blocks = apply_stochastic_depth(model, StochasticDepthConfig(drop_rate=0.1))
    assert len(blocks) == 16
    assert [b.drop.p for b in blocks] == pytest.approx([(i + 1) / 16 * 0.1 for i in range(16)])
    model.eval()
    x = torch.randn(2, 3, 64, 64)
    assert torch.equal(model(x), model(x))  # evaluation keeps every branch


def test_stochastic_depth_drops_whole_branches_per_sample():
    from torchvision.models.resnet import BasicBlock

    from trainrun.algorithms.stochastic_depth import StochasticBlock

    torch.manual_seed(0)
    block = StochasticBlock(BasicBlock(4, 4), p=0.5, mode="sample").train()
    x = torch.randn(400, 4, 5, 5)
    out = block(x)
    skipped = torch.isclose(out, torch.relu(x)).flatten(1).all(1)  # branch dropped: relu(identity)
    assert 0.4 < skipped.float().mean() < 0.6


def test_fixres_trains_below_the_evaluation_resolution_and_progressive_resizing_ramps_to_it():
    algorithms = build_algorithms({"fixres": FixResConfig(train_resolution=12), "progressive_resizing": MILD})
    engine = Engine(algorithms)
    state = make_state(max_batches=100)
    state.train_resolution = 16
    engine.run(Event.INIT, state)
    assert state.train_resolution == 12
    state.batch = 90  # progressive resizing is at full (training) size
    engine.run(Event.EPOCH_START, state)
    state.inputs = torch.rand(2, 3, 16, 16)
    engine.run(Event.AFTER_DATALOADER, state)
    assert state.inputs.shape[-2:] == (12, 12)
    state.batch, state.data = 0, Decoding()
    engine.run(Event.EPOCH_START, state)
    assert state.data.sizes == [12, 8]  # FixRes asks for 12, progressive resizing then for 0.5 x 12 = 6 -> 8


@pytest.mark.parametrize("config", [RandAugmentConfig(depth=2, severity=10), TrivialAugmentConfig()])
def test_per_image_augmentation_joins_the_torch_training_pipeline(config):
    data_config = DataConfig(name="digits")
    train_set, val_set = builtin_datasets(data_config, augment=False)
    data = TorchData(data_config, train_set, val_set, 64, 64, seed=0)
    plain, _ = next(data.train_batches(0))
    (augment,) = build_algorithms({config.__class__.__name__.removesuffix("Config").lower(): config})
    state = make_state()
    state.data = data
    torch.manual_seed(0)
    augment.apply(Event.FIT_START, state)
    augmented, _ = next(data.train_batches(0))
    assert augmented.dtype == torch.uint8 and augmented.shape == plain.shape
    changed = (augmented != plain).flatten(1).any(1).float().mean()
    assert changed > 0.5  # most images were transformed
    assert not Decoding().add_train_transform(augment.transform)  # loaders without Python transforms refuse
