import math

import pytest
import torch
import torch.nn.functional as F

from trainrun.models.build import build_model
from trainrun.schema import ModelConfig, SmallResNetConfig
from trainrun.tasks.losses import binary_cross_entropy, soft_cross_entropy


@pytest.mark.parametrize("name", ["resnet18", "resnet34", "resnet50", "resnet101"])
def test_torchvision_resnets_build_with_the_head_size(name):
    model = build_model(ModelConfig(name=name, num_classes=7))
    assert model.fc.out_features == 7


@pytest.mark.parametrize("size", [8, 16, 28, 32])
def test_small_resnet_takes_8_to_32_px(size):
    model = build_model(
        ModelConfig(name="resnet_small", num_classes=10, resnet_small=SmallResNetConfig(width=8, blocks=[1, 1]))
    )
    assert model(torch.zeros(2, 3, size, size)).shape == (2, 10)


def test_initializers():
    torch.manual_seed(0)
    model = build_model(ModelConfig(name="resnet50", num_classes=1000))
    assert torch.allclose(model.fc.bias, torch.full((1000,), -math.log(1000)))
    bn_weights = torch.cat([m.weight.detach() for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)])
    assert bn_weights.min() >= 0 and bn_weights.max() <= 1 and 0.45 < bn_weights.mean() < 0.55
    conv = model.layer3[0].conv2  # 256 -> 256, 3x3: He-normal std = sqrt(2 / fan_in)
    assert conv.weight.std().item() == pytest.approx(math.sqrt(2 / (256 * 9)), rel=0.05)


def test_initial_sigmoid_outputs_are_near_one_over_classes():
    model = build_model(ModelConfig(name="resnet_small", num_classes=10, resnet_small=SmallResNetConfig(width=8)))
    model.fc.weight.data.zero_()
    assert torch.allclose(
        torch.sigmoid(model(torch.randn(2, 3, 8, 8))), torch.full((2, 10), 1 / 11)
    )  # sigmoid(-ln C) = 1 / (1 + C)


def test_soft_cross_entropy_matches_hard_labels_and_is_sum_over_batch():
    logits, labels = torch.randn(6, 5), torch.tensor([0, 1, 2, 3, 4, 0])
    one_hot = F.one_hot(labels, 5).float()
    assert soft_cross_entropy(logits, labels) == pytest.approx(F.cross_entropy(logits, labels).item())
    assert soft_cross_entropy(logits, one_hot) == pytest.approx(F.cross_entropy(logits, labels).item())
    soft = torch.full((6, 5), 0.2)
    expected = -(soft * F.log_softmax(logits, 1)).sum() / 6
    assert soft_cross_entropy(logits, soft) == pytest.approx(expected.item())


def test_bce_sums_over_classes_and_divides_by_batch():
    logits, labels = torch.randn(4, 3), torch.tensor([0, 2, 1, 1])
    one_hot = F.one_hot(labels, 3).float()
    by_hand = -(one_hot * F.logsigmoid(logits) + (1 - one_hot) * F.logsigmoid(-logits)).sum() / 4
    assert binary_cross_entropy(logits, labels) == pytest.approx(by_hand.item(), rel=1e-5)


def test_an_initializer_that_finds_no_layer_is_refused_naming_it():
    from trainrun.errors import ConfigError
    from trainrun.models.initializers import initialize

    with pytest.raises(ConfigError, match=r"^bad value for 'model.initializers': 'bn_uniform' finds no layer"):
        initialize(torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Linear(4, 2)), ["bn_uniform"], 2)


@pytest.mark.parametrize(
    "run",
    [
        {
            "task": {"name": "causal_lm"},
            "data": {"name": "token_stream", "text": {"corpus": "stdlib_docs"}},
            "model": {"name": "gpt"},
        },
        {
            "task": {"name": "masked_lm"},
            "data": {"name": "text", "text": {"corpus": "stdlib_docs"}},
            "model": {"name": "bert"},
        },
        {
            "task": {"name": "segmentation"},
            "data": {"name": "synthetic_brats", "num_classes": 4, "segmentation": {"patch_size": [64, 64]}},
            "model": {"name": "unet", "num_classes": 4},
        },
    ],
)
def test_initializers_are_refused_for_a_model_that_initialises_itself(run):
    from omegaconf import OmegaConf

    from trainrun.errors import ConfigError
    from trainrun.validation import validate

    validate(OmegaConf.create(run), files=False)  # the default list: nothing said
    with pytest.raises(ConfigError, match=r"^bad value for 'model.initializers': \['kaiming_normal'\] \(model="):
        validate(OmegaConf.create({**run, "model": {**run["model"], "initializers": ["kaiming_normal"]}}), files=False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_chunked_cross_entropy_gives_the_plain_ones_loss_and_gradients(dtype):
    from trainrun.tasks.losses import summed_cross_entropy

    torch.manual_seed(0)
    logits = (torch.randn(37, 301) * 3).to(dtype).requires_grad_()
    targets = torch.randint(0, 301, (37,))
    plain = F.cross_entropy(logits.float(), targets, reduction="sum")
    (expected,) = torch.autograd.grad(plain, logits)
    for chunk in (301 * 5, 301 * 37, 10_000_000):  # 8 chunks (the last of 2 positions), one, one
        chunked = summed_cross_entropy(logits, targets, chunk_elements=chunk)
        (gradient,) = torch.autograd.grad(chunked, logits)
        assert chunked.dtype == torch.float32 and gradient.dtype == dtype
        torch.testing.assert_close(chunked, plain, rtol=1e-6, atol=1e-4)
        torch.testing.assert_close(gradient, expected, rtol=0 if dtype == torch.float32 else 1e-2, atol=1e-6)
    with torch.no_grad():
        torch.testing.assert_close(summed_cross_entropy(logits, targets, chunk_elements=301 * 5), plain)
