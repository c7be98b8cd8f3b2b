import ast
import copy
import dataclasses
from pathlib import Path

import pytest
import torch
from torchvision.models import resnet50
from torchvision.ops import SqueezeExcitation

from trainrun.algorithms import build_algorithms, in_method_order, order_markdown
from trainrun.algorithms.blurpool import BlurConv2d, BlurMaxPool2d, apply_blurpool
from trainrun.algorithms.ema import smoothing
from trainrun.algorithms.gradient_clipping import adaptive_clip
from trainrun.algorithms.label_smoothing import smooth
from trainrun.algorithms.specs import METHOD_ORDER, SPECS
from trainrun.algorithms.specs.blurpool import BlurPoolConfig
from trainrun.algorithms.specs.ema import EMAConfig
from trainrun.algorithms.specs.gradient_clipping import GradientClippingConfig
from trainrun.core.engine import Algorithm, Callback, Engine
from trainrun.core.events import Event
from trainrun.core.precision import Precision
from trainrun.core.state import State
from trainrun.core.time import Timeline
from trainrun.python_parsing import parse_python

CONF = Path(__file__).resolve().parent.parent / "conf"


def make_state(model=None, max_batches=100) -> State:
    model = model or torch.nn.Linear(2, 2)
    return State(
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        timeline=Timeline(batches_per_epoch=10, samples_per_batch=4, max_batches=max_batches),
        device=torch.device("cpu"),
        precision=Precision("fp32", "cpu"),
    )


class Recorder(Algorithm):
    events = frozenset(Event)

    def __init__(self, name, log):
        self.name, self.log = name, log

    def apply(self, event, state):
        self.log.append((event, self.name))


def test_engine_follows_the_order_table_and_reverses_closing_events():
    log = []
    engine = Engine(in_method_order([Recorder("sam", log), Recorder("blurpool", log)]))  # blurpool's spec is first
    state = make_state()
    for event in (Event.AFTER_DATALOADER, Event.BEFORE_FORWARD, Event.AFTER_FORWARD, Event.BATCH_END):
        engine.run(event, state)
    assert [name for _, name in log] == ["blurpool", "sam"] * 2 + ["sam", "blurpool"] * 2


def test_the_order_table_names_every_method_once_and_the_docs_show_it(capsys):
    names = list(METHOD_ORDER)
    assert sorted(names) == sorted(SPECS) and len(set(names)) == len(names)
    generated = order_markdown()
    with capsys.disabled():
        print("\nresolved order per event:\n" + generated.split("\n\n")[1])
    docs = (CONF.parent / "docs" / "algorithms.md").read_text()
    assert generated in docs, "docs/algorithms.md is stale: run scripts/algorithm_order.py --write"


def test_callbacks_run_after_algorithms():
    log = []

    class Listener(Callback):
        def run_event(self, event, state):
            log.append((event, "callback"))

    Engine([Recorder("ema", log)], [Listener()]).run(Event.INIT, make_state())
    assert log == [(Event.INIT, "ema"), (Event.INIT, "callback")]


def test_every_method_module_has_one_spec_and_every_spec_names_real_methods():
    package = CONF.parent / "trainrun" / "algorithms"
    modules = {path.stem for path in package.glob("*.py")} - {"__init__", "base"}
    spec_modules = {path.stem for path in (package / "specs").glob("*.py")} - {"__init__"}
    assert modules == set(SPECS) == spec_modules, "a method lacks a spec, or a spec has no method"
    positions = [spec.position for spec in SPECS.values()]
    assert len(set(positions)) == len(positions), "two methods share a position: their order is undecided"
    for name, spec in SPECS.items():
        assert spec.name == name
        assert set(spec.incompatible) <= set(SPECS) - {name}, f"{name} is incompatible with an unknown method"
        fields = {field.name for field in dataclasses.fields(spec.config)}
        assert spec.sequence_limit is None or spec.sequence_limit in fields


