import math

import pytest
import torch

from trainrun.core.time import Time, Timeline
from trainrun.optim.optimizers import DecoupledSGDW, build_optimizer
from trainrun.optim.schedules import build_scheduler, multiplier, schedule_function
from trainrun.schema import OptimizerConfig, SchedulerConfig


def test_warmup_is_linear_from_zero():
    values = [multiplier(b, shape="cosine", warmup=10, total=100) for b in (0, 5, 10)]
    assert values == [0.0, 0.5, 1.0]


@pytest.mark.parametrize(
    ("shape", "batch", "expected"),
    [
        ("cosine", 55, 0.1 + 0.9 * 0.5),  # halfway through the decay
        ("cosine", 100, 0.1),
        ("linear", 55, 1 + (0.1 - 1) * 0.5),
        ("linear", 100, 0.1),
        ("constant", 80, 1.0),
    ],
)
def test_decay_shapes_with_alpha_f(shape, batch, expected):
    assert multiplier(batch, shape=shape, warmup=10, total=100, alpha_f=0.1) == pytest.approx(expected)


def test_step_schedule():
    assert multiplier(29, shape="step", warmup=0, total=100, step_size=30, gamma=0.1) == 1.0
    assert multiplier(60, shape="step", warmup=0, total=100, step_size=30, gamma=0.1) == pytest.approx(0.01)


def test_multistep_schedule_multiplies_by_gamma_at_each_milestone_reached_after_warmup():
    config = SchedulerConfig(name="multistep", t_warmup="4ba", gamma=0.9, milestones=["10ba", "12ba", "2ep"])
    timeline = Timeline.for_run(Time.parse("3ep"), 10, 8)  # 10 batches an epoch
    lrs = _lrs(config, 1.0, 30, timeline)
    assert lrs[:5] == pytest.approx([0.0, 0.25, 0.5, 0.75, 1.0])
    assert lrs[9:13] == pytest.approx([1.0, 0.9, 0.9, 0.81])
    assert lrs[19:21] == pytest.approx([0.81, 0.729])
    stretched = Timeline.for_run(Time.parse("3ep"), 10, 8, stretch=2.0)
    assert _lrs(config, 2.0, 60, stretched)[19:22] == pytest.approx([1.0, 0.9, 0.9])  # milestones stretched too


def _lrs(config: SchedulerConfig, ratio: float, steps: int, timeline: Timeline) -> list[float]:
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=1.0)
    assert timeline.stretch == ratio
    scheduler = build_scheduler(optimizer, config, timeline)
    lrs = []
    for _ in range(steps):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return lrs


def test_schedule_applied_every_step_and_stretched_by_the_ratio():
    config = SchedulerConfig(name="cosine", t_warmup="2ep", alpha_f=0.0)
    base = Timeline.for_run(Time.parse("10ep"), 10, 8)
    stretched = Timeline.for_run(Time.parse("10ep"), 10, 8, stretch=2.0)
    plain = _lrs(config, 1.0, base.max_batches, base)
    double = _lrs(config, 2.0, stretched.max_batches, stretched)
    assert plain[10] == pytest.approx(0.5)  # every step, mid-warmup
    assert double[20] == pytest.approx(0.5)  # warmup stretched with the run
    for step in range(0, 100, 7):
        assert double[2 * step] == pytest.approx(plain[step], abs=1e-9)


def test_weight_decay_follows_the_schedule_not_the_peak_lr():
    for peak in (0.1, 2.048):
        weight = torch.nn.Parameter(torch.ones(4))
        optimizer = DecoupledSGDW([weight], lr=peak, weight_decay=0.01, momentum=0.9)
        weight.grad = torch.zeros(4)
        optimizer.step()
        assert weight.detach() == pytest.approx(torch.full((4,), 0.99))
        optimizer.param_groups[0]["lr"] = peak / 2  # the schedule halves the LR
        optimizer.step()
        assert weight.detach() == pytest.approx(torch.full((4,), 0.99 * 0.995))


