"""Muon with Adam (optimizer=muon) and the warmup-stable-decay schedule, checked by numbers."""

import copy as copy_module
from unittest import mock

import pytest
import torch
from conftest import run_here

from trainrun.core.time import Time, Timeline
from trainrun.errors import ConfigError
from trainrun.models.gpt import GPT
from trainrun.optim.muon import parameter_roles
from trainrun.optim.optimizers import build_optimizer
from trainrun.optim.schedules import multiplier, schedule_function
from trainrun.schema import GPTConfig, MuonConfig, OptimizerConfig, SchedulerConfig

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)  # the speedrun's quintic Newton-Schulz iteration


def gpt(tie_head: bool = False) -> GPT:
    torch.manual_seed(0)
    config = GPTConfig(layers=2, heads=2, width=16, max_seq_len=8, tie_head=tie_head, bias=True)
    return GPT(config, vocab_size=40)


def muon_config(**muon) -> OptimizerConfig:
    return OptimizerConfig(
        name="muon", lr=0.05, momentum=0.95, nesterov=True, weight_decay=0.0, betas=[0.8, 0.95], eps=1e-10,
        muon=MuonConfig(**muon),
    )  # fmt: skip


def reference_muon_update(grad: torch.Tensor, momentum: float) -> torch.Tensor:
    """Keller Jordan's Muon on a first step (zero buffer), written from its published definition,
    in float64 (Muon iterates in bfloat16: the two differ by its rounding)."""
    buffer = (1 - momentum) * grad  # buf.lerp_(g, 1 - β) from zero
    update = grad + momentum * (buffer - grad)  # Nesterov: g.lerp_(buf, β)
    x = update.double()
    transposed = x.shape[0] > x.shape[1]
    x = x.T if transposed else x
    x = x / (x.norm() + 1e-7)
    a, b, c = NS_COEFFICIENTS
    for _ in range(5):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    x = x.T if transposed else x
    return x.float() * max(1.0, grad.shape[0] / grad.shape[1]) ** 0.5


def test_the_split_sends_hidden_matrices_to_muon_and_the_rest_to_adam_by_role():
    roles = {role: [name for name, _ in params] for role, params in parameter_roles(gpt(), ["head"]).items()}
    assert roles["embeddings"] == ["embed.weight", "positions.weight"]
    assert roles["head"] == ["head.weight"]
    assert sorted(roles["matrices"]) == sorted(
        f"blocks.{i}.{name}.weight"
        for i in range(2)
        for name in ("attention.qkv", "attention.proj", "mlp.up", "mlp.proj")
    )
    assert "blocks.0.attention_norm.weight" in roles["scalars"] and "blocks.1.mlp.up.bias" in roles["scalars"]
    assert "final_norm.bias" in roles["scalars"] and len(roles["scalars"]) == 2 * (4 + 4) + 2
    tied = parameter_roles(gpt(tie_head=True), ["head"])
    assert [name for name, _ in tied["embeddings"]] == ["embed.weight", "positions.weight"] and not tied["head"]
    total = sum(len(params) for params in tied.values())
    assert total == len(list(gpt(tie_head=True).parameters()))  # each parameter once, the tied one too


def test_one_step_is_keller_jordans_muon_on_matrices_and_adam_at_each_roles_rate_elsewhere():
    model = gpt()
    optimizer = build_optimizer(model, muon_config(momentum_warmup="0ba"), 8)
    rates = {group["role"]: group["lr"] for group in optimizer.param_groups}
    assert rates == {"matrices": 0.05, "embeddings": 0.6, "head": 0.008, "scalars": 0.04}
    before = {name: param.detach().clone() for name, param in model.named_parameters()}
    model(torch.randint(0, 40, (2, 8))).square().mean().backward()
    grads = {name: param.grad.clone() for name, param in model.named_parameters()}
    optimizer.step()
    qkv = "blocks.0.attention.qkv.weight"  # 48 x 16: q, k and v, three 16 x 16 matrices, each orthogonalised alone
    update = (before[qkv] - model.get_parameter(qkv).detach()) / 0.05
    for part, grad in zip(update.view(3, 16, 16), grads[qkv].view(3, 16, 16), strict=True):
        reference = reference_muon_update(grad, 0.95)  # square: no scale
        assert (part - reference).norm() / reference.norm() < 0.2  # bfloat16's rounding (0.17: a square matrix's)
        singular = torch.linalg.svdvals(part)  # orthogonalised: ten directions within (0.6, 1.2)
        assert singular.max() < 1.2 and singular[9] > 0.6
        spread = torch.linalg.svdvals(grad)
        assert spread[0] / spread[9] > 10  # where the gradient's were 10 times apart or more
    # Adam's first step moves each element by lr · sign(g) (bias-corrected m / sqrt(v)), no decay
    for name, rate in (("head.weight", 0.008), ("embed.weight", 0.6), ("final_norm.weight", 0.04)):
        moved = before[name] - model.get_parameter(name).detach()
        torch.testing.assert_close(moved, rate * grads[name].sign(), rtol=1e-3, atol=1e-5)