def test_trainer_never_names_an_algorithm():
    source = (Path(__file__).resolve().parent.parent / "trainrun/core/trainer.py").read_text()
    names = {node.id for node in ast.walk(parse_python(source)) if isinstance(node, ast.Name)}
    imported = {
        alias.name
        for node in ast.walk(parse_python(source))
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
        if node.module and "algorithms" in node.module
    }
    assert not imported and not {n.lower() for n in names} & set(SPECS)


def test_an_unknown_algorithm_name_is_the_error():
    with pytest.raises(KeyError, match="^'no_such_method'$"):
        build_algorithms({"no_such_method": None})


def test_every_algorithm_has_a_schema_a_module_and_a_yaml():
    yaml_names = {path.stem for path in (CONF / "algorithms").glob("*.yaml")}
    assert yaml_names == set(SPECS)
    configs = {name: spec.config() for name, spec in SPECS.items()}
    built = build_algorithms(configs)
    assert {a.name for a in built} == set(SPECS)
    assert all(method.config is configs[method.name] for method in built)  # every method is Method(config)


def test_blurpool_on_resnet50_replaces_the_strided_convs_and_the_maxpool():
    model = resnet50()
    strided = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Conv2d) and m.stride != (1, 1)]
    assert len(strided) == 7  # the stem, three 3x3 and three 1x1 downsampling convolutions
    assert apply_blurpool(model, BlurPoolConfig()) == 7
    blurred = [n for n, m in model.named_modules() if isinstance(m, BlurConv2d)]
    assert sorted(blurred) == sorted(n for n in strided if n != "conv1")  # the stem has 3 channels
    assert isinstance(model.maxpool, BlurMaxPool2d)
    assert model(torch.randn(1, 3, 64, 64)).shape == (1, 1000)


def test_blur_kernel_is_binomial_and_keeps_constants():
    model = torch.nn.Sequential(torch.nn.Conv2d(16, 16, 3, stride=2, padding=1))
    apply_blurpool(model, BlurPoolConfig())
    blur = model[0].blur
    assert torch.allclose(blur.kernel[0, 0], torch.tensor([[1, 2, 1], [2, 4, 2], [1, 2, 1]]) / 16.0)
    assert torch.allclose(blur(torch.ones(1, 16, 6, 6))[..., 1:-1, 1:-1], torch.ones(1, 16, 4, 4))


def blur_by_formula(x, stride):
    """Each channel convolved with [1, 2, 1]^T [1, 2, 1] / 16, zero padding 1, at ``stride``."""
    taps = torch.tensor([1.0, 2.0, 1.0])
    kernel = (taps[:, None] * taps[None, :] / 16).expand(x.shape[1], 1, 3, 3)
    return torch.nn.functional.conv2d(x, kernel.to(x.dtype), stride=stride, padding=1, groups=x.shape[1])


@pytest.mark.parametrize("blur_first", [True, False])
def test_a_blurred_strided_conv_blurs_before_it_or_after_it_at_stride_one(blur_first):
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(16, 8, 3, stride=(2, 1), padding=1)  # a stride that differs by axis
    original = copy.deepcopy(conv)
    model = torch.nn.Sequential(conv)
    assert apply_blurpool(model, BlurPoolConfig(blur_first=blur_first)) == 1
    x = torch.randn(2, 16, 9, 7)
    with torch.no_grad():
        if blur_first:
            expected = original(blur_by_formula(x, 1))
        else:
            original.stride = (1, 1)
            expected = blur_by_formula(original(x), (2, 1))
        got = model(x)
    assert model[0].blur_first is blur_first
    assert got.shape == expected.shape == (2, 8, 5, 7) and torch.allclose(got, expected, atol=1e-6)
    assert "kernel" not in "".join(model.state_dict())  # checkpoints keep the plain model's keys
    blur = model[0].blur  # an fp32 blur takes a bf16 input (features cast outside autocast)
    assert blur(x.bfloat16()).dtype == torch.bfloat16


