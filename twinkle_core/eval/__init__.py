"""Evaluation: tasks (kind ``task``: held-out prompts, a scorer, sampling settings) run through any sampler, with
accuracy, pass@k, mean reward, format rate and length, each with its uncertainty.

    from twinkle_core.eval import evaluate
    result = evaluate(sampler, 'ArithmeticTask', task_args={'size': 200})
    print(result.metrics['accuracy'], result.metrics['accuracy_low'], result.metrics['accuracy_high'])
"""

from twinkle_core.eval.runner import EvalResult, evaluate
from twinkle_core.eval.task import EvalTask, PromptListTask, Score

__all__ = ['EvalResult', 'EvalTask', 'PromptListTask', 'Score', 'evaluate']
