"""`TransformersValueModel`: a causal LM with a scalar head (PPO critic, reward model) on the tiny fixture.

Its per-row ``scores`` are what transformers' own sequence-classification forward pools (the head at the last
token); ``values`` are the head at every position, aligned with ``input_ids`` like log-probs, the same padded and
packed; a LoRA critic trains its head and saves it with the adapter; and a critic learns a toy value function
(explained variance rises, value loss falls)."""

from __future__ import annotations

import random

import pytest
import torch

from twinkle_core.errors import InvalidInputError
from twinkle_core.model import TransformersModel, TransformersValueModel
from twinkle_core.registry import resolve


@pytest.fixture(scope='module')
def rows(tiny_model_dir):
    template = resolve('template', 'Template', model_id_or_tokenizer=str(tiny_model_dir))
    conversations = [('repeat 3', '3'), ('repeat 7 please', '7 7'), ('hi', 'hello there')]
    return [
        template.encode({'messages': [{'role': 'user', 'content': q}, {'role': 'assistant', 'content': a}]})
        for q, a in conversations
    ]


def random_head(model: TransformersValueModel) -> TransformersValueModel:
    """A new head starts at zero (every value 0); random weights make the comparisons below mean something."""
    assert float(model.model.score.weight.abs().sum()) == 0.0
    torch.nn.init.normal_(model.model.score.weight, generator=torch.Generator().manual_seed(0))
    return model


def test_scores_are_the_heads_pooled_output_and_values_are_aligned_like_logprobs(tiny_model_dir, rows):
    model = random_head(TransformersValueModel(model_id=tiny_model_dir))
    out = model.forward_only(inputs=rows, compute_loss=False)
    assert set(out) == {'values', 'scores'} and [len(v) for v in out['values']] == [len(r['input_ids']) for r in rows]
    hf = model.model  # transformers' *ForSequenceClassification: pools the head at each row's last token
    with torch.no_grad():
        for row, score, values in zip(rows, out['scores'], out['values']):
            ids = torch.tensor([row['input_ids']])
            assert score == pytest.approx(float(hf(input_ids=ids).logits[0, 0]), abs=1e-5)
            hidden = getattr(hf, hf.base_model_prefix)(input_ids=ids).last_hidden_state
            per_position = hf.score(hidden)[0, :, 0].tolist()  # the head after tokens 0..t
            assert values[0] == 0.0 and values[1:] == pytest.approx(per_position[:-1], abs=1e-5)
            assert score == pytest.approx(per_position[-1], abs=1e-5)


def test_padded_and_packed_batches_give_the_same_values(tiny_model_dir, rows):
    padded = random_head(TransformersValueModel(model_id=tiny_model_dir))
    packed = TransformersValueModel(model_id=tiny_model_dir)
    packed.set_processor('CausalLMProcessor', padding_free=True)
    packed.model.load_state_dict(padded.model.state_dict())  # the same new head
    a, b = (m.forward_only(inputs=rows, compute_loss=False) for m in (padded, packed))
    assert a['scores'] == pytest.approx(b['scores'], abs=1e-5)
    for x, y in zip(a['values'], b['values']):
        assert x == pytest.approx(y, abs=1e-5)


def parity_rows(rng: random.Random, template, n: int) -> list[dict]:
    """Toy value task: the return of each answer token is 1 when the token before it has an even id, else 0 --
    what the state before the token shows, so a critic can learn it exactly."""
    out = []
    for _ in range(n):
        row = template.encode(
            {
                'messages': [
                    {'role': 'user', 'content': f'count {rng.randint(0, 99)}'},
                    {'role': 'assistant', 'content': ' '.join(str(rng.randint(0, 9)) for _ in range(6))},
                ]
            }
        )
        ids = row['input_ids']
        row['returns'] = [0.0] + [float(ids[i - 1] % 2 == 0) for i in range(1, len(ids))]
        out.append(row)
    return out


