"""Progressive resizing, FixRes, MixUp, CutMix, ColOut, stochastic depth and per-image augmentation."""

import dataclasses

import pytest
import torch
from test_engine_algorithms import make_state

from trainrun.algorithms import build_algorithms
from trainrun.algorithms.progressive_resizing import size_at
from trainrun.algorithms.specs import SPECS
from trainrun.algorithms.specs.cutmix import CutMixConfig
from trainrun.algorithms.specs.fixres import FixResConfig
from trainrun.algorithms.specs.mixup import MixUpConfig
from trainrun.algorithms.specs.progressive_resizing import ProgressiveResizingConfig
from trainrun.algorithms.specs.randaugment import RandAugmentConfig
from trainrun.algorithms.specs.trivialaugment import TrivialAugmentConfig
from trainrun.core.engine import Engine
from trainrun.core.events import Event
from trainrun.core.work import StepWork
from trainrun.data.build import Datasets, TorchData
from trainrun.data.builtin import builtin_datasets
from trainrun.data.interface import DataSpec
from trainrun.errors import ConfigError
from trainrun.schema import DataConfig

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


def test_resizing_as_composer_keeps_the_loader_at_full_size_and_shrinks_on_the_device():
    """loader_decodes=false: a loader that could decode smaller is not asked (Composer's runs decoded
    at full size), each batch is shrunk on the device, and the estimate's step work says so."""
    config = dataclasses.replace(MILD, loader_decodes=False)
    (resizing,) = build_algorithms({"progressive_resizing": config})
    state = make_state(max_batches=100)
    state.train_resolution, state.batch, state.data = 16, 60, Decoding()
    engine = Engine([resizing])
    engine.run(Event.EPOCH_START, state)
    state.inputs = torch.zeros(1, 3, 16, 16)
    engine.run(Event.AFTER_DATALOADER, state)
    assert state.data.sizes == [] and state.inputs.shape[-1] == 12
    work = resizing.step_work(StepWork(full_resolution=16, resolution=16), 0.6)
    assert (work.resolution, work.loaded_resolution) == (12, 16)
    decoding = build_algorithms({"progressive_resizing": MILD})[0].step_work(StepWork(16, 16), 0.6)
    assert (decoding.resolution, decoding.loaded_resolution) == (12, None)


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
    from trainrun.algorithms.colout import colout, kept

    rows, cols = torch.arange(176.0).view(176, 1), torch.arange(176.0).view(1, 176)
    images = (1000 * rows + cols).expand(4, 3, 176, 176).contiguous()  # each pixel names its row and column
    for batch in (True, False):
        out = colout(images, 0.15, 0.15, batch)
        assert out.shape == (4, 3, int(0.85 * 176), int(0.85 * 176)) == (4, 3, 149, 149)
        kept_rows, kept_cols = out[:, 0, :, 0] // 1000, out[:, 0, 0, :] % 1000
        assert torch.equal(out, 1000 * kept_rows[:, None, :, None] + kept_cols[:, None, None, :].expand_as(out))
        for order in (kept_rows, kept_cols):
            assert bool((order[:, 1:] > order[:, :-1]).all())  # in their order
            same = all(torch.equal(order[0], order[i]) for i in range(4))
            assert same == batch  # batch mode: the same rows and columns for every sample
    assert kept(2, 10, 0.5, torch.device("meta")).device.type == "meta"  # drawn on the images' device
    for batch in (True, False):  # images on a GPU keep their rows and columns there
        assert colout(torch.empty(2, 3, 8, 8, device="meta"), 0.25, 0.5, batch).shape == (2, 3, 6, 4)


def test_the_colout_algorithm_drops_rows_and_columns_at_their_own_rates_per_sample_or_per_batch():
    images = torch.arange(256.0).view(1, 1, 16, 16).expand(8, 2, 16, 16)  # each pixel names its place
    for batch in (False, True):
        (algorithm,) = build_algorithms({"colout": SPECS["colout"].config(p_row=0.25, p_col=0.5, batch=batch)})
        state = make_state()
        state.inputs = images
        algorithm.apply(Event.AFTER_DATALOADER, state)
        assert state.inputs.shape == (8, 2, 12, 8)
        assert all(torch.equal(state.inputs[0], sample) for sample in state.inputs) == batch


def test_stochastic_depth_rates_are_linear_over_the_16_resnet50_blocks():
    from torchvision.models import resnet50

    from trainrun.algorithms.specs.stochastic_depth import StochasticDepthConfig
    from trainrun.algorithms.stochastic_depth import apply_stochastic_depth

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


