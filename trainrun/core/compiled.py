"""``torch.compile`` for the run's model, what it compiled recorded, every fall-back to eager reported.

A model with transformer blocks (``model.blocks``: GPT, Llama, BERT) has each block compiled in
place, as torchtitan does: the blocks share one compiled graph (a block's weights are its inputs,
not constants), activation checkpointing inside a block is compiled with it (the selective policy
is applied once, when the graph is traced, not by a dispatch mode on every op of every pass),
FSDP2's hooks stay outside the graphs, and parameter names, checkpoints and exports are those of
the eager model. With them the element-wise tail of its logits (``model.logit_tail``: GPT's
soft-capping), and the loss of a task whose loss traces whole (``loss_compiles``: causal language
modelling's, as torchtitan compiles its loss; a masked LM's reads host counts): at a 50,000-token
vocabulary the logits are the step's largest tensor, and eager their cap, float32 casts and
softmax move nearly four times what inductor's kernels move (``tests/test_estimate.py``).
Any other model (ResNet, the UNets) is compiled whole, and its loss stays eager.

Past dynamo's recompile limit a compiled function silently runs eager from then on, which
turns a measured speed-up into a slow-down nobody sees; torch only logs one warning. The
handler here turns that warning into a run warning (console and ``summary.json``), and
:class:`CompileRecord` puts the graph breaks, the graphs compiled after warm-up and the seconds
spent compiling in ``summary.json`` (``compile``), so that a GPU run shows them.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch._dynamo.utils import calculate_time_spent, counters

from trainrun.core.parallel import repeated_blocks

DYNAMO_LOGGER = "torch._dynamo.convert_frame"  # where torch logs "torch._dynamo hit config.recompile_limit"
BACKEND = "inductor"  # tests count graphs under "eager": the same tracing, breaks and guards, no code generation


class RecompileLimitWatch(logging.Handler):
    """Reports torch's "hit config.recompile_limit" warnings."""

    def __init__(self, report: Callable[[str], None]) -> None:
        super().__init__(logging.WARNING)
        self.report = report

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("torch._dynamo hit config."):
            first, *details = message.splitlines()
            where = "; ".join(line.strip() for line in details[:2])
            self.report(f"torch.compile fell back to eager: {first.removeprefix('torch._dynamo ')} ({where})")


def watch_recompile_limit(report: Callable[[str], None]) -> logging.Handler:
    """Call ``report(message)`` whenever a compiled function falls back to eager; returns the handler.

    One watcher per process: a later run in the same process replaces the earlier run's.
    """
    logger = logging.getLogger(DYNAMO_LOGGER)
    for old in [h for h in logger.handlers if isinstance(h, RecompileLimitWatch)]:
        logger.removeHandler(old)
    handler = RecompileLimitWatch(report)
    logger.addHandler(handler)
    return handler


def compile_model(model: nn.Module, report: Callable[[str], None], backend: str | None = None) -> nn.Module:
    """``model`` compiled (module docstring: block by block where it has blocks, else whole),
    reporting any later fall-back to eager through ``report``."""
    watch_recompile_limit(report)
    regions = compiled_regions(model)
    if regions == [model]:
        return torch.compile(model, backend=backend or BACKEND)
    for block in regions:
        block.compile(backend=backend or BACKEND)
    return model


def compile_loss(
    model: nn.Module, task: Any, loss_fn: Callable[..., torch.Tensor], backend: str | None = None
) -> Callable[..., torch.Tensor]:
    """``loss_fn`` compiled where :func:`compiles_loss`, else as it is."""
    return torch.compile(loss_fn, backend=backend or BACKEND) if compiles_loss(model, task) else loss_fn


def compiled_regions(model: nn.Module) -> list[nn.Module]:
    """The modules :func:`compile_model` compiles: each transformer block and the logits' tail where
    ``model`` has blocks, else the whole model. What runs outside them (embeddings, the final norm,
    the head's product) stays eager."""
    blocks = repeated_blocks(model)
    if not blocks:
        return [model]
    tail = getattr(model, "logit_tail", None)
    return [*blocks, *([tail] if tail is not None else [])]


def compiles_loss(model: nn.Module, task: Any) -> bool:
    """Whether a compiled run compiles its loss too: where ``model`` is compiled block by block and
    ``task``'s loss traces whole (its ``loss_compiles``)."""
    return compiled_regions(model) != [model] and getattr(task, "loss_compiles", False)


def is_compiled(model: nn.Module) -> bool:
    """Whether ``model`` (or the module a DDP wrapper holds) is compiled, whole or block by block."""
    model = getattr(model, "module", model)
    return hasattr(model, "_orig_mod") or any(
        getattr(block, "_compiled_call_impl", None) is not None for block in repeated_blocks(model)
    )


def _dynamo_totals() -> dict[str, float]:
    """This process's compiled graphs (frames) and compile seconds so far."""
    return {
        "graphs": counters["frames"]["ok"],
        "seconds": calculate_time_spent().get("total_wall_time", 0.0),
    }


class CompileRecord:
    """What ``torch.compile`` did during one run (dynamo's counters are per process, so the run's
    share is the difference from when it started): graph breaks, graphs compiled during warm-up
    (up to the end of the first evaluation: the training shapes, a second micro-batch size that
    makes the batch dimension dynamic, evaluation mode), recompilations after it, and seconds spent
    compiling (forward and backward graphs)."""

    def __init__(self) -> None:
        self.start = _dynamo_totals()
        self.breaks_before = dict(counters["graph_break"])
        self.warm: dict[str, float] | None = None

    def break_reasons(self) -> dict[str, int]:
        """The run's graph breaks by dynamo's reason (its first line), most frequent first."""
        reasons: Counter[str] = Counter()
        for reason, count in counters["graph_break"].items():
            reasons[reason.splitlines()[0][:200]] += count - self.breaks_before.get(reason, 0)
        return dict(sorted(((r, n) for r, n in reasons.items() if n > 0), key=lambda item: -item[1]))

    def _since(self, then: dict[str, float]) -> dict[str, float]:
        now = _dynamo_totals()
        return {key: now[key] - then[key] for key in now}

    def end_warm_up(self) -> None:
        """Mark the end of warm-up (the first call counts; later ones do nothing)."""
        if self.warm is None:
            self.warm = _dynamo_totals()

    def as_dict(self) -> dict[str, Any]:
        """``summary.json``'s ``compile``: graph_breaks, warm_up_graphs, recompiles (graphs compiled
        after warm-up; None when the run never finished an evaluation), seconds and the graph
        breaks' reasons."""
        total = self._since(self.start)
        after = self._since(self.warm) if self.warm is not None else None
        reasons = self.break_reasons()
        return {
            "graph_breaks": sum(reasons.values()),
            "warm_up_graphs": int(total["graphs"] - (after["graphs"] if after else 0)),
            "recompiles": int(after["graphs"]) if after else None,
            "seconds": round(total["seconds"], 3),
            "graph_break_reasons": reasons,
        }