def test_a_lora_critic_learns_a_toy_value_function_and_saves_its_head(tiny_model_dir, tmp_path):
    critic = TransformersValueModel(model_id=tiny_model_dir)
    torch.manual_seed(0)  # the LoRA weights' init
    critic.add_adapter_to_model('critic', {'r': 8, 'lora_alpha': 16})
    trainable = [n for n, p in critic.model.named_parameters() if p.requires_grad]
    assert any('score' in n for n in trainable) and any('lora_' in n for n in trainable)
    critic.set_loss('PPOValueLoss', clip_range=None)
    critic.set_optimizer('AdamW', lr=3e-3)
    template = resolve('template', 'Template', model_id_or_tokenizer=critic.tokenizer)
    rng = random.Random(0)
    held_out = parity_rows(random.Random(99), template, 16)
    before = critic.forward_only(inputs=held_out)['metrics']
    for _ in range(40):
        critic.forward_backward(inputs=parity_rows(rng, template, 16))
        critic.clip_grad_and_step(max_norm=1.0)
    after = critic.forward_only(inputs=held_out)['metrics']
    assert before['explained_variance'] < 0.1 and after['explained_variance'] > 0.8, (before, after)
    assert after['value_loss'] < 0.25 * before['value_loss'], (before, after)

    saved = critic.save('critic', output_dir=str(tmp_path))
    reloaded = TransformersValueModel(model_id=tiny_model_dir)
    reloaded.load(saved)
    assert reloaded.forward_only(inputs=held_out, compute_loss=False)['scores'] == pytest.approx(
        critic.forward_only(inputs=held_out, compute_loss=False)['scores'], abs=1e-5
    )


def test_a_value_model_refuses_a_loss_that_reads_log_probs(tiny_model_dir, rows):
    model = TransformersValueModel(model_id=tiny_model_dir)
    model.set_loss('CrossEntropyLoss')
    with pytest.raises(InvalidInputError, match='CrossEntropyLoss reads log-probs.*PPOValueLoss'):
        model.forward_backward(inputs=rows)
    # and a causal LM has no value head for PPOValueLoss
    policy = TransformersModel(model_id=tiny_model_dir)
    policy.set_loss('PPOValueLoss')
    with pytest.raises(InvalidInputError, match="outputs\\['values'\\] is missing.*value model"):
        policy.forward_backward(inputs=[{**r, 'returns': [0.0] * len(r['input_ids'])} for r in rows])


def test_ppo_rows_align_the_critics_values_with_the_returns(tiny_model_dir, rows):
    """`critic_values` -> `GAEAdvantage` -> `with_gae` -> `PPOValueLoss`: the loss the critic computes equals
    0.5 * mean((V - R)^2) over the completion tokens, computed here from the per-token lists (an off-by-one in any
    of the alignments breaks it)."""
    from twinkle_core.advantage import GAEAdvantage
    from twinkle_core.rl.ppo import critic_values, with_gae

    critic = random_head(TransformersValueModel(model_id=tiny_model_dir))
    critic.set_loss('PPOValueLoss', clip_range=None)
    starts = [next(i for i, label in enumerate(r['labels']) if label != -100) for r in rows]  # the answer's start
    train_rows = [
        {'input_ids': r['input_ids'], 'labels': [-100] * n + r['input_ids'][n:]} for r, n in zip(rows, starts)
    ]
    values = critic_values(critic, train_rows, batch_size=2)
    full = critic.forward_only(inputs=rows, compute_loss=False)['values']
    assert values == [v[n:] for v, n in zip(full, starts)]
    advantages = GAEAdvantage(gamma=1.0, lam=0.9)([1.0, 0.0, 0.5], values=values)
    critic_rows = with_gae(train_rows, advantages, values)
    assert [len(r['advantages']) for r in train_rows] == [len(r['input_ids']) for r in rows]
    squared = [(v - r) ** 2 for vs, rs in zip(values, advantages.returns) for v, r in zip(vs, rs)]
    loss = critic.forward_backward(inputs=critic_rows)['metrics']['value_loss']
    assert loss == pytest.approx(0.5 * sum(squared) / len(squared), rel=1e-5)
    with pytest.raises(InvalidInputError, match='no returns'):
        with_gae(train_rows, [list(a) for a in advantages], values)
    with pytest.raises(InvalidInputError, match='trained tokens'):
        with_gae(train_rows, advantages, [v[1:] for v in values])


def test_gradient_checkpointing_gives_the_same_loss_and_gradients(tiny_model_dir, rows):
    returns = [{**r, 'returns': [float(i % 2) for i in range(len(r['input_ids']))]} for r in rows]
    grads = []
    for checkpointing in (False, True):
        model = TransformersValueModel(
            model_id=tiny_model_dir, head_init='normal', gradient_checkpointing=checkpointing
        )
        assert bool(model.checkpointed_layers) == checkpointing
        model.set_loss('PPOValueLoss', clip_range=None)
        loss = model.forward_backward(inputs=returns)['loss']
        grads.append((loss, [p.grad.clone() for p in model.model.parameters() if p.grad is not None]))
    (loss_a, grads_a), (loss_b, grads_b) = grads
    assert loss_a == pytest.approx(loss_b, abs=1e-6) and len(grads_a) == len(grads_b) > 0
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(grads_a, grads_b))
