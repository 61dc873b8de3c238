"""The training service deployed on Ray (`deployment.mode: ray`) on a simulated two-node cluster.

The scenario (tests/ray/server_on_ray_scenario.py) runs in its own process because it owns a Ray cluster; this
test checks what it measured: the Ray deployment gives the one-process server's results, model 'tiny-b' runs on
the second node, and killing a training actor is survived.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCENARIO = Path(__file__).with_name('server_on_ray_scenario.py')

pytestmark = pytest.mark.slow


@pytest.fixture(scope='module')
def results(tmp_path_factory, tiny_model_dir) -> dict:
    pytest.importorskip('ray')
    pytest.importorskip('tinker')
    work = tmp_path_factory.mktemp('server-on-ray')
    done = subprocess.run(
        [sys.executable, str(SCENARIO), str(tiny_model_dir), str(work)], capture_output=True, text=True, timeout=1200
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return json.loads((work / 'results.json').read_text())


def test_ray_deployment_equals_the_one_process_server(results) -> None:
    # the same seed and data on two base models trained at once give the same run (their adapter inits used
    # to race on torch's global RNG in the one-process server)
    assert results['embedded']['tiny-a']['losses'] == results['embedded']['tiny-b']['losses']
    for model in ('tiny-a', 'tiny-b'):
        local, ray = results['embedded'][model], results['ray'][model]
        assert ray['losses'] == pytest.approx(local['losses'], rel=1e-5, abs=1e-5), model
        assert ray['losses'][-1] < ray['losses'][0]
        assert ray['samples'] == local['samples'], model  # greedy, from the saved adapter, via the replicas


def test_the_console_shows_the_ray_deployment(results) -> None:
    """The web console over the Ray deployment: the tenant's two runs with their curves (one loss point per
    step), the playground samples from a saved checkpoint through the replicas, the operator sees both models."""
    console = results['console']
    assert sorted(r['base_model'] for r in console['runs']) == ['tiny-a', 'tiny-b']
    assert [r['last_step'] for r in console['runs']] == [3, 3]
    assert sorted(console['loss_points'].values()) == [3, 3]
    assert console['sample_status'] == 200 and console['sample_tokens'] == 4
    assert console['operator_status'] == 200 and {'tiny-a', 'tiny-b'} <= set(console['operator_models'])


def test_models_are_placed_as_configured(results) -> None:
    head = results['nodes']['head']
    assert len(results['nodes']['all']) == 2
    b = results['placement']['tiny-b']
    assert set(b) == {'tiny-b/train', 'tiny-b/sampler-0'} and all(node != head for node in b.values())
    assert set(results['placement']['tiny-a']) == {'tiny-a/train', 'tiny-a/sampler-0', 'tiny-a/sampler-1'}
    assert results['training_ranks'] == {'tiny-a': 2, 'tiny-b': 1}  # tiny-a: the multi-tenant backend on 2 dp ranks


def test_a_killed_training_actor_is_survived(results) -> None:
    """One of tiny-a's two training ranks is killed: the next request fails clearly, the group restarts with the
    adapter restored from its last checkpoint, and training goes on (tiny-b meanwhile)."""
    fault = results['fault']
    assert fault['failure'] and 'training workers died' in fault['failure'], fault['failure']
    assert 'restored from its last saved checkpoint' in fault['failure']
    assert fault['restarts'] == 1
    assert fault['max_logprob_diff_after_restore'] < 1e-5  # the adapter is back at its checkpoint
    assert fault['loss_after_restart'] > 0
    assert fault['other_model_losses'] is not None and len(fault['other_model_losses']) == 3


@pytest.mark.parametrize(
    'backends, flag',
    [(('TransformersModel', 'MultiLoraTransformersModel'), '--dp'), (('MegatronModel',), '--megatron-tp')],
)
def test_a_training_group_of_two_ranks_equals_one_rank(tmp_path, tiny_model_dir, backends, flag) -> None:
    """train_group.ranks=2 with a dp=2 mesh (TransformersModel and the multi-tenant MultiLoraTransformersModel, two
    adapters mixed in each call: each rank trains its slice of every batch) or a tp=2 mesh (MegatronModel, two
    adapters mixed in each call's pipeline schedule: the ranks split every layer): losses and per-row log-probs
    (gathered from the data ranks in order) equal one rank's (the same model host in the scenario's process),
    1e-5."""
    pytest.importorskip('ray')
    if backends == ('MegatronModel',):
        pytest.importorskip('twinkle_megatron')
    done = subprocess.run(
        [sys.executable, str(SCENARIO), str(tiny_model_dir), str(tmp_path), flag],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    for backend in backends:
        runs = json.loads((tmp_path / f'{backend}.json').read_text())
        assert [s['adapter'] for s in runs['2']] == [s['adapter'] for s in runs['1']]
        assert {s['adapter'] for s in runs['1']} == ({'a'} if backend == 'TransformersModel' else {'a', 'b'})
        for one, two in zip(runs['1'], runs['2']):
            assert two['loss'] == pytest.approx(one['loss'], rel=1e-5)
            assert [len(r) for r in two['logprobs']] == [len(r) for r in one['logprobs']]
            for a, b in zip(one['logprobs'], two['logprobs']):
                assert b == pytest.approx(a, abs=1e-5)
        first, last = (next(s['loss'] for s in steps if s['adapter'] == 'a') for steps in (runs['1'], runs['1'][::-1]))
        assert last < first