def test_a_blurred_maxpool_keeps_its_window_padding_and_dilation_and_blurs_at_its_stride():
    torch.manual_seed(0)
    for pool in (torch.nn.MaxPool2d(3, stride=2, padding=1), torch.nn.MaxPool2d(2, stride=(2, 1), dilation=2)):
        model = torch.nn.Sequential(copy.deepcopy(pool))
        assert apply_blurpool(model, BlurPoolConfig()) == 1
        x = torch.randn(2, 4, 11, 11)
        window = torch.nn.functional.max_pool2d(x, pool.kernel_size, 1, pool.padding, pool.dilation)
        expected = blur_by_formula(window, pool.stride)
        assert model(x).shape == expected.shape and torch.allclose(model(x), expected, atol=1e-6)
    untouched = torch.nn.Sequential(torch.nn.MaxPool2d(2), torch.nn.Conv2d(16, 8, 3, stride=2))
    assert apply_blurpool(untouched, BlurPoolConfig(replace_maxpools=False, replace_convs=False)) == 0


@pytest.mark.parametrize(
    ("name", "finds"),
    [
        ("blurpool", "strided convolutions or max pools to blur"),
        ("squeeze_excite", "convolutions large enough to gate (squeeze_excite.min_channels)"),
        ("ghost_batchnorm", "BatchNorm2d layers"),
        ("stochastic_depth", "residual blocks (torchvision's, or blocks with drop-path layers, timm's)"),
    ],
)
def test_a_surgery_that_finds_nothing_to_change_says_so(name, finds):
    untouched = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    before = copy.deepcopy(untouched)
    state = make_state(untouched)
    (method,) = build_algorithms({name: SPECS[name].config()})
    method.apply(Event.INIT, state)
    assert [n["text"] for n in state.notices if n["level"] == "warning"] == [
        f"{name}: the model has no {finds}; nothing changed"
    ]
    assert str(untouched) == str(before)
    state = make_state(resnet50())
    method.apply(Event.INIT, state)
    assert not state.notices  # a ResNet-50 has what each of them changes


def test_a_method_that_changed_nothing_says_nothing_more():
    (layernorm,) = build_algorithms({"low_precision_layernorm": SPECS["low_precision_layernorm"].config()})
    state = make_state(torch.nn.Linear(2, 2))  # fp32, and no LayerNorm
    layernorm.apply(Event.INIT, state)
    assert [(n["level"], n["text"]) for n in state.notices] == [
        ("warning", "low_precision_layernorm: the model has no LayerNorm; nothing changed")
    ]  # not also that fp32 makes it a no-op


def test_channels_last_survives_every_model_surgery():
    model = resnet50()
    surgery = ("channels_last", "blurpool", "squeeze_excite", "ghost_batchnorm", "stochastic_depth")
    engine = Engine(build_algorithms({name: SPECS[name].config() for name in surgery}))
    state = make_state(model)
    engine.run(Event.INIT, state)
    assert isinstance(model.layer2[0].block.conv2, BlurConv2d)
    assert isinstance(model.layer2[0].block.conv2.conv[1], SqueezeExcitation)
    for module in model.modules():
        if isinstance(module, torch.nn.Conv2d):
            assert module.weight.is_contiguous(memory_format=torch.channels_last)
    assert state.memory_format == torch.channels_last  # the data side normalises batches into it


def test_the_evaluated_model_has_emas_average_in_place_and_logs_no_evaluation():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3))
    (ema,) = build_algorithms({"ema": EMAConfig(half_life="2ba", update_interval="1ba")})
    state, seen = make_state(model), []
    ema.apply(Event.FIT_START, state)
    with torch.no_grad():
        model[0].weight.add_(1.0)
        model(torch.randn(4, 3))
    ema.apply(Event.BATCH_END, state)
    training = {key: value.clone() for key, value in model.state_dict().items()}
    restored = copy.deepcopy(model)  # as trainrun sample builds it: a checkpoint's training weights
    ema.restore_evaluated(restored, ema.state_dict())  # the state a checkpoint holds
    average = restored.state_dict()
    assert average.keys() == training.keys() and not torch.equal(average["0.weight"], training["0.weight"])
    untouched = copy.deepcopy(model)
    ema.restore_evaluated(untouched, {})  # a checkpoint without an average
    assert all(torch.equal(value, training[key]) for key, value in untouched.state_dict().items())
    engine = Engine([ema], [type("Recorder", (Callback,), {"run_event": lambda self, event, s: seen.append(event)})()])
    with engine.evaluated_model(state):
        for key, value in model.state_dict().items():
            assert torch.equal(value, average[key]), key
    for key, value in model.state_dict().items():
        assert torch.equal(value, training[key]), key
    assert seen == []