def test_muons_momentum_warms_linearly_then_holds_and_a_restored_optimizer_continues_it():
    timeline = Timeline.for_run(Time.parse("1000ba"), 100, 8)
    model = gpt()
    optimizer = build_optimizer(model, muon_config(momentum_start=0.85, momentum_warmup="300ba"), 8, timeline)
    assert [optimizer.momentum_at(step) for step in (0, 150, 299, 300, 900)] == pytest.approx(
        [0.85, 0.90, 0.85 + 0.1 * 299 / 300, 0.95, 0.95]
    )
    assert optimizer.muon.param_groups[0]["momentum"] == 0.85  # the groups hold the next step's momentum
    for _ in range(3):
        model(torch.randint(0, 40, (2, 8))).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    assert optimizer.muon.param_groups[0]["momentum"] == pytest.approx(0.85 + 0.1 * 3 / 300)  # for the fourth step
    copy = gpt()
    copy.load_state_dict(model.state_dict())
    restored = build_optimizer(copy, muon_config(momentum_start=0.85, momentum_warmup="300ba"), 8, timeline)
    restored.load_state_dict(copy_module.deepcopy(optimizer.state_dict()))  # as from a file: no shared tensors
    assert restored.steps == 3 and [g["lr"] for g in restored.param_groups] == [g["lr"] for g in optimizer.param_groups]
    batch = torch.randint(0, 40, (2, 8))
    for net, opt in ((model, optimizer), (copy, restored)):
        net(batch).sum().backward()
        opt.step()
    for (name, mine), theirs in zip(model.named_parameters(), copy.parameters(), strict=True):
        torch.testing.assert_close(mine, theirs, rtol=0, atol=0, msg=name)


def test_a_schedule_scales_every_group_and_linear_scaling_every_rate():
    model = gpt()
    optimizer = build_optimizer(model, muon_config(), 512)
    scaled = build_optimizer(model, OptimizerConfig(**{**vars(muon_config()), "lr_scaling": "linear"}), 512)
    assert [g["lr"] for g in scaled.param_groups] == pytest.approx([2 * g["lr"] for g in optimizer.param_groups])
    timeline = Timeline.for_run(Time.parse("100ba"), 10, 8)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, schedule_function(SchedulerConfig(name="wsd", t_warmup="0ba"), timeline)
    )
    for _ in range(80):
        optimizer.step()
        scheduler.step()
    assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([0.05 * 0.5, 0.6 * 0.5, 0.008 * 0.5, 0.04 * 0.5])
    assert optimizer.muon.param_groups[0]["lr"] == pytest.approx(0.025)  # the inner optimizers see the schedule


def test_muon_refuses_a_model_with_convolutions():
    with pytest.raises(ConfigError, match=r"'muon' takes 2-D matrices, and 0.weight is 4-D"):
        parameter_roles(torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3)), ["head"])


@pytest.mark.slow
def test_muon_for_an_image_model_is_refused_before_any_process_starts():
    result = run_here("optimizer=muon", "max_duration=1ba")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "trainrun: error: bad value for 'optimizer.name': 'muon' takes 2-D matrices; model 'resnet_small' has "
        "convolutions (use it with model=bert or model=gpt or model=llama)"
    ]


@pytest.mark.parametrize("step", [0, 30, 59, 60, 61, 75, 80, 99, 100])
def test_warmup_stable_decay_is_the_speedruns_schedule(step):
    """lr = w + (1 - w) · 0.1 with w = min((1 - step / steps) / 0.4, 1): the speedrun's own formula."""
    w = min((1 - step / 100) / 0.4, 1.0)
    expected = w * 1.0 + (1 - w) * 0.1
    assert multiplier(step, shape="wsd", warmup=0, total=100, alpha_f=0.1, cooldown=0.4) == pytest.approx(expected)


