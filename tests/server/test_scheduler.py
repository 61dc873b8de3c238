"""Scheduling: seq_id order per model, round-robin fairness across tenants, mixed-tenant passes.

The ordering/fairness tests drive `ModelWorker` with an engine that records what it is asked to run (the
scheduler is the unit under test); the mixed-pass test uses the real server and engine.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from server_names import MODEL
from tinker import types

from twinkle_server.engine.model_host.base import TrainBatch, TrainResult
from twinkle_server.engine.scheduler import ModelWorker, Work


class RecordingEngine:
    """Records calls; `forward_backward` returns one result per batch (the scheduler's contract)."""

    base_model = 'recording'

    def __init__(self) -> None:
        self.log: list[object] = []
        self.gate = threading.Event()

    def forward_backward(self, batches):
        self.log.append(tuple(b.adapter for b in batches))
        return [TrainResult(0.0, []) for _ in batches]


def _run(worker: ModelWorker, tenant: str, label: str, done: list, **kw) -> None:
    finished = threading.Event()
    worker.submit(
        Work(
            tenant,
            on_done=lambda r: (done.append(label), finished.set()),
            on_error=lambda e: (done.append(f'{label}!{e}'), finished.set()),
            **kw,
        )
    )


def _hold(worker: ModelWorker, engine: RecordingEngine) -> None:
    """Occupy the worker until `engine.gate` is set, so the queue fills up."""
    worker.submit(Work('holder', on_done=lambda r: None, on_error=lambda e: None, call=lambda e: engine.gate.wait()))


def _drain(worker: ModelWorker, done: list, n: int) -> None:
    import time

    deadline = time.monotonic() + 10
    while len(done) < n and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(done) == n, done


def test_seq_ids_run_in_order_whatever_the_arrival_order():
    engine, done = RecordingEngine(), []
    worker = ModelWorker(engine)
    worker.start_sequence('m', 1)
    for seq in (3, 1, 4, 2):
        _run(worker, 't', f'seq{seq}', done, model_id='m', seq_id=seq, call=lambda e: None)
    _drain(worker, done, 4)
    assert done == ['seq1', 'seq2', 'seq3', 'seq4']
    worker.skip('m', 5)
    _run(worker, 't', 'seq6', done, model_id='m', seq_id=6, call=lambda e: None)
    _drain(worker, done, 5)
    with pytest.raises(Exception, match='already used'):
        _run(worker, 't', 'again', done, model_id='m', seq_id=2, call=lambda e: None)
    worker.stop()


def test_round_robin_does_not_starve_a_tenant():
    engine, done = RecordingEngine(), []
    worker = ModelWorker(engine)
    _hold(worker, engine)
    for i in range(5):
        _run(worker, 'busy', f'busy{i}', done, call=lambda e: None)
    _run(worker, 'quiet', 'quiet0', done, call=lambda e: None)
    engine.gate.set()
    _drain(worker, done, 6)
    assert done.index('quiet0') <= 1, done  # served right after the first of the busy tenant's queue
    worker.stop()


def test_compatible_forward_backwards_of_several_tenants_share_one_pass():
    engine, done = RecordingEngine(), []
    worker = ModelWorker(engine)
    _hold(worker, engine)
    for tenant, adapter in (('a', 'a1'), ('b', 'b1'), ('c', 'c1')):
        _run(worker, tenant, adapter, done, train=TrainBatch(adapter, [], 'CrossEntropyLoss'))
    _run(worker, 'a', 'a-call', done, call=lambda e: None)
    engine.gate.set()
    _drain(worker, done, 4)
    assert engine.log[0] == ('a1', 'b1', 'c1')
    assert worker.stats['mixed_train_passes'] == 1 and worker.stats['max_adapters_per_pass'] == 3
    worker.stop()


def test_concurrent_tenants_mix_on_the_real_engine_with_solo_results(server, alice, bob, sft_data):
    import tinker

    clients = [
        tinker.ServiceClient(base_url=server.base_url, api_key=k)
        .create_lora_training_client(base_model=MODEL, rank=4, seed=s)
        .result()
        for k, s in ((alice, 21), (bob, 22))
    ]
    for tc in clients:  # make the two adapters differ
        tc.forward_backward(sft_data, 'cross_entropy').result()
        tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    solo = [tc.forward(sft_data, 'cross_entropy').result().metrics['loss:sum'] for tc in clients]
    worker = server.service.workers[MODEL]
    before = worker.stats['mixed_train_passes']
    for _ in range(2):
        gate = threading.Event()  # hold the worker so both tenants' requests are queued together
        worker.submit(
            Work('holder', on_done=lambda r: None, on_error=lambda e: None, call=lambda e, gate=gate: gate.wait())
        )
        with ThreadPoolExecutor(2) as pool:
            futures = [pool.submit(lambda tc: tc.forward(sft_data, 'cross_entropy').result(), tc) for tc in clients]
            _wait_for(lambda: worker.queued() >= 2)
            gate.set()
            losses = [f.result().metrics['loss:sum'] for f in futures]
        assert losses == pytest.approx(solo, rel=1e-4)  # a mixed pass gives each tenant its solo result
    assert worker.stats['mixed_train_passes'] >= before + 2


def _wait_for(cond, timeout: float = 60.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, 'timed out'
        time.sleep(0.02)
