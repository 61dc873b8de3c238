"""A tenant's forward_backward above the model's pass cap (`max_pass_tokens`, 16384 tokens by default) is run by
the server in several passes with the result of one: through the tinker SDK, one call of 18 long rows trains the
adapter exactly as the same rows in two calls under the cap (cross_entropy is a sum: the gradients add up)."""

from __future__ import annotations

import random

import numpy as np
import tinker
from server_names import MODEL
from tinker import types

ROWS, ROW_TOKENS = 18, 1000  # 18k tokens in one call: above the default cap, so the server splits it
TOLERANCE = 1e-4  # float32 gradients summed in another order, then one Adam step


def _datums(vocab: int) -> list[types.Datum]:
    rng = random.Random(0)
    out = []
    for _ in range(ROWS):
        tokens = [rng.randrange(10, vocab) for _ in range(ROW_TOKENS + 1)]
        weights = [0.0] * 10 + [1.0] * (ROW_TOKENS - 10)
        out.append(
            types.Datum(
                model_input=types.ModelInput.from_ints(tokens[:-1]),
                loss_fn_inputs={'target_tokens': tokens[1:], 'weights': weights},
            )
        )
    return out


def _trained(client: tinker.ServiceClient, calls: list[list[types.Datum]], probe: list[types.Datum]):
    tc = client.create_lora_training_client(base_model=MODEL, rank=4, seed=5)
    outputs = []
    for data in calls:
        outputs += tc.forward_backward(data, 'cross_entropy').result().loss_fn_outputs
    tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    after = tc.forward(probe, 'cross_entropy').result().loss_fn_outputs
    return [o['logprobs'].to_numpy() for o in outputs], [o['logprobs'].to_numpy() for o in after]


def test_one_call_above_the_pass_cap_trains_like_the_same_rows_in_smaller_calls(service_client, tokenizer):
    data = _datums(len(tokenizer))
    probe = data[:2]
    whole_outputs, whole_after = _trained(service_client, [data], probe)
    halves_outputs, halves_after = _trained(service_client, [data[: ROWS // 2], data[ROWS // 2 :]], probe)

    assert len(whole_outputs) == ROWS  # every row's log-probs come back, in order
    for a, b in zip(whole_outputs, halves_outputs):
        np.testing.assert_allclose(a, b, atol=TOLERANCE)
    for a, b in zip(whole_after, halves_after):  # the same update: equal log-probs after the step
        np.testing.assert_allclose(a, b, atol=TOLERANCE)
    assert not np.allclose(whole_after[0], whole_outputs[0], atol=1e-3)  # and the step changed the model
