"""``torch.compile`` for the run's model, with every fall-back to eager reported.

Past dynamo's recompile limit a compiled function silently runs eager from then on, which
turns a measured speed-up into a slow-down nobody sees; torch only logs one warning. The
handler here turns that warning into a run warning (console and ``summary.json``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from torch import nn

DYNAMO_LOGGER = "torch._dynamo.convert_frame"  # where torch logs "torch._dynamo hit config.recompile_limit"


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


def compile_model(model: nn.Module, report: Callable[[str], None]) -> nn.Module:
    """``torch.compile(model)``, reporting any later fall-back to eager through ``report``."""
    watch_recompile_limit(report)
    return torch.compile(model)


def is_compiled(model: nn.Module) -> bool:
    """Whether ``model`` (or the module a DDP wrapper holds) is a ``torch.compile`` module."""
    return hasattr(getattr(model, "module", model), "_orig_mod")