def test_ema_equals_the_closed_form():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3))
    (ema,) = build_algorithms({"ema": EMAConfig(half_life="10ba", update_interval="2ba")})
    state = make_state(model)
    ema.apply(Event.FIT_START, state)
    s = smoothing(2, 10)
    assert s == pytest.approx(2**-0.2)
    expected = [t.detach().clone().float() for t in model.state_dict().values()]
    matched = []
    for step in range(1, 9):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
            model(torch.randn(4, 3))  # moves the BN running statistics
        state.batch = step
        matched.append(ema.match(Event.BATCH_END, state))
        if matched[-1]:
            ema.apply(Event.BATCH_END, state)
        if step in (2, 4, 6, 8):  # every 2 steps, written out here rather than taken from ema.match
            current = [t.float() for t in model.state_dict().values()]
            expected = [s * e + (1 - s) * c for e, c in zip(expected, current)]
    assert matched == [False, True] * 4
    averaged = list(ema.average.module.state_dict().values())
    for got, want, key in zip(averaged, expected, model.state_dict()):
        if "num_batches" not in key:
            assert torch.allclose(got.float(), want, atol=1e-6), key
    training = [t.clone() for t in model.state_dict().values()]
    ema.apply(Event.EVAL_START, state)
    assert torch.allclose(model[0].weight, ema.average.module[0].weight)
    ema.apply(Event.EVAL_END, state)
    assert all(torch.equal(a, b) for a, b in zip(training, model.state_dict().values()))


