"""Conversion of the other supported families, each a tiny random checkpoint written by transformers itself:
Qwen2 (q/k/v biases, untied output layer), Llama (plain GQA, untied) and Qwen3-MoE (routed experts; expert
parallelism). Each trains like TransformersModel (tolerances as in test_equality.py) and its checkpoint loads
back in transformers."""

from __future__ import annotations

import pytest
from test_equality import assert_same_logprobs, assert_same_run

COMMON = dict(
    vocab_size=1185,
    hidden_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=256,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
)


@pytest.fixture(scope='session')
def arch_runs(tmp_path_factory, megatron_runner):
    """`run(family, nproc, *args)`: the worker's result on a tiny random checkpoint of `family` (cached)."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3MoeConfig

    configs = {
        'qwen2': lambda: Qwen2Config(**COMMON),
        'llama': lambda: LlamaConfig(**COMMON),
        'qwen3_moe': lambda: Qwen3MoeConfig(
            **COMMON, head_dim=32, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, norm_topk_prob=True
        ),
    }
    dirs: dict[str, object] = {}

    def run(family: str, nproc: int, *args) -> dict:
        if family not in dirs:
            torch.manual_seed(0)
            dirs[family] = tmp_path_factory.mktemp(family)
            AutoModelForCausalLM.from_config(configs[family]()).save_pretrained(dirs[family])
        return megatron_runner(dirs[family], nproc, *args)

    return run


def hf_logprobs(checkpoint: str, rows: list[dict]) -> list[list[float]]:
    """Per-row log-probs of a checkpoint loaded with plain `AutoModelForCausalLM.from_pretrained`."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    out = []
    for row in rows:
        ids = row['input_ids']
        with torch.no_grad():
            lp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), -1)
        out.append([0.0] + [float(lp[i, ids[i + 1]]) for i in range(len(ids) - 1)])
    return out


@pytest.mark.parametrize(
    'family,nproc,args',
    [
        ('qwen2', 1, ()),
        ('llama', 2, ('--tp', 2)),
        ('qwen3_moe', 1, ()),
        ('qwen3_moe', 2, ('--tp', 2, '--sp')),
        ('qwen3_moe', 2, ('--ep', 2, '--distributed-optimizer')),
        ('qwen3_moe', 2, ('--pp', 2)),
    ],
    ids=['qwen2', 'llama-tp2', 'qwen3_moe', 'qwen3_moe-tp2-sp', 'qwen3_moe-ep2-distributed-optimizer', 'qwen3_moe-pp2'],
)
def test_family_trains_like_transformers_and_saves_hf_weights(arch_runs, family, nproc, args) -> None:
    result = arch_runs(family, nproc, *args)
    assert_same_run(result, arch_runs(family, 1, '--backend', 'TransformersModel'))
    assert_same_logprobs(hf_logprobs(result['checkpoint'], result['eval_rows']), result['after']['logprobs'])


@pytest.mark.slow
def test_moe_with_expert_parallelism_resumes_exactly(arch_runs) -> None:
    result = arch_runs('qwen3_moe', 2, '--ep', 2, '--resume-after', 2)
    assert result['resumed_losses'] == result['losses'][2:]
    assert result['resumed_after']['logprobs'] == result['after']['logprobs']
