"""What a person watching the run sees: a live progress bar, a line per evaluation, a closing table."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from trainrun.core.engine import Callback
from trainrun.core.events import Event
from trainrun.core.state import State
from trainrun.loggers.time_to_quality import TimeToQualityLogger


class ConsoleLogger(Callback):
    """Rank 0's console. The live bar shows only on a terminal; logs get one line per evaluation."""

    def __init__(self, quality_log: TimeToQualityLogger, live: bool = True, console: Console | None = None) -> None:
        self.quality_log = quality_log
        task = quality_log.task
        self.rule, self.unit = task.quality_rule, task.unit
        self.console = console or Console()
        self.live = live and self.console.is_terminal
        self.progress: Progress | None = None
        self.task = None
        self._last = (0, 0.0)  # (samples, train seconds) at the last bar update
        self._notices_shown = 0

    def run_event(self, event: Event, state: State) -> None:
        if not state.is_main:
            return
        if len(state.notices) > self._notices_shown:
            for notice in state.notices[self._notices_shown :]:
                style = "bold red" if notice["level"] == "warning" else "yellow"
                label = f"[{style}]{notice['level']}:[/] step {notice['step']}: "
                self.console.print(label + notice["text"], highlight=False, soft_wrap=True)
            self._notices_shown = len(state.notices)
        if event is Event.FIT_START and self.live:
            self._start_bar(state)
        elif event is Event.BATCH_END and self.progress is not None:
            self._update_bar(state)
        elif event is Event.EVAL_END:
            self._print_eval(state)
        elif event is Event.FIT_END:
            if self.progress is not None:
                self.progress.stop()
            self.console.print(self.closing_table(state))
            self._print_profile()

    def _start_bar(self, state: State) -> None:
        self.progress = Progress(
            TextColumn("[bold]ep {task.fields[epoch]}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn(
                f"loss {{task.fields[loss]}}  {self.rule.label} {{task.fields[quality]}}  "
                f"{{task.fields[speed]}} {self.unit}/s"
            ),
            TimeRemainingColumn(),
            console=self.console,
            transient=True,
        )
        self.task = self.progress.add_task(
            "train",
            total=state.timeline.max_batches,
            completed=state.batch,
            epoch=state.epoch,
            loss="-",
            quality="-",
            speed="-",
        )
        self.progress.start()

    def _update_bar(self, state: State) -> None:
        seconds = state.accounts.train_seconds()
        samples, since = self._last
        fields = {"epoch": state.epoch, "loss": f"{state.train_loss:.3f}" if state.train_loss is not None else "-"}
        if seconds - since >= 1.0:
            fields["speed"] = f"{(state.samples - samples) / (seconds - since):,.0f}"
            self._last = (state.samples, seconds)
        # a budgeted run's end is re-planned as it goes
        self.progress.update(self.task, completed=state.batch, total=state.timeline.max_batches, **fields)

    def _print_eval(self, state: State) -> None:
        record = self.quality_log.records[-1] if self.quality_log.records else None
        if record is None:
            return
        if self.progress is not None:
            self.progress.update(self.task, quality=self.rule.format(record[self.rule.metric]))
        shown = self.quality_log.task.metrics.items()
        metrics = "  ".join(f"{label} {self.rule.format(record[name])}" for name, label in shown)
        if "eval_loss" not in self.quality_log.task.metrics:  # a loss as the quality is shown once
            metrics += f"  eval loss {record['eval_loss']:.4f}"
        parts = [f"{name.partition('/')[2]} {value:.4f}" for name, value in record.items() if "/" in name]
        if parts:  # a mixture's loss on each corpus
            metrics += f" ({', '.join(parts)})"
        self.console.print(
            f"epoch {record['epoch']:.2f}  batch {record['batch']}  {metrics}  "
            f"train {record['train_seconds']:.1f}s  {record['throughput']:,.0f} {self.unit}/s",
            highlight=False,
            soft_wrap=True,
        )

    def _print_profile(self) -> None:
        """The bottleneck line and, for a profiled prefix, the extrapolated full-run time."""
        summary = self.quality_log.summary
        if summary.get("bottleneck"):
            self.console.print(summary["bottleneck"]["sentence"], highlight=False, soft_wrap=True)
        steady = summary.get("bottleneck_after_first_epoch")
        if steady and steady["bottleneck"] != summary["bottleneck"]["bottleneck"]:
            self.console.print(f"after the first epoch, {steady['sentence']}", highlight=False, soft_wrap=True)
        if extrapolated := summary.get("extrapolated"):
            measured, steps = extrapolated["measured_train_seconds"], extrapolated["from_batches"]
            self.console.print(
                f"extrapolated: {extrapolated['train_seconds']:.1f}s training for {extrapolated['to_batches']} steps "
                f"(measured {measured:.1f}s for the first {steps}, then {extrapolated['seconds_per_step'] * 1000:.1f} "
                "ms/step)" + (f"; caveat: {extrapolated['caveat']}" if extrapolated["caveat"] else ""),
                highlight=False,
                soft_wrap=True,
            )

    def closing_table(self, state: State) -> Table:
        """Time to each quality target, with the final and best quality."""
        table = Table(title="time to accuracy", title_justify="left")
        for column in (f"target {self.rule.label}", "train seconds", "wall seconds", "epoch", "batch"):
            table.add_column(column, justify="right")
        for target, reached in self.quality_log.time_to_targets().items():
            if reached is None:
                table.add_row(self.rule.format(float(target)), "not reached", "-", "-", "-")
            else:
                table.add_row(
                    self.rule.format(float(target)),
                    f"{reached['train_seconds']:.1f}",
                    f"{reached['wall_seconds']:.1f}",
                    f"{reached['epoch']:.2f}",
                    str(reached["batch"]),
                )
        records, rule = self.quality_log.records, self.rule
        best = rule.format(rule.best(r[rule.metric] for r in records))
        final = rule.format(records[-1][rule.metric] if records else None)
        table.caption = f"final {rule.label} {final}, best {best}, train {state.accounts.train_seconds():.1f}s"
        return table