def test_ema_saves_its_average_and_a_resumed_run_continues_it():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3))
    (ema,) = build_algorithms({"ema": EMAConfig(half_life="4ba", update_interval="1ba")})
    assert ema.state_dict() == {}  # nothing averaged before the run starts
    state = make_state(model)
    ema.apply(Event.FIT_START, state)
    for step in (1, 2):
        with torch.no_grad():
            model[0].weight.add_(1.0)
        state.batch = step
        ema.apply(Event.BATCH_END, state)
    saved = ema.state_dict()
    (resumed,) = build_algorithms({"ema": EMAConfig(half_life="4ba", update_interval="1ba")})
    resumed.apply(Event.FIT_START, make_state(copy.deepcopy(model)))
    resumed.load_state_dict(saved)
    for a, b in zip(resumed.average.state_dict().values(), ema.average.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    before = [t.clone() for t in resumed.average.state_dict().values()]
    resumed.load_state_dict({})  # a checkpoint of a run without EMA: the average stays
    assert all(torch.equal(a, b) for a, b in zip(before, resumed.average.state_dict().values()))


def test_an_ema_half_life_shorter_than_a_step_counts_as_one_step():
    model = torch.nn.Linear(1, 1, bias=False)
    torch.nn.init.zeros_(model.weight)
    (ema,) = build_algorithms({"ema": EMAConfig(half_life="0.001dur", update_interval="1ba")})
    state = make_state(model, max_batches=100)  # 0.001 of 100 steps: 0 steps
    ema.apply(Event.FIT_START, state)
    with torch.no_grad():
        model.weight.fill_(1.0)
    state.batch = 1
    ema.apply(Event.BATCH_END, state)
    assert float(ema.average.module.weight) == pytest.approx(0.5)  # s = 2^(-1/1)


def test_label_smoothing_targets():
    targets = smooth(torch.tensor([2, 0]), 4, 0.1, torch.float32)
    assert torch.allclose(targets[0], torch.tensor([0.025, 0.025, 0.925, 0.025]))
    assert torch.allclose(targets.sum(1), torch.ones(2))
    assert smooth(torch.tensor([1]), 4, 0.1, torch.float64).dtype == torch.float64


def test_label_smoothing_gives_the_loss_float32_targets_and_restores_the_originals_after_it():
    (smoothing,) = build_algorithms({"label_smoothing": SPECS["label_smoothing"].config(0.2)})
    state = make_state()
    mixed = torch.tensor([[0.5, 0.5, 0.0, 0.0]], dtype=torch.bfloat16)  # dense rows (MixUp's) in bf16
    state.outputs, state.targets = torch.randn(1, 4), mixed
    smoothing.apply(Event.BEFORE_LOSS, state)
    assert state.targets.dtype == torch.float32
    assert torch.allclose(state.targets, torch.tensor([[0.45, 0.45, 0.05, 0.05]]))
    smoothing.apply(Event.AFTER_LOSS, state)
    assert state.targets is mixed


def test_adaptive_clipping_bounds_each_unit():
    weight = torch.nn.Parameter(torch.tensor([[3.0, 4.0], [0.3, 0.4]]))
    weight.grad = torch.tensor([[30.0, 40.0], [0.003, 0.004]])
    adaptive_clip([weight], threshold=0.1)
    assert weight.grad[0].norm() == pytest.approx(0.5)  # clipped to 0.1 * ||w|| = 0.5
    assert torch.allclose(weight.grad[1], torch.tensor([0.003, 0.004]))  # under the bound, untouched


def test_adaptive_clipping_treats_a_vector_as_one_unit():
    """Biases and gains (1-D) are clipped by their whole norm, as NFNets' unit-wise norm does:
    g' = g · λ‖w‖ / ‖g‖ = [6, 8] · 0.1·5 / 10."""
    bias = torch.nn.Parameter(torch.tensor([3.0, 4.0]))
    bias.grad = torch.tensor([6.0, 8.0])
    adaptive_clip([bias], threshold=0.1)
    assert bias.grad.shape == (2,) and torch.allclose(bias.grad, torch.tensor([0.3, 0.4]))


@pytest.mark.parametrize("kind", ["norm", "value", "adaptive"])
def test_gradient_clipping_of_each_type_follows_its_formula(kind):
    """weight [[3, 4]] with gradient [[30, 40]], bias [0.5] with gradient [1], threshold 0.5;
    a parameter without a gradient is skipped."""
    from types import SimpleNamespace

    model = torch.nn.Linear(2, 1)
    frozen = torch.nn.Parameter(torch.ones(1))
    model.register_parameter("frozen", frozen)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[3.0, 4.0]]))
        model.bias.copy_(torch.tensor([0.5]))
    model.weight.grad, model.bias.grad = torch.tensor([[30.0, 40.0]]), torch.tensor([1.0])
    (clipping,) = build_algorithms({"gradient_clipping": GradientClippingConfig(kind, 0.5)})
    clipping.apply(Event.BEFORE_OPTIMIZER_STEP, SimpleNamespace(model=model))
    total = (30.0**2 + 40**2 + 1) ** 0.5
    expected = {
        "norm": ([[30 * 0.5 / total, 40 * 0.5 / total]], [0.5 / total]),  # one global norm of 0.5
        "value": ([[0.5, 0.5]], [0.5]),  # each element into [-0.5, 0.5]
        "adaptive": ([[30 * 2.5 / 50, 40 * 2.5 / 50]], [0.25]),  # row: 0.5·‖w‖ = 2.5; bias: 0.5·0.5
    }[kind]
    assert torch.allclose(model.weight.grad, torch.tensor(expected[0]), atol=1e-6)
    assert torch.allclose(model.bias.grad, torch.tensor(expected[1]), atol=1e-6)
    assert frozen.grad is None