def test_a_stochastic_block_is_the_resnet_block_at_evaluation_and_rescales_kept_branches_in_training():
    from torchvision.models.resnet import BasicBlock, Bottleneck

    from trainrun.algorithms.stochastic_depth import StochasticBlock

    torch.manual_seed(0)
    downsample = torch.nn.Sequential(torch.nn.Conv2d(8, 16, 1, stride=2), torch.nn.BatchNorm2d(16))
    for block in (BasicBlock(8, 8), Bottleneck(8, 4, stride=2, downsample=downsample)):
        for bn in (m for m in block.modules() if isinstance(m, torch.nn.BatchNorm2d)):
            torch.nn.init.normal_(bn.weight), torch.nn.init.normal_(bn.bias)
        block.eval()
        x = torch.randn(6, 8, 6, 6)
        wrapped = StochasticBlock(block, p=0.5, mode="sample").eval()
        assert torch.equal(wrapped(x), block(x))
    block = BasicBlock(4, 4).eval()  # fixed statistics, so the branch is the same in both passes
    wrapped = StochasticBlock(block, p=0.25, mode="sample").train()
    x = torch.randn(200, 4, 5, 5)
    out = wrapped(x)
    kept = ~torch.isclose(out, torch.relu(x)).flatten(1).all(1)
    expected = torch.relu(x + wrapped.branch(x) / 0.75)  # torchvision rescales kept branches by 1 / (1 - p)
    assert 0.65 < kept.float().mean() < 0.85 and torch.allclose(out[kept], expected[kept], atol=1e-5)


def test_stochastic_depth_block_mode_drops_the_whole_batch_and_uniform_gives_every_block_the_rate():
    from torchvision.models import resnet18
    from torchvision.models.resnet import BasicBlock

    from trainrun.algorithms.specs.stochastic_depth import StochasticDepthConfig
    from trainrun.algorithms.stochastic_depth import StochasticBlock, apply_stochastic_depth, drop_rates

    assert drop_rates(4, 0.2, "uniform") == [0.2] * 4
    per_sample = apply_stochastic_depth(resnet18(), StochasticDepthConfig(mode="sample"))
    assert {b.drop.mode for b in per_sample} == {"row"}  # torchvision's name for per-sample drops
    blocks = apply_stochastic_depth(
        resnet18(), StochasticDepthConfig(drop_rate=0.2, mode="block", distribution="uniform")
    )
    assert [b.drop.p for b in blocks] == [0.2] * 8 and {b.drop.mode for b in blocks} == {"batch"}
    torch.manual_seed(0)
    wrapped = StochasticBlock(BasicBlock(4, 4).eval(), p=0.5, mode="block").train()
    x = torch.randn(16, 4, 5, 5)
    dropped = [torch.isclose(wrapped(x), torch.relu(x)).flatten(1).all(1) for _ in range(40)]
    assert all(d.all() or not d.any() for d in dropped)  # all samples or none
    assert 5 < sum(bool(d.all()) for d in dropped) < 35


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
    data = TorchData(data_config, Datasets(train_set, val_set), 64, 64, seed=0)
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
    state.data = Decoding()
    with pytest.raises(ConfigError, match=r"^algorithm '\w+' needs the torch DataLoader path \(data\.loader=torch\)$"):
        augment.apply(Event.FIT_START, state)


def test_randaugment_applies_depth_operations_at_severity_of_21_levels_and_mixing_takes_its_alpha():
    (augment,) = build_algorithms({"randaugment": RandAugmentConfig(depth=3, severity=7)})
    settings = augment.transform.num_ops, augment.transform.magnitude, augment.transform.num_magnitude_bins
    assert settings == (3, 7, 21)  # severity 10 is half of each operation's maximum
    for name, config in (("mixup", MixUpConfig(alpha=0.3)), ("cutmix", CutMixConfig(alpha=0.7))):
        (mixing,) = build_algorithms({name: config})
        state = make_state()
        state.num_classes, state.inputs, state.targets = 3, torch.rand(4, 3, 8, 8), torch.tensor([0, 1, 2, 0])
        mixing.apply(Event.AFTER_DATALOADER, state)
        assert mixing.transform.alpha == config.alpha and state.targets.shape == (4, 3)


def test_progressive_resizing_scale_ramps_between_delay_and_finetune_and_is_full_without_a_ramp():
    from trainrun.algorithms.progressive_resizing import scale_at

    assert [scale_at(p, 0.5, 0.4, 0.2) for p in (0.0, 0.4, 0.6, 0.8, 0.9, 1.0)] == pytest.approx(
        [0.5, 0.5, 0.75, 1.0, 1.0, 1.0]
    )
    assert scale_at(0.3, 0.5, 0.5, 0.5) == 1.0 and scale_at(0.0, 0.5, 0.6, 0.6) == 1.0  # no ramp: full size