def test_warmup_stable_decay_warms_first_and_decays_over_the_share_after_warmup():
    values = [multiplier(b, shape="wsd", warmup=10, total=110, alpha_f=0.0, cooldown=0.5) for b in (5, 10, 60, 85, 110)]
    assert values == pytest.approx([0.5, 1.0, 1.0, 0.5, 0.0])
    timeline = Timeline.for_run(Time.parse("100ba"), 10, 8)
    wsd = schedule_function(SchedulerConfig(name="wsd", t_warmup="0ba", cooldown=0.2, alpha_f=0.0), timeline)
    assert [wsd(b) for b in (80, 90, 100)] == pytest.approx([1.0, 0.5, 0.0])
    assert multiplier(80, shape="wsd", warmup=0, total=100) == pytest.approx(0.2)  # no cooldown given: all of it


class Odd(torch.nn.Module):
    """Roles the GPT does not show: a tied head registered before its table and nested two deep, a
    parameter of the model itself, a frozen weight before a trained bias."""

    def __init__(self) -> None:
        super().__init__()
        self.decoder = torch.nn.ModuleDict({"deep": torch.nn.ModuleDict({"head": torch.nn.Linear(4, 6, bias=False)})})
        self.embed = torch.nn.Embedding(6, 4)  # after the head, by order and by name
        self.decoder["deep"]["head"].weight = self.embed.weight
        self.gain = torch.nn.Parameter(torch.ones(4))
        self.mix = torch.nn.Linear(4, 4)
        self.mix.weight.requires_grad_(False)
        self.hidden = torch.nn.Linear(4, 4, bias=False)
        self.untied = torch.nn.ModuleDict({"deep": torch.nn.ModuleDict({"head": torch.nn.Linear(4, 6)})})


def test_roles_follow_the_rule_for_any_module_tree():
    roles = {role: [name for name, _ in params] for role, params in parameter_roles(Odd(), ["head"]).items()}
    assert roles == {
        "matrices": ["hidden.weight"],
        "embeddings": ["embed.weight"],  # the tied head, although its module comes first
        "head": ["untied.deep.head.weight", "untied.deep.head.bias"],
        "scalars": ["gain", "mix.bias"],  # the frozen mix.weight is nobody's
    }
    with pytest.raises(
        ConfigError, match=r"^bad value for 'optimizer.name': 'muon' found no 2-D hidden matrices in this model$"
    ):
        build_optimizer(torch.nn.Embedding(4, 2), muon_config(), 8)


@pytest.mark.parametrize("nesterov", [False, True])
def test_muon_and_adam_get_every_setting_as_torch_runs_them_alone(nesterov):
    """Three steps against torch.optim.Muon and torch.optim.Adam built by hand, at values unlike
    torch's defaults (momentum 0.9, decay 0.02; betas (0.7, 0.9), eps 1e-6), every matrix whole."""
    settings = dict(momentum=0.9, nesterov=nesterov, weight_decay=0.02, betas=[0.7, 0.9], eps=1e-6)
    config = OptimizerConfig(name="muon", lr=0.05, muon=MuonConfig(momentum_warmup="0ba"), **settings)
    model, twin = gpt(), gpt()
    model.stacked_matrices = dict  # nothing stacked: every matrix whole, as torch.optim.Muon takes it
    ours = build_optimizer(model, config, 8)
    roles = parameter_roles(twin, ["head"])
    muon = torch.optim.Muon(
        [p for _, p in roles["matrices"]], lr=0.05, momentum=0.9, nesterov=nesterov, weight_decay=0.02
    )
    rates = {"embeddings": 0.6, "head": 0.008, "scalars": 0.04}
    adam = torch.optim.Adam(
        [{"params": [p for _, p in roles[role]], "lr": rate} for role, rate in rates.items()],
        betas=(0.7, 0.9),
        eps=1e-6,
    )
    for step in range(3):
        tokens = torch.randint(0, 40, (2, 8), generator=torch.Generator().manual_seed(step))
        for net, steppers in ((model, [ours]), (twin, [muon, adam])):
            net(tokens).square().mean().backward()
            for stepper in steppers:
                stepper.step()
                stepper.zero_grad()
    for (name, mine), theirs in zip(model.named_parameters(), twin.parameters(), strict=True):
        # a batch of same-shape matrices rounds in bfloat16 as its batched products do (1e-4 here)
        torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-3, msg=name)


def test_a_head_module_the_model_does_not_have_is_refused_naming_the_key():
    with pytest.raises(
        ConfigError,
        match=r"^bad value for 'optimizer.muon.head_modules': 'no_such_module' names no module of this model "
        r"\(its modules are named: .*head.*\)$",
    ):
        build_optimizer(gpt(), muon_config(head_modules=["head", "no_such_module"]), 8)
    build_optimizer(gpt(), muon_config(head_modules=["head", "proj"]), 8)  # every name matches a module
    build_optimizer(torch.nn.Sequential(torch.nn.Linear(4, 4)), muon_config(), 8)  # the default: no error