def test_sgdw_matches_sgd_without_decay():
    torch.manual_seed(0)
    a, b = torch.nn.Parameter(torch.randn(5)), None
    b = torch.nn.Parameter(a.detach().clone())
    sgdw = DecoupledSGDW([a], lr=0.1, momentum=0.9, dampening=0.3)
    sgd = torch.optim.SGD([b], lr=0.1, momentum=0.9, dampening=0.3)
    for _ in range(3):
        grad = torch.randn(5)
        a.grad, b.grad = grad.clone(), grad.clone()
        sgdw.step()
        sgd.step()
        assert torch.allclose(a, b)  # the first step too: its momentum is the gradient, undamped
    assert sgdw.param_groups[0]["dampening"] == 0.3


def test_norm_and_bias_can_be_exempt_from_decay():
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3))
    optimizer = build_optimizer(model, OptimizerConfig(weight_decay=0.1, exclude_norm_and_bias=True), 256)
    decayed, exempt = optimizer.param_groups
    assert [p.shape for p in decayed["params"]] == [torch.Size([3, 3])]
    assert len(exempt["params"]) == 3 and exempt["decoupled_weight_decay"] == 0.0
    adamw = build_optimizer(model, OptimizerConfig(name="adamw", lr=1e-3), 256)
    assert isinstance(adamw, torch.optim.AdamW)
    assert math.isclose(adamw.param_groups[0]["lr"], 1e-3)
    tied = torch.nn.Sequential(torch.nn.Embedding(5, 3), torch.nn.Linear(3, 5))
    tied[1].weight = tied[0].weight  # a language model's output layer shares the embedding
    decayed, exempt = build_optimizer(tied, OptimizerConfig(exclude_norm_and_bias=True), 256).param_groups
    assert len(decayed["params"]) == 1 and len(exempt["params"]) == 1  # the shared weight once


def test_linear_lr_scaling_follows_the_global_batch():
    model = torch.nn.Linear(2, 2)
    config = OptimizerConfig(lr=2.048, lr_scaling="linear", reference_batch_size=2048)
    assert build_optimizer(model, config, 256).param_groups[0]["lr"] == pytest.approx(0.256)
    assert (
        build_optimizer(model, OptimizerConfig(lr=2.048, reference_batch_size=2048), 256).param_groups[0]["lr"] == 2.048
    )


def test_every_optimizer_setting_reaches_the_optimizer():
    model = torch.nn.Linear(3, 2)
    settings = {"lr": 0.5, "weight_decay": 1e-3, "momentum": 0.8}
    sgdw = build_optimizer(model, OptimizerConfig(name="sgdw", nesterov=True, **settings), 256)
    (group,) = sgdw.param_groups
    assert type(sgdw) is DecoupledSGDW and sgdw.defaults["fused"] is True  # fp16 steps without a host sync
    assert group["lr"] == 0.5 and group["momentum"] == 0.8 and group["nesterov"] is True
    assert group["decoupled_weight_decay"] == 1e-3 and group["weight_decay"] == 0.0 and group["dampening"] == 0.0
    damped = build_optimizer(model, OptimizerConfig(name="sgdw", dampening=0.1, **settings), 256).param_groups[0]
    assert damped["dampening"] == 0.1 and damped["nesterov"] is False
    adam_like = {"lr": 3e-3, "betas": [0.8, 0.98], "eps": 1e-7, "weight_decay": 0.05}  # none of them a default
    adamw = build_optimizer(model, OptimizerConfig(name="adamw", **adam_like), 256)
    (group,) = adamw.param_groups
    assert type(adamw) is torch.optim.AdamW and adamw.defaults["fused"] is True
    assert (group["lr"], group["betas"], group["eps"], group["weight_decay"]) == (3e-3, (0.8, 0.98), 1e-7, 0.05)
    lamb = build_optimizer(model, OptimizerConfig(name="lamb", max_grad_norm=1.5, **adam_like), 256)
    (group,) = lamb.param_groups
    assert type(lamb).__name__ == "Lamb" and type(lamb).__module__.startswith("timm.")
    assert (group["lr"], group["betas"], group["eps"], group["weight_decay"]) == (3e-3, (0.8, 0.98), 1e-7, 0.05)
    assert group["max_grad_norm"] == 1.5
    radam = build_optimizer(model, OptimizerConfig(name="radam", **adam_like), 256)
    (group,) = radam.param_groups
    assert type(radam) is torch.optim.RAdam and radam.defaults["foreach"] is True
    assert (group["lr"], group["betas"], group["eps"], group["weight_decay"]) == (3e-3, (0.8, 0.98), 1e-7, 0.05)
    assert group["decoupled_weight_decay"] is False  # L2 decay, as Composer's UNet recipe ran RAdam
    nnunet = OptimizerConfig(name="sgd", lr=0.01, momentum=0.99, nesterov=True, weight_decay=3e-5)
    sgd = build_optimizer(model, nnunet, 2)
    (group,) = sgd.param_groups
    assert type(sgd) is torch.optim.SGD and sgd.defaults["foreach"] is True and not sgd.defaults["fused"]
    assert (group["lr"], group["momentum"], group["nesterov"], group["weight_decay"]) == (0.01, 0.99, True, 3e-5)


