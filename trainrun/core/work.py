"""What a training step computes at a point of the run, as the speed-up methods change it
(:meth:`~trainrun.core.engine.Algorithm.step_work`): ``trainrun estimate`` integrates it over the
schedule. A method says its own effect in its own module, where it acts; the estimate names none.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StepWork:
    """A step's work relative to a plain step at the run's shapes, as the expectation over its batches."""

    full_resolution: int | None = None  # the image side the run trains up to (FixRes lowers it)
    resolution: int | None = None  # the side the model trains at now (progressive resizing)
    loaded_resolution: int | None = None  # the side a loader decoding at any size hands out, if not that
    sequence_length: int | None = None  # tokens a training sequence now (sequence-length warmup)
    pixel_share: float = 1.0  # of the image's pixels the model sees (ColOut's dropped rows and columns)
    trained_share: float = 1.0  # of the batch's samples that go forward and backward (selective backprop)
    scored_share: float = 0.0  # forward passes without gradients, in batches at their pixel share
    extra_passes: float = 0.0  # forward and backward passes again over the trained samples (SAM's second)
    image_ops: float = 0.0  # augmentation operations the loader runs on each image (RandAugment's depth)

    def key(self) -> tuple:
        """What decides the step's time: steps of equal keys form one phase of the run."""
        return (
            self.resolution, self.loaded_resolution, self.sequence_length, round(self.pixel_share, 6),
            round(self.trained_share, 6), round(self.scored_share, 6), round(self.extra_passes, 6),
            round(self.image_ops, 6),
        )  # fmt: skip
