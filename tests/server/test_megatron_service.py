"""The service with `MegatronModel` as its training backend, through the unmodified tinker SDK: several tenants'
requests queued together are served by ONE engine call -- the model host calls a backend that declares
`ModelCapabilities.mixed_adapters` once for all of them, and Megatron runs their adapters in one pipeline schedule
(`twinkle_megatron.mixed_step`) -- and each tenant gets what it gets alone; an optimizer the backend does not build
is a clear user error."""

from __future__ import annotations

import math
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import tinker
from server_names import MODEL, backend_server
from test_operations import _get, _scrape
from tinker import types

ADAM = types.AdamParams(learning_rate=5e-3)


@pytest.fixture(scope='module')
def megatron_server(tmp_path_factory, tiny_model_dir):
    """A server whose training backend is `MegatronModel` (it builds Megatron's AdamW/Adam/SGD only)."""
    pytest.importorskip('twinkle_megatron')
    with backend_server(tiny_model_dir, tmp_path_factory.mktemp('megatron'), 'MegatronModel', 'meg') as served:
        yield served


def test_dimuon_on_a_backend_without_it_is_a_user_error(megatron_server, sft_data):
    url, key = megatron_server
    client = tinker.ServiceClient(base_url=url, api_key=key)
    with pytest.raises((tinker.APIStatusError, tinker.RequestFailedError), match='not available on the backend'):
        client.create_lora_training_client(
            base_model=MODEL, rank=4, seed=1, optimizer=types.DimuonOptimizerConfig()
        ).result(timeout=120)
    tc = client.create_lora_training_client(base_model=MODEL, rank=4, seed=1).result()  # AdamW still works there
    assert math.isfinite(_ce_step(tc, sft_data, ADAM))


def _ce_step(tc, data, params) -> float:
    loss = tc.forward_backward(data, 'cross_entropy').result().metrics['loss:sum']
    tc.optim_step(params).result()
    return loss


def test_tenants_queued_together_train_in_one_engine_call_with_their_solo_results(megatron_server, sft_data):
    url, key = megatron_server
    client = tinker.ServiceClient(base_url=url, api_key=key)
    alice, bob, holder = (
        client.create_lora_training_client(base_model=MODEL, rank=rank, seed=seed).result()
        for rank, seed in ((4, 31), (8, 32), (2, 33))
    )
    for tc in (alice, bob):  # make the adapters differ
        _ce_step(tc, sft_data, ADAM)
    solo = [tc.forward(sft_data, 'cross_entropy').result().metrics['loss:sum'] for tc in (alice, bob)]
    before, _ = _scrape(url)
    rounds = 2
    for _ in range(rounds):
        # a long request holds the worker while alice's and bob's requests queue behind it
        busy = holder.forward(sft_data * 100, 'cross_entropy')  # 400 rows: ~2 s
        _wait_until_running(url)  # (queued with it, they would join its engine call)
        with ThreadPoolExecutor(2) as pool:
            futures = [pool.submit(tc.forward_backward, sft_data, 'cross_entropy') for tc in (alice, bob)]
            pending = [f.result() for f in futures]  # both accepted (queued) while the holder runs
        busy.result()
        losses = [p.result().metrics['loss:sum'] for p in pending]
        assert losses == pytest.approx(solo, rel=1e-5)  # a mixed call gives each tenant its solo result
    # the scheduler counts an engine call once its requests are answered: wait for the last round's count
    deadline = time.monotonic() + 30
    while True:
        after, _ = _scrape(url)
        items, calls = (
            _get(after, name, **labels) - _get(before, name, **labels)
            for name, labels in (
                ('twinkle_work_items_total', {'model': MODEL, 'op': 'forward_backward', 'outcome': 'done'}),
                ('twinkle_engine_call_seconds_count', {'model': MODEL, 'op': 'forward_backward'}),
            )
        )
        if items >= 2 * rounds or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert items == calls * 2 == 2 * rounds  # alice's and bob's requests shared each engine call
    # and they keep training independently afterwards (the mixed calls left no gradients behind)
    assert all(math.isfinite(_ce_step(tc, sft_data, ADAM)) for tc in (alice, bob))


def _wait_until_running(url: str, timeout: float = 60) -> None:
    """Until the model's engine call is running (`/metrics`: twinkle_running_work)."""
    deadline = time.monotonic() + timeout
    while _get(_scrape(url)[0], 'twinkle_running_work', model=MODEL) < 1:
        assert time.monotonic() < deadline, 'the holding request never started'
        time.sleep(0.02)
