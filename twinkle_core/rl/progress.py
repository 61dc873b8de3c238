"""`run_with_progress`: an `AsyncRLDriver` run behind a progress bar, the driver closed afterwards."""

from __future__ import annotations

from statistics import fmean
from typing import Any, Sequence

from twinkle_core.rl.async_driver import AsyncRLDriver, RunReport, StepRecord


def run_with_progress(
    driver: AsyncRLDriver, steps: int, *, desc: str, metrics: Sequence[str] = ('reward',), **tqdm_options: Any
) -> RunReport:
    """``driver.run(steps)`` with a tqdm bar of one tick per step that shows the step's `metrics` (those its
    ``train_step`` returned) and its mean staleness; the driver is closed when the run ends, also on an error."""
    from tqdm import tqdm

    progress = tqdm(total=steps, desc=desc, **tqdm_options)

    def show(record: StepRecord) -> None:
        progress.update()
        shown = {name: f'{record.metrics[name]:.2f}' for name in metrics if name in record.metrics}
        staleness = fmean(record.staleness) if record.staleness else 0.0
        progress.set_postfix(**shown, staleness=f'{staleness:.1f}')

    try:
        return driver.run(steps, on_step=show)
    finally:
        progress.close()
        driver.close()