def test_the_poly_schedule_falls_as_one_minus_the_share_done_to_the_power_by_hand():
    """nnU-Net's PolyLRScheduler: lr x (1 - step / total) ** 0.9."""
    for step in (0, 25, 50, 99, 100):
        expected = (1 - step / 100) ** 0.9
        assert multiplier(step, shape="poly", warmup=0, total=100, power=0.9) == pytest.approx(expected)
    assert multiplier(50, shape="poly", warmup=0, total=100, power=2.0, alpha_f=0.1) == pytest.approx(0.1 + 0.9 * 0.25)


def test_a_stacked_matrix_steps_as_its_parts_would_alone_under_torchs_muon():
    """GPT's fused q, k, v (48 x 16) against torch.optim.Muon on three 16 x 16 matrices with the same
    gradients, over three steps with momentum, Nesterov and decay: the same weights."""
    model = gpt()
    config = OptimizerConfig(
        name="muon", lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.02, muon=MuonConfig(momentum_warmup="0ba")
    )
    ours = build_optimizer(model, config, 8)
    qkv = model.get_parameter("blocks.0.attention.qkv.weight")
    parts = [torch.nn.Parameter(part.detach().clone()) for part in qkv.view(3, 16, 16)]
    torch_muon = torch.optim.Muon(parts, lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.02)
    for step in range(3):
        tokens = torch.randint(0, 40, (2, 8), generator=torch.Generator().manual_seed(step))
        model(tokens).square().mean().backward()
        for part, grad in zip(parts, qkv.grad.view(3, 16, 16), strict=True):
            part.grad = grad.clone()
        ours.step()
        torch_muon.step()
        ours.zero_grad()
    torch.testing.assert_close(qkv.detach(), torch.cat([part.detach() for part in parts]), rtol=0, atol=0)


def muon_rank(rank: int, port: int, out: str) -> None:
    """One of two gloo ranks holding the same gradients (as DDP leaves them): three Muon steps, its
    weights and how many matrices it orthogonalised saved to ``out``/rank<rank>.pt (a file: tensors
    sent through a multiprocessing manager travel as shared memory the manager may fail to open)."""
    import os

    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    result = {"weights": stepped_weights(), "orthogonalised": orthogonalised_matrices()}
    torch.save(result, os.path.join(out, f"rank{rank}.pt"))
    dist.destroy_process_group()


def orthogonalised_matrices() -> int:
    """How many matrices this process orthogonalises over three steps of :func:`stepped_weights`."""
    import trainrun.optim.muon as muon_module

    counted, plain = [], muon_module.orthogonalised

    def counting(stack: torch.Tensor) -> torch.Tensor:
        counted.append(len(stack))
        return plain(stack)

    with mock.patch.object(muon_module, "orthogonalised", counting):
        stepped_weights()
    return sum(counted)


def stepped_weights() -> dict[str, torch.Tensor]:
    """A GPT's weights after three Muon steps on gradients drawn from a fixed seed."""
    model = gpt()
    optimizer = build_optimizer(model, muon_config(momentum_warmup="0ba"), 8)
    generator = torch.Generator().manual_seed(1)
    for _ in range(3):
        for param in model.parameters():
            param.grad = torch.randn(param.shape, generator=generator)
        optimizer.step()
    return {name: param.detach().clone() for name, param in model.named_parameters()}


@pytest.mark.slow
def test_two_ranks_divide_the_orthogonalisation_and_step_as_one_rank(tmp_path):
    """Each rank orthogonalises its share of the matrices and all-gathers the rest: both ranks end
    with one process's weights (the same batched products: exactly)."""
    import torch.multiprocessing as mp

    from trainrun.launch import free_port

    mp.spawn(muon_rank, args=(free_port(), str(tmp_path)), nprocs=2)
    results = [torch.load(tmp_path / f"rank{rank}.pt") for rank in range(2)]
    alone, all_of_them = stepped_weights(), orthogonalised_matrices()
    assert all_of_them == 3 * (2 * 3 + 2 + 2 * 2)  # a step: q, k, v and proj of 2 blocks, 2 up, 2 down
    assert [result["orthogonalised"] for result in results] == [all_of_them // 2] * 2  # each its half
    for rank, result in enumerate(results):
        for name, weight in alone.items():
            torch.testing.assert_close(result["weights"][name], weight, rtol=0, atol=1e-6, msg=f"rank {rank}: {name}")
