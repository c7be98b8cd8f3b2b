"""Runs algorithms and callbacks at each :class:`Event`; the trainer calls nothing else."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, ClassVar

from trainrun.core.events import Event
from trainrun.core.state import State

if TYPE_CHECKING:
    from torch import nn

    from trainrun.core.work import StepWork


class Algorithm:
    """A speed-up method: acts on ``events`` and changes the state there.

    Its place among the others is decided by whoever builds the :class:`Engine` (trainrun's
    methods: their specs' positions, ``trainrun.algorithms.in_method_order``).
    ``state_dict`` is saved in checkpoints.
    """

    name: ClassVar[str]
    events: ClassVar[frozenset[Event]] = frozenset()

    def __init__(self, config: Any = None) -> None:
        self.config = config  # the method's hyperparameters

    def match(self, event: Event, state: State) -> bool:
        """Whether to act now; by default on every event in ``events``."""
        return event in self.events

    def apply(self, event: Event, state: State) -> None:
        """Do the work for ``event``."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned; called on resume right after FIT_START."""

    def step_work(self, work: StepWork, progress: float) -> StepWork:
        """A training step's work after ``progress`` of the run, as this method changes it (the
        expectation over its batches); methods that leave the step's work as it is return ``work``."""
        return work

    def device_work(self, state: State) -> tuple[Callable[[], object], str] | None:
        """What this method runs on the device besides the model's passes and the optimizer, for
        ``trainrun estimate`` to time as its operations: a call doing it once on ``state``'s model and
        batch (fake tensors) as a step after the first does, and how often it runs (a duration:
        ``"1ba"`` every step); None where it runs nothing there."""
        return None

    def rebuild(self, model: nn.Module) -> None:
        """Change ``model``, built afresh, as this method changed the run's at INIT (its structure, or
        the forward it runs), so that a checkpoint's weights load into it (``trainrun sample``) and
        ``trainrun estimate`` runs the run's forward; methods that leave the model as it was do nothing."""

    def restore_evaluated(self, model: nn.Module, saved: dict[str, Any]) -> None:
        """Make ``model``, built afresh and holding a checkpoint's training weights, what this
        method's evaluations scored, from the :meth:`state_dict` it saved there (``trainrun sample``)."""


class Callback:
    """Observes the run (logging, progress); runs after the algorithms at every event."""

    def run_event(self, event: Event, state: State) -> None:
        """Called at every event."""

    def run_failed(self, state: State, error: BaseException) -> None:
        """Called once if the run ends with ``error`` (FIT_END never comes): close what is open."""


class Engine:
    """Fires events to algorithms (in the order given; reversed on closing events) and then
    callbacks, timing the algorithms' work."""

    def __init__(self, algorithms: Iterable[Algorithm], callbacks: Iterable[Callback] = ()) -> None:
        self.algorithms = list(algorithms)
        self.callbacks = list(callbacks)

    def order_at(self, event: Event) -> list[str]:
        """The names of the algorithms that act on ``event``, in the order they run there."""
        acting = [algorithm.name for algorithm in self.algorithms if event in algorithm.events]
        return acting[::-1] if event.closes else acting

    def run(self, event: Event, state: State) -> None:
        """Apply every matching algorithm, then every callback."""
        for algorithm in self._matching(event, state):
            previous = state.accounts.switch("algorithms")
            algorithm.apply(event, state)
            state.accounts.switch(previous)
        for callback in self.callbacks:
            callback.run_event(event, state)

    @contextmanager
    def evaluated_model(self, state: State) -> Iterator[None]:
        """The model as an evaluation sees it (EMA's average in place of the weights, the window
        for the run's progress) for what is done with it after the loop, such as exporting it: the
        algorithms' EVAL_START and EVAL_END around the block, without the callbacks (nothing is
        logged as an evaluation)."""
        for algorithm in self._matching(Event.EVAL_START, state):
            algorithm.apply(Event.EVAL_START, state)
        try:
            yield
        finally:
            for algorithm in self._matching(Event.EVAL_END, state):
                algorithm.apply(Event.EVAL_END, state)

    def _matching(self, event: Event, state: State) -> Iterator[Algorithm]:
        """The algorithms that act on ``event``, in their order there, each asked when its turn comes."""
        for algorithm in reversed(self.algorithms) if event.closes else self.algorithms:
            if algorithm.match(event, state):
                yield algorithm

    def state_dict(self) -> dict[str, Any]:
        return {algorithm.name: algorithm.state_dict() for algorithm in self.algorithms}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for algorithm in self.algorithms:
            if algorithm.name in state_dict:
                algorithm.load_state_dict(state_dict[algorithm.name])
