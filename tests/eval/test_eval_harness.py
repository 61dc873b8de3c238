"""The evaluation harness: metrics with their uncertainty (pass@k against its definition, Wilson's interval), the
built-in tasks' prompts and scorers, `evaluate` through a real sampler, and `twinkle eval` from the shell."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

import pytest

from twinkle_core.eval import evaluate
from twinkle_core.eval.arithmetic import ArithmeticTask, arithmetic_prompts
from twinkle_core.eval.gsm8k import GSM8KTask
from twinkle_core.eval.identity import HELD_OUT_QUESTIONS, SelfCognitionTask
from twinkle_core.eval.instructions import RULES, InstructionFormatTask
from twinkle_core.eval.metrics import mean_interval, pass_at_k, summarize, wilson_interval
from twinkle_core.fixtures import data_path
from twinkle_core.registry import resolve


def answered(prompt: dict, text: str) -> dict:
    return {**prompt, 'messages': [*prompt['messages'], {'role': 'assistant', 'content': text}]}


@pytest.mark.parametrize('n, c, k', [(5, 2, 1), (5, 2, 2), (5, 2, 3), (6, 0, 2), (6, 6, 1), (8, 3, 4), (4, 1, 4)])
def test_pass_at_k_is_the_chance_that_one_of_k_draws_without_replacement_is_correct(n, c, k):
    draws = list(itertools.combinations([True] * c + [False] * (n - c), k))
    assert pass_at_k(n, c, k) == pytest.approx(sum(any(d) for d in draws) / len(draws))


def test_bad_pass_at_k_arguments_are_refused():
    with pytest.raises(ValueError, match='1 <= k <= n'):
        pass_at_k(3, 1, 4)


def test_wilson_and_mean_intervals():
    low, high = wilson_interval(8, 10)  # the textbook value: 0.490 .. 0.943
    assert (round(low, 3), round(high, 3)) == (0.49, 0.943)
    assert wilson_interval(0, 20)[0] == 0.0 and wilson_interval(20, 20)[1] == 1.0
    mean, lo, hi = mean_interval([1.0, 2.0, 3.0, 4.0])
    assert mean == 2.5 and hi - mean == pytest.approx(mean - lo) == pytest.approx(1.96 * 1.2910 / 2, rel=1e-3)


def test_summarize_counts_prompts_samples_and_rates():
    m = summarize(
        [[True, False], [False, False]], [[1.0, 0.0], [0.0, 0.5]], [[True, True], [False, True]], [[3, 5], [2, 2]]
    )
    assert m['accuracy'] == 0.25 and m['pass@1'] == 0.25 and m['pass@2'] == 0.5
    assert m['format_rate'] == 0.75 and m['mean_length'] == 3.0 and m['mean_reward'] == 0.375
    assert (m['prompts'], m['samples']) == (2.0, 2.0) and m['accuracy_low'] <= 0.25 <= m['accuracy_high']


def test_arithmetic_splits_are_disjoint_seeded_and_scored():
    train = {p['messages'][0]['content'] for p in arithmetic_prompts(6000, split='train')}
    test = arithmetic_prompts(1500, split='test', seed=3)
    assert not train & {p['messages'][0]['content'] for p in test}
    assert test == arithmetic_prompts(1500, split='test', seed=3) != arithmetic_prompts(1500, split='test', seed=4)
    task = ArithmeticTask(size=3)
    a, b, c = task.prompts()
    scores = task.score([answered(a, a['ground_truth']), answered(b, f'It is {b["ground_truth"]}.'), answered(c, '1')])
    assert [(s.correct, s.formatted) for s in scores] == [(True, True), (True, False), (False, True)]
    with pytest.raises(ValueError, match='the range holds'):
        arithmetic_prompts(10**6)


def test_identity_questions_are_held_out_of_the_training_data():
    trained = {json.loads(line)['query'].lower() for line in data_path('self_cognition.jsonl').read_text().splitlines()}
    assert not {q.lower() for q in HELD_OUT_QUESTIONS} & trained
    task = SelfCognitionTask()
    p = task.prompts()[0]
    scores = task.score(
        [answered(p, 'I am Twinkle, made by ModelScope.'), answered(p, 'I am twinkle.'), answered(p, 'I am SmolLM.')]
    )
    assert [(s.correct, s.formatted) for s in scores] == [(True, True), (True, False), (False, False)]


def test_gsm8k_task_reads_a_local_file_and_scores_the_final_answer(tmp_path):
    task = GSM8KTask(str(data_path('gsm8k_sample.jsonl')), limit=2)
    first = task.prompts()[0]  # "... #### 22"
    scores = task.score([answered(first, 'So 30 - 8 = 22.\n#### 22'), answered(first, 'It is 21.')])
    assert [(s.correct, s.formatted) for s in scores] == [(True, True), (False, False)]
    bad = tmp_path / 'bad.jsonl'
    bad.write_text('{"question": "x"}\n')
    with pytest.raises(ValueError, match='lack "question" or "answer"'):
        GSM8KTask(str(bad))


@pytest.mark.parametrize(
    'rule, good, bad',
    [
        ('lowercase', 'blue sky', 'Blue sky'),
        ('no_commas', 'red and blue', 'red, blue'),
        ('max_10_words', 'short answer', 'one two three four five six seven eight nine ten eleven'),
        ('three_bullets', '- a\n- b\n- c', '- a\n- b'),
        ('quoted', '"blue"', 'blue'),
        ('ends_with_done', 'blue. Done.', 'done is blue'),
        ('one_word', 'blue', 'blue sky'),
    ],
)
def test_instruction_rules_need_no_model(rule, good, bad):
    task = InstructionFormatTask(rules=[rule])
    p = task.prompts()[0]
    assert RULES[rule][0] in p['messages'][0]['content']
    assert [s.correct for s in task.score([answered(p, good), answered(p, bad)])] == [True, False]


def test_tasks_resolve_by_name():
    assert isinstance(resolve('task', 'ArithmeticTask', size=4), ArithmeticTask)
    with pytest.raises(ValueError, match='unknown instruction rules'):
        resolve('task', 'InstructionFormatTask', rules=['shout'])


def test_evaluate_through_a_sampler_scores_what_the_sampler_answers(tiny_model_dir):
    from twinkle_transformers.sampler import TorchSampler

    sampler = TorchSampler(tiny_model_dir, device='cpu')
    task = ArithmeticTask(size=6, max_tokens=6)
    task.sampling = task.sampling.model_copy(update={'temperature': 1.0})
    result = evaluate(sampler, task, num_samples=3, batch_size=4, seed=5, progress=False)
    assert len(result.records) == 6 and all(len(r['completions']) == 3 for r in result.records)
    again = sampler.sample(task.prompts()[4:6], task.sampling.model_copy(update={'num_samples': 3, 'seed': 5}))
    assert [r['completions'] for r in result.records[4:]] == [[s.text for s in r.sequences] for r in again]
    rescored = [task.score([answered(r['prompt'], c) for c in r['completions']]) for r in result.records]
    assert result.metrics['accuracy'] == pytest.approx(sum(s.correct for ss in rescored for s in ss) / 18)
    assert result.metrics['samples'] == 3 and {'pass@1', 'pass@2'} <= set(result.metrics)
    assert set(result.logged()) >= {'eval/arithmetic/accuracy', 'eval/arithmetic/format_rate'}


def test_twinkle_eval_from_the_shell(tiny_model_dir, tmp_path):
    out = tmp_path / 'eval.json'
    cmd = [sys.executable, '-m', 'twinkle_core.cli.main', 'eval', '--model', str(tiny_model_dir)]
    done = subprocess.run(
        [*cmd, '--task', 'ArithmeticTask', '--task-args', '{"size": 4, "max_tokens": 4}', '--json', str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert 'arithmetic: accuracy' in done.stdout
    report = json.loads(out.read_text())
    assert report['metrics']['prompts'] == 4 and len(report['records']) == 4
    bad = subprocess.run([*cmd, '--task', 'ArithmeticTask', '--task-args', '{size'], capture_output=True, text=True)
    assert bad.returncode == 1 and '--task-args / --sampler-args must be JSON objects' in bad.stderr


def test_an_evaluation_at_a_training_step_reaches_the_metrics_loggers(tiny_model_dir, tmp_path, monkeypatch):
    from twinkle_core import hooks
    from twinkle_transformers.sampler import TorchSampler

    path = tmp_path / 'metrics.jsonl'
    monkeypatch.setenv('TWINKLE_METRICS_JSONL', str(path))
    hooks.reset_plugin_manager()
    try:
        sampler = TorchSampler(tiny_model_dir, device='cpu')
        result = evaluate(sampler, SelfCognitionTask(max_tokens=4), limit=2, step=7, progress=False)
    finally:
        hooks.reset_plugin_manager()
    (line,) = [json.loads(x) for x in path.read_text().splitlines()]
    assert line['step'] == 7 and line['context'] == {'is_training': False, 'eval_task': 'self_cognition'}
    assert line['metrics']['eval/self_cognition/accuracy'] == result.metrics['accuracy']
