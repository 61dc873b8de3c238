"""The training service on a simulated two-node Ray cluster, driven by the unmodified tinker SDK.

Run by tests/ray/test_server_on_ray.py in a process of its own (it owns the Ray cluster):

    python tests/ray/server_on_ray_scenario.py MODEL_DIR WORK_DIR        # writes WORK_DIR/results.json
    python tests/ray/server_on_ray_scenario.py MODEL_DIR WORK_DIR --dp   # writes WORK_DIR/dp.json

1. A one-process (embedded) server trains two base models concurrently: the baseline.
2. A Ray-mode server, started from a config file, serves the same two models from a two-node cluster
   (`ray.cluster_utils.Cluster`: a head node and a second node offering the custom resource ``node_b``; model
   'tiny-b' is pinned there): the same workload, concurrently on both models, sampling through model 'tiny-a''s
   two sampler replicas. 'tiny-a' trains on 2 data ranks (the multi-tenant backend, data-parallel).
3. Fault: one of the 2 training actors of 'tiny-a' is killed between two requests; the next request fails with
   the server's error, the adapter comes back from its last checkpoint, training goes on; 'tiny-b' trains
   meanwhile.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from pathlib import Path

STEPS = 3
MODELS = ('tiny-a', 'tiny-b')
PAIRS = [
    ('Who are you?', 'I am twinkle, a small model.'),
    ('What is 2+3?', 'The answer is 5.'),
    ('Name a color.', 'Blue is a color.'),
    ('Say hello.', 'Hello there, friend.'),
]


def sft_data(tokenizer):
    from tinker import types

    out = []
    for q, a in PAIRS:
        prompt, answer = tokenizer.encode(f'User: {q}\nAssistant:'), tokenizer.encode(f' {a}')
        tokens = prompt + answer
        weights = [0.0] * (len(prompt) - 1) + [1.0] * len(answer)
        out.append(
            types.Datum(
                model_input=types.ModelInput.from_ints(tokens[:-1]),
                loss_fn_inputs={'target_tokens': tokens[1:], 'weights': weights},
            )
        )
    return out


def workload(service_client, base_model: str, data, prompt) -> dict:
    """Train STEPS steps, save, sample greedily (4 prompts' worth) from the saved weights."""
    from tinker import types

    tc = service_client.create_lora_training_client(base_model=base_model, rank=4, seed=0).result()
    losses = []
    for _ in range(STEPS):
        fwd = tc.forward_backward(data, 'cross_entropy')
        tc.optim_step(types.AdamParams(learning_rate=5e-3)).result()
        losses.append(fwd.result().metrics['loss:sum'])
    state = tc.save_state('after-steps').result().path
    sampler = tc.save_weights_and_get_sampling_client('for-sampling').result()
    params = types.SamplingParams(max_tokens=6, temperature=0.0)
    futures = [sampler.sample(types.ModelInput.from_ints(prompt[:n]), 1, params) for n in (3, 4, 5, 6)]
    samples = [f.result().sequences[0].tokens for f in futures]
    return {'losses': losses, 'samples': samples, 'state': state, 'model_id': tc.model_id}


def run_both(service_client, data, prompt) -> dict:
    """The workload on both models at once (two threads), as two users would."""
    results: dict = {}

    def one(name: str) -> None:
        results[name] = workload(service_client, name, data, prompt)

    threads = [threading.Thread(target=one, args=(name,)) for name in MODELS]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def fault(service_client, data, engine_a, baseline_state: str) -> dict:
    """Kill tiny-a's training actor; see the next request fail clearly and the adapter come back."""
    import ray
    from tinker import types

    out: dict = {}
    tc = service_client.create_training_client_from_state_with_optimizer(baseline_state).result()
    before = [o['logprobs'].tolist() for o in tc.forward(data, 'cross_entropy').result().loss_fn_outputs]
    restarts_before = engine_a.training.restarts

    b_losses: list = []
    b_done = threading.Event()

    def train_b() -> None:  # the other model keeps serving while tiny-a restarts
        tb = service_client.create_lora_training_client(base_model='tiny-b', rank=4, seed=1).result()
        for _ in range(STEPS):
            fwd = tb.forward_backward(data, 'cross_entropy')
            tb.optim_step(types.AdamParams(learning_rate=5e-3)).result()
            b_losses.append(fwd.result().metrics['loss:sum'])
        b_done.set()

    other = threading.Thread(target=train_b)
    other.start()
    ray.kill(engine_a.training.actors[0], no_restart=True)
    try:
        tc.forward_backward(data, 'cross_entropy').result()
        out['failure'] = None
    except Exception as exc:  # noqa: BLE001 - the SDK's RequestFailedError
        out['failure'] = f'{type(exc).__name__}: {exc}'
    after = [o['logprobs'].tolist() for o in tc.forward(data, 'cross_entropy').result().loss_fn_outputs]
    out['max_logprob_diff_after_restore'] = max(abs(x - y) for a, b in zip(before, after) for x, y in zip(a, b))
    fwd = tc.forward_backward(data, 'cross_entropy')
    tc.optim_step(types.AdamParams(learning_rate=5e-3)).result()
    out['loss_after_restart'] = fwd.result().metrics['loss:sum']
    other.join(timeout=600)
    out['other_model_losses'] = b_losses if b_done.is_set() else None
    out['restarts'] = engine_a.training.restarts - restarts_before
    return out


def console(base_url: str, api_key: str, admin_key: str) -> dict:
    """What the web console shows on the Ray deployment: sign in as the tenant and as an operator (the browser's
    form posts, cookies and CSRF tokens, over HTTP), list runs and curves, sample in the playground from a sampler
    checkpoint (served by the deployment's replicas), read the operator page's data."""
    import re

    import httpx

    def sign_in(key: str) -> tuple[httpx.Client, str]:
        http = httpx.Client(base_url=base_url, timeout=120)
        form = http.get('/console').text
        token = re.search(r'name="csrf_token" value="([^"]+)"', form).group(1)
        home = http.post('/console/login', data={'api_key': key, 'csrf_token': token}, follow_redirects=True).text
        return http, re.search(r'<meta name="csrf-token" content="([^"]+)"', home).group(1)

    http, csrf = sign_in(api_key)
    runs = http.get('/console/api/runs').json()['runs']
    curves = {r['id']: http.get(f'/console/api/runs/{r["id"]}/metrics').json() for r in runs}
    choices = http.get('/console/api/checkpoints').json()['checkpoints']
    saved = next(c['path'] for c in choices if '://' in c['path'])  # a saved checkpoint (not a base model)
    sampled = http.post(
        '/console/api/sample',
        json={'model_path': saved, 'prompt': 'User: Who are you?', 'temperature': 0.0, 'max_tokens': 4},
        headers={'X-CSRF-Token': csrf},
    )
    admin, _ = sign_in(admin_key)
    operator = admin.get('/console/api/operator')
    return {
        'runs': [{k: r[k] for k in ('base_model', 'status', 'last_step')} for r in runs],
        'loss_points': {run_id: len(c['series'].get('loss:sum', [[], []])[0]) for run_id, c in curves.items()},
        'sampled_from': saved,
        'sample_status': sampled.status_code,
        'sample_tokens': len(sampled.json().get('tokens', [])) if sampled.status_code == 200 else sampled.text,
        'operator_status': operator.status_code,
        'operator_models': sorted(m['name'] for m in operator.json()['models']) if operator.status_code == 200 else [],
    }


def placement(engine) -> dict:
    """Node id of each actor of a RayModelHost's groups."""
    import ray

    def node(worker) -> str:
        return ray.get_runtime_context().get_node_id()

    return {g.name: ray.get(g.actors[0].run.remote(node)) for g in (engine.training, *engine.replicas)}


def write_config(path: Path, model_dir: str, data_dir: Path, address: str, port: int) -> None:
    path.write_text(f"""
server: {{host: 127.0.0.1, port: {port}}}
storage: {{data_dir: {data_dir}}}
deployment:
  mode: ray
  ray: {{address: "{address}"}}
limits:
  default: {{max_adapters: 64, max_sessions: 64}}
models:
  - name: tiny-a
    path: {model_dir}
    train_group: {{ranks: 2}}
    sampler_replicas: 2
  - name: tiny-b
    path: {model_dir}
    train_group: {{resources: {{node_b: 1}}}}
    sampler_group: {{resources: {{node_b: 1}}}}
""")


def main(model_dir: str, work_dir: str) -> None:
    import ray
    import tinker
    from ray.cluster_utils import Cluster
    from transformers import AutoTokenizer

    from twinkle_server import ServerConfig, TenantLimits, start_in_thread
    from twinkle_server.config import load_server_config
    from twinkle_server.launch import free_port
    from twinkle_server.service.auth import create_api_key

    logging.getLogger('tinker').setLevel(logging.ERROR)
    work = Path(work_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    data = sft_data(tokenizer)
    prompt = tokenizer.encode('User: Who are you?\nAssistant:')
    results: dict = {}

    limits = TenantLimits().merged({'max_adapters': 64, 'max_sessions': 64})
    embedded = start_in_thread(
        ServerConfig(
            models={m: model_dir for m in MODELS},
            data_dir=str(work / 'embedded'),
            port=free_port(),
            default_limits=limits,
        )
    )
    client = tinker.ServiceClient(base_url=embedded.base_url, api_key=create_api_key(embedded.service.store, 'u'))
    results['embedded'] = run_both(client, data, prompt)
    embedded.stop()

    started = time.monotonic()
    cluster = Cluster(initialize_head=True, head_node_args={'num_cpus': 4, 'include_dashboard': False})
    cluster.add_node(num_cpus=4, resources={'node_b': 4})
    cluster.wait_for_nodes()
    config_path = work / 'server.yaml'
    write_config(config_path, model_dir, work / 'ray-data', cluster.address, free_port())
    running = start_in_thread(load_server_config(str(config_path)), timeout_s=600)
    results['ray_start_s'] = time.monotonic() - started
    engines = running.service.hosts
    results['placement'] = {name: placement(engines[name]) for name in MODELS}
    results['training_ranks'] = {name: len(engines[name].training.actors) for name in MODELS}
    results['nodes'] = {
        'head': ray.get_runtime_context().get_node_id(),
        'all': sorted(n['NodeID'] for n in ray.nodes() if n['Alive']),
    }
    key = create_api_key(running.service.store, 'u')
    client = tinker.ServiceClient(base_url=running.base_url, api_key=key)
    results['ray'] = run_both(client, data, prompt)
    admin_key = create_api_key(running.service.store, 'ops', admin=True)
    results['console'] = console(running.base_url, key, admin_key)
    results['fault'] = fault(client, data, engines['tiny-a'], results['ray']['tiny-a']['state'])
    running.stop()
    ray.shutdown()
    cluster.shutdown()
    (work / 'results.json').write_text(json.dumps(results, indent=1))


def main_dp(
    model_dir: str, work_dir: str, backends: tuple[str, ...] = ('TransformersModel',), axis: str = 'dp_size'
) -> None:
    """A training group of 2 ranks (each backend under a mesh of size 2 along `axis`: dp for TransformersModel and
    MultiLoraTransformersModel, tp for MegatronModel) against one rank (the same model host, in this process): the
    same losses and per-row log-probs over three steps. The multi-adapter backends (MultiLoraTransformersModel,
    MegatronModel) train two adapters in each call (one mixed call of both batches)."""
    from twinkle_server.config import GroupSpec, ModelSpec
    from twinkle_server.engine.model_host.base import AdamStep, LoraSpec, TrainBatch
    from twinkle_server.engine.model_host.local import LocalModelHost
    from twinkle_server.engine.ray_deploy import RayModelHost, connect, forwarded_env

    connect(num_cpus=4)
    rows = [
        {'input_ids': [5, 6, 7, 8, 9, 10 + i][: 4 + i % 3], 'labels': [-100, -100, 7, 8, 9, 10 + i][: 4 + i % 3]}
        for i in range(5)
    ]
    for row in rows:
        row['weights'] = [0.0, 0.0] + [1.0] * (len(row['input_ids']) - 2)
    for backend in backends:
        adapters = ('a',) if backend == 'TransformersModel' else ('a', 'b')  # single-tenant, or mixed calls
        runs: dict = {}
        for ranks in (1, 2):
            spec = ModelSpec(
                f'dp{ranks}', model_dir, backend=backend, train_group=GroupSpec(ranks=ranks), mesh={axis: ranks}
            )
            if ranks == 1:  # one rank: the same host, in this process (no actor)
                engine = LocalModelHost('dp1', model_dir, backend=backend, sampler=None)
            else:
                engine = RayModelHost(spec, model_dir, forwarded_env())
            for seed, adapter in enumerate(adapters):
                engine.add_adapter(adapter, LoraSpec(8, 16, ('all-linear',), seed=seed))
            steps = []
            for _ in range(3):
                batches = [
                    TrainBatch(adapter, rows[: 5 - i], 'CrossEntropyLoss', {'reduction': 'sum'})
                    for i, adapter in enumerate(adapters)
                ]
                for adapter, result in zip(adapters, engine.forward_backward(batches)):
                    if isinstance(result, BaseException):
                        raise result
                    engine.optim_step(adapter, AdamStep(learning_rate=1e-2))
                    steps.append({'adapter': adapter, 'loss': result.loss, 'logprobs': result.logprobs})
            runs[ranks] = steps
            if isinstance(engine, RayModelHost):
                engine.close()
        Path(work_dir, f'{backend}.json').write_text(json.dumps(runs))


if __name__ == '__main__':
    os.environ.setdefault('OMP_NUM_THREADS', '1')
    if '--dp' in sys.argv:
        main_dp(sys.argv[1], sys.argv[2], ('TransformersModel', 'MultiLoraTransformersModel'))
    elif '--megatron-tp' in sys.argv:
        main_dp(sys.argv[1], sys.argv[2], ('MegatronModel',), 'tp_size')
    else:
        main(sys.argv[1], sys.argv[2])
