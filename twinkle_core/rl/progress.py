"""`run_with_progress`: an `AsyncRLDriver` run behind a progress bar, the driver closed afterwards."""

from __future__ import annotations

from statistics import fmean
from typing import Any, Callable, Sequence

from twinkle_core.rl.async_driver import AsyncRLDriver, RunReport, StepRecord


def run_with_progress(
    driver: AsyncRLDriver,
    steps: int,
    *,
    desc: str,
    metrics: Sequence[str] = ('reward',),
    evaluator: Callable[[int], dict[str, float]] | None = None,
    eval_every: int = 0,
    **tqdm_options: Any,
) -> RunReport:
    """``driver.run(steps)`` with a tqdm bar of one tick per step that shows the step's `metrics` (those its
    ``train_step`` returned) and its mean staleness; `evaluator` / `eval_every` as `AsyncRLDriver.run` takes them,
    each evaluation's accuracy (or its first metric) written above the bar. The driver is closed when the run
    ends, also on an error."""
    from tqdm import tqdm

    progress = tqdm(total=steps, desc=desc, **tqdm_options)

    def show(record: StepRecord) -> None:
        progress.update()
        shown = {name: f'{record.metrics[name]:.2f}' for name in metrics if name in record.metrics}
        staleness = fmean(record.staleness) if record.staleness else 0.0
        progress.set_postfix(**shown, staleness=f'{staleness:.1f}')

    def evaluate(version: int) -> dict[str, float]:
        result = dict(evaluator(version)) if evaluator is not None else {}
        name = 'accuracy' if 'accuracy' in result else next(iter(result), None)
        if name is not None:
            progress.write(f'policy version {version}: eval {name} {result[name]:.3f}')
        return result

    try:
        return driver.run(
            steps, on_step=show, evaluator=evaluate if evaluator is not None else None, eval_every=eval_every
        )
    finally:
        progress.close()
        driver.close()
