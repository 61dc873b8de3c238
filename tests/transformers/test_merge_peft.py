"""`twinkle_core.weight_sync.weights.merge_peft` (name-based merging over exported buckets) equals PEFT's own
`merge_and_unload` -- linear and embedding LoRA, rank/alpha patterns, rsLoRA -- and refuses adapters that do not
fit the base."""

from __future__ import annotations

import pytest
import torch

from twinkle_core.errors import InvalidInputError
from twinkle_core.weight_sync.weights import bucketed, merge_peft
from twinkle_transformers.export import ModuleWeights


@pytest.mark.parametrize(
    'extra',
    [
        {},
        {'use_rslora': True},
        {'rank_pattern': {'v_proj': 2}, 'alpha_pattern': {'layers.0.self_attn.q_proj': 3.0}},
    ],
)
def test_merged_buckets_equal_peft_merge_and_unload(tiny_model_dir, extra):
    import peft
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    config = peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=['q_proj', 'v_proj', 'embed_tokens'], init_lora_weights=False, **extra
    )
    torch.manual_seed(0)
    model = peft.get_peft_model(base, config)
    weights = ModuleWeights(model)
    adapter_config, lora = weights.export_adapter('default', bucket_bytes=4096)
    tensors = {n: t for bucket in lora for n, t in bucket}
    merged = {
        n: t
        for bucket in merge_peft(weights.export_base(bucket_bytes=1 << 16), adapter_config, tensors)
        for n, t in bucket
    }
    original = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).state_dict()
    reference = model.merge_and_unload().state_dict()
    assert merged.keys() == reference.keys()
    changed = {n for n in merged if not torch.equal(merged[n], original[n])}
    assert {'model.embed_tokens.weight', 'model.layers.0.self_attn.v_proj.weight'} <= changed
    for name, tensor in merged.items():
        torch.testing.assert_close(tensor, reference[name], atol=1e-5, rtol=1e-5)


def test_an_adapter_for_weights_the_base_lacks_is_refused():
    base = [[('model.layers.0.mlp.up_proj.weight', torch.zeros(4, 3))]]
    adapter = {
        'base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight': torch.ones(2, 3),
        'base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight': torch.ones(4, 2),
    }
    with pytest.raises(InvalidInputError, match='which the base weights do not contain'):
        list(merge_peft(base, {'r': 2, 'lora_alpha': 2}, adapter))
    with pytest.raises(InvalidInputError, match='no matching'):
        list(merge_peft(base, {'r': 2}, {k: v for k, v in adapter.items() if 'lora_A' in k}))


def test_bucketed_keeps_order_and_the_byte_bound():
    pairs = [(f't{i}', torch.zeros(i + 1)) for i in range(6)]  # 4..24 bytes
    buckets = list(bucketed(pairs, bucket_bytes=24))
    assert [n for b in buckets for n, _ in b] == [n for n, _ in pairs]
    assert all(sum(t.numel() * 4 for _, t in b) <= 24 or len(b) == 1 for b in buckets)
