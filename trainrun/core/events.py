"""The fixed list of moments in a run at which algorithms and callbacks act."""

from enum import Enum


class Event(str, Enum):
    """Events in the order :class:`~trainrun.core.trainer.Trainer` fires them.

    ``INIT`` fires once when the trainer is built, before the model is wrapped for distributed
    training; ``FIT_START`` once when training starts or resumes. Each optimizer step fires
    ``BATCH_START`` to ``BATCH_END``; ``BEFORE_OPTIMIZER_STEP`` sees gradients already unscaled.
    With gradient accumulation (``device_train_microbatch_size``) ``AFTER_DATALOADER`` sees the
    whole batch and ``BEFORE_FORWARD`` to ``AFTER_BACKWARD`` fire once per micro-batch.
    ``EVAL_START`` / ``EVAL_END`` bracket every evaluation.
    """

    INIT = "init"
    FIT_START = "fit_start"
    EPOCH_START = "epoch_start"
    BATCH_START = "batch_start"
    AFTER_DATALOADER = "after_dataloader"
    BEFORE_FORWARD = "before_forward"
    AFTER_FORWARD = "after_forward"
    BEFORE_LOSS = "before_loss"
    AFTER_LOSS = "after_loss"
    BEFORE_BACKWARD = "before_backward"
    AFTER_BACKWARD = "after_backward"
    BEFORE_OPTIMIZER_STEP = "before_optimizer_step"
    BATCH_END = "batch_end"
    EPOCH_END = "epoch_end"
    EVAL_START = "eval_start"
    EVAL_END = "eval_end"
    FIT_END = "fit_end"

    @property
    def closes(self) -> bool:
        """Whether this event closes a bracket an earlier event opened (``AFTER_FORWARD`` closes
        ``BEFORE_FORWARD``, ``BATCH_END`` closes ``BATCH_START``, ...). Such events run their
        algorithms in reverse order, like a stack, so what was set up first is undone last.
        ``AFTER_DATALOADER`` opens nothing and closes nothing: it runs in table order."""
        return self is not Event.AFTER_DATALOADER and (self.value.startswith("after_") or self.value.endswith("_end"))