def test_a_step_the_gradient_scaler_skips_does_not_decay_the_weights():
    """GradScaler hands fused optimizers ``found_inf`` on the device; 1 means skip, decay included."""
    weight = torch.nn.Parameter(torch.ones(3))
    optimizer = DecoupledSGDW([weight], lr=0.1, weight_decay=0.1)
    weight.grad = torch.zeros(3)
    optimizer.found_inf = torch.tensor(1.0)
    optimizer.step()
    assert torch.equal(weight.detach(), torch.ones(3))
    optimizer.found_inf = torch.tensor(0.0)
    optimizer.step()
    assert torch.allclose(weight.detach(), torch.full((3,), 0.9))
    frozen = torch.nn.Parameter(torch.ones(3))  # no gradient (a frozen layer): no decay either
    optimizer = DecoupledSGDW([{"params": [weight]}, {"params": [frozen]}], lr=0.1, weight_decay=0.1)
    optimizer.step()
    assert torch.equal(frozen.detach(), torch.ones(3))


@pytest.mark.parametrize("nesterov", [False, True])
def test_a_skipped_first_step_leaves_the_momentum_at_zero_and_the_next_step_as_torchs(nesterov):
    """fp16 runs begin with overflowing steps: the first step's skip must not leave torch's fused
    kernel an uninitialised momentum buffer (it did: weights of 1e25 one step later)."""
    torch.manual_seed(0)
    weight = torch.nn.Parameter(torch.randn(1000))
    reference = torch.nn.Parameter(weight.detach().clone())
    scaler = torch.amp.GradScaler("cpu")
    sgdw = DecoupledSGDW([weight], lr=0.1, momentum=0.9, nesterov=nesterov)
    sgd = torch.optim.SGD([reference], lr=0.1, momentum=0.9, nesterov=nesterov)
    torch.full((1000,), float("nan"))  # freed memory that an empty_like buffer may take
    scaler.scale((weight * float("inf")).sum()).backward()  # the first step overflows
    scaler.step(sgdw)
    scaler.update()
    assert torch.equal(sgdw.state[weight]["momentum_buffer"], torch.zeros(1000))
    for _ in range(3):
        grad = torch.randn(1000)
        sgdw.zero_grad()
        scaler.scale((weight * grad).sum()).backward()
        scaler.step(sgdw)
        scaler.update()
        reference.grad = grad
        sgd.step()
        assert torch.allclose(weight, reference)


