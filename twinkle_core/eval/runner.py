"""Run an `EvalTask` through any sampler: batched, seeded, with a progress bar; metrics from `metrics.summarize`.

    from twinkle_core.eval import evaluate
    result = evaluate(sampler, 'ArithmeticTask', adapter_name='tenant-a', num_samples=4)
    result.metrics['accuracy'], result.metrics['pass@4']

`sampler` is anything with the `Sampler.sample` signature: `TorchSampler`, `vLLMSampler`, a Ray sampler group, a
native client's remote sampler, or the service through the tinker SDK (`twinkle_agentic`'s `TinkerSampler`, which
takes token ids: pass ``template=`` and the prompts are encoded, and the completions decoded, here). Without
``template=`` the sampler encodes the task's chat prompts itself (samplers built from a model directory with a chat
template do).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

from twinkle_core.eval.metrics import summarize
from twinkle_core.eval.task import EvalTask
from twinkle_core.hooks.emit import emit_metrics
from twinkle_core.registry import resolve


@dataclass
class EvalResult:
    """`metrics` (`metrics.summarize`: accuracy with its interval, pass@k, mean reward, format rate, mean length)
    and `records`: per prompt, its samples' texts and scores."""

    task: str
    metrics: dict[str, float]
    records: list[dict[str, Any]] = field(default_factory=list)

    def logged(self, prefix: str = 'eval') -> dict[str, float]:
        """The metrics as a metrics logger takes them: ``{prefix}/{task}/{name}``."""
        return {f'{prefix}/{self.task}/{name}': value for name, value in self.metrics.items()}

    def emit(self, step: int, adapter_name: str | None = None) -> None:
        """Send `logged()` to every metrics logger (console, JSONL, TensorBoard, W&B, SwanLab: the console's
        curves read the JSONL) as the metrics of training step `step`."""
        context: dict[str, Any] = {'is_training': False, 'eval_task': self.task}
        if adapter_name is not None:
            context['adapter_name'] = adapter_name
        emit_metrics(step, self.logged(), context)


def evaluate(
    sampler: Any,
    task: EvalTask | str,
    *,
    adapter_name: str | None = None,
    num_samples: int = 1,
    limit: int | None = None,
    batch_size: int = 16,
    seed: int = 0,
    progress: bool = True,
    task_args: dict[str, Any] | None = None,
    step: int | None = None,
    template: Any = None,
) -> EvalResult:
    """Sample `num_samples` completions of each of the task's prompts (the first `limit`) with the task's sampling
    settings (seeded with `seed` unless greedy) through `sampler`, `batch_size` prompts per call, and score them.
    `task`: an `EvalTask` or a registered name (kind ``task``; `task_args` are its constructor arguments). `step`:
    the training step this evaluation belongs to; given, the metrics also go to every metrics logger
    (`EvalResult.emit`). `template`: encode the prompts to token ids and decode the completions here, for samplers
    that take token ids only.
    """
    task = resolve('task', task, **(task_args or {})) if isinstance(task, str) else task
    prompts = task.prompts()[:limit] if limit is not None else task.prompts()
    if not prompts:
        raise ValueError(f'task {task.name!r} has no prompts')
    params = task.sampling.model_copy(update={'num_samples': num_samples, 'seed': seed, 'logprobs': False})
    correct: list[list[bool]] = []
    rewards: list[list[float]] = []
    formatted: list[list[bool]] = []
    lengths: list[list[int]] = []
    records: list[dict[str, Any]] = []
    bar = _progress(len(prompts), task.name) if progress else None
    for start in range(0, len(prompts), batch_size):
        batch = prompts[start : start + batch_size]
        inputs = [template.encode(p, add_generation_prompt=True) for p in batch] if template is not None else batch
        responses = sampler.sample(inputs, params, adapter_name=adapter_name)
        for prompt, response in zip(batch, responses):
            scored = [_scored_trajectory(prompt, seq, template) for seq in response.sequences]
            scores = task.score(scored)
            correct.append([s.correct for s in scores])
            rewards.append([s.reward for s in scores])
            formatted.append([s.formatted for s in scores])
            lengths.append([_length(seq) for seq in response.sequences])
            records.append(
                {
                    'prompt': prompt,
                    'completions': [t['messages'][-1]['content'] for t in scored],
                    'correct': correct[-1],
                    'reward': rewards[-1],
                }
            )
        if bar is not None:
            bar.update(len(batch))
    if bar is not None:
        bar.close()
    result = EvalResult(task.name, summarize(correct, rewards, formatted, lengths), records)
    if step is not None:
        result.emit(step, adapter_name)
    return result


def _length(sequence: Any) -> int:
    """A completion's length in tokens: its token ids, or, from a sampler that returns text (an OpenAI-compatible
    endpoint: `twinkle_agentic`'s `OpenAISampler`), the count of its per-token log-probs."""
    return len(sequence.tokens) or len(sequence.logprobs or ())


def _scored_trajectory(prompt: dict[str, Any], sequence: Any, template: Any) -> dict[str, Any]:
    """The prompt with the completion appended as the assistant's message (the sampler's `new_input_feature` when it
    has one, else built here from its text, or from its tokens decoded by `template`)."""
    feature = sequence.new_input_feature
    if template is None and isinstance(feature, dict) and isinstance(feature.get('messages'), list):
        return feature
    text = sequence.text if sequence.text is not None else ''
    if template is not None and sequence.text is None:
        text = template.decode(list(sequence.tokens))
    return {**prompt, 'messages': [*prompt.get('messages', []), {'role': 'assistant', 'content': text}]}


def _progress(total: int, name: str) -> Any:
    try:
        from tqdm import tqdm
    except ImportError:  # tqdm is optional for the core
        return None
    return tqdm(total=total, desc=f'eval {name}', unit='prompt', file=sys.stderr, leave=False)