def test_scale_warmup_off_keeps_the_warmup_as_written():
    timeline = Timeline(batches_per_epoch=10, samples_per_batch=4, max_batches=360, stretch=0.4)  # 90ep x 0.4
    stretched = schedule_function(SchedulerConfig(t_warmup="8ep"), timeline)
    fixed = schedule_function(SchedulerConfig(t_warmup="8ep", scale_warmup=False), timeline)
    assert stretched(16) == 0.5 and stretched(32) == 1.0  # warmup 0.4 x 80 = 32 steps
    assert fixed(40) == 0.5 and fixed(80) == 1.0  # warmup stays 80 steps


def test_multiplier_edges_defaults_and_errors():
    """Edges of the schedule formula: the step after warmup of a step schedule already decayed,
    a one-step decay, steps past the end held at alpha_f, a warmup as long as the whole run, the
    defaults (cosine to 0, x0.1 every step), and an unknown shape named."""
    assert multiplier(10, shape="step", warmup=10, total=100, step_size=5, gamma=0.5) == 0.5**2
    assert multiplier(11, shape="linear", warmup=10, total=11, alpha_f=0.0) == 0.0  # one decay step: at its end
    assert multiplier(150, shape="linear", warmup=0, total=100, alpha_f=0.1) == pytest.approx(0.1)  # held
    assert multiplier(100, shape="cosine", warmup=0, total=100) == pytest.approx(0.0)
    assert multiplier(3, shape="step", warmup=0, total=10) == pytest.approx(0.1**3)
    whole_run = {"warmup": 10, "total": 10, "alpha_f": 0.2, "fraction": lambda batch: min(batch / 10, 1.0)}
    assert multiplier(12, shape="cosine", **whole_run) == pytest.approx(0.2)
    with pytest.raises(ValueError, match="^unknown schedule 'wavy'$"):
        multiplier(5, shape="wavy", warmup=0, total=10)


def test_schedule_function_passes_every_setting_and_follows_a_replanned_timeline():
    timeline = Timeline.for_run(Time.parse("100ba"), 10, 8)
    step = schedule_function(SchedulerConfig(name="step", t_warmup="0ba", step_size="2ep", gamma=0.5), timeline)
    assert [step(b) for b in (19, 20, 40)] == [1.0, 0.5, 0.25]
    linear = schedule_function(SchedulerConfig(name="linear", t_warmup="0ba", alpha_f=0.1), timeline)
    assert linear(100) == pytest.approx(0.1) and linear(50) == pytest.approx(0.55)
    timeline.replan(50, 150)  # half-way, 150 steps found left: 125 is 0.5 + 0.5 · 75/150 of the run
    assert linear(50) == pytest.approx(0.55) and linear(125) == pytest.approx(1 - 0.9 * 0.75)
    assert Timeline(10, 8, max_batches=100, stretch=2.0).stretched_batches("0.5dur") == 50  # dur: not stretched


def test_the_fields_only_some_optimizers_read_are_the_ones_each_builder_reads():
    """validation.OPTIMIZER_READS (what a run is refused for setting) against the builders: each
    optimizer, built while every read of its config is recorded, reads exactly its listed fields of
    those only some read. A setting its optimizer does not read is refused from the command line."""
    from conftest import run_here
    from test_config_wiring import recorded_reads

    from trainrun.schema import MuonConfig
    from trainrun.validation import OPTIMIZER_READS

    some = {field for fields in OPTIMIZER_READS.values() for field in fields}
    model = torch.nn.Sequential(torch.nn.Embedding(8, 4), torch.nn.Linear(4, 4), torch.nn.Linear(4, 8))
    for name, fields in OPTIMIZER_READS.items():
        with recorded_reads({OptimizerConfig, MuonConfig}) as read:
            build_optimizer(model, OptimizerConfig(name=name), 64)
        assert {field for cls, field in read if cls is OptimizerConfig} & some == set(fields), name
    result = run_here("optimizer=sgd", "optimizer.betas=[0.8,0.9]", "max_duration=1ba")
    assert result.returncode == 2 and result.stderr.splitlines() == [
        "trainrun: error: bad key 'optimizer.betas': optimizer=sgd does not read it "
        "(read by optimizer=adamw, lamb, radam, muon)"
    ]
