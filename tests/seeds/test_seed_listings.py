"""The Twinkle documents' listings, ported to examples/seeds/ with only the stated substitutions (each file's
header lists them), run as a user would and checked for what the listing promises: one process, torchrun and the
service (the Ray ones: test_seed_listings_ray.py)."""

from __future__ import annotations

import logging
import re
import shutil
import sys

import pytest

from tests.seeds.listings import SEEDS, assert_sft_listing_learned, mean_row_loss, run, torchrun
from twinkle_core.utils.net import free_port


def test_single_process_listing_runs_as_written(tiny_model_dir, monkeypatch, caplog):
    """Runtime-modes document, "Single GPU": raw query/response rows encoded without a preprocessor, stepped
    without set_optimizer. It converts the chat layout, announces the default optimizer, and the model it loaded
    has a lower loss on its data afterwards."""
    import importlib.util

    from twinkle_core import hooks
    from twinkle_core.dataset import Dataset, DatasetMeta
    from twinkle_core.fixtures import data_path

    monkeypatch.setenv('TWINKLE_SEED_MODEL', str(tiny_model_dir))
    rows = (
        Dataset(DatasetMeta(str(data_path('self_cognition.jsonl')), data_slice=range(16)))
        .map('MessagesProcessor')
        .set_template('Template', model_id=str(tiny_model_dir))
        .encode()
        .rows(range(16))
    )
    loaded = []

    class FirstLoss:
        @hooks.hook
        def twinkle_model_loaded(self, model, model_id):
            loaded.append((model, mean_row_loss(model, rows)))

    spec = importlib.util.spec_from_file_location('single_process_sft', SEEDS / 'single_process_sft.py')
    listing = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(listing)
    recorder = FirstLoss()
    hooks.register_hooks(recorder)
    try:
        with caplog.at_level('INFO'):
            listing.train()
    finally:
        hooks.unregister_hooks(recorder)
    ((model, before),) = loaded
    assert mean_row_loss(model, rows) < before - 1e-3
    messages = [r.getMessage() for r in caplog.records]
    assert any('query/response columns with MessagesProcessor' in m for m in messages)
    assert any('without set_optimizer(...): using AdamW(lr=1e-05)' in m for m in messages)


@pytest.mark.slow
def test_torchrun_listing_runs_as_written(tmp_path):
    """Runtime-modes document, "torchrun Mode": the single-process body under an FSDP2 mesh on 2 CPU ranks."""
    output = torchrun('torchrun_sft.py', tmp_path)
    assert output.count('using AdamW(lr=1e-05)') == 2  # one default optimizer per rank, announced


@pytest.mark.slow
def test_fsdp2_sft_with_eval_under_torchrun(tmp_path, tiny_model_dir):
    """Best-practices guide section 2: torchrun, FSDP2 over 2 CPU ranks, LoRA; the loss falls, the periodic
    evaluation runs, and the best and last checkpoints are PEFT adapters that load."""
    output = torchrun('fsdp2_sft_with_eval.py', tmp_path)
    assert_sft_listing_learned(output, tmp_path, tiny_model_dir)


@pytest.mark.slow
def test_megatron_sft_with_eval_under_torchrun(tmp_path, tiny_model_dir):
    """The same listing with `MegatronModel` over tp=2 CPU ranks: the loss falls, the evaluation runs, and the
    checkpoints are PEFT adapters that load on the Hugging Face model."""
    pytest.importorskip('twinkle_megatron')
    output = torchrun('megatron_sft_with_eval.py', tmp_path)
    assert_sft_listing_learned(output, tmp_path, tiny_model_dir)


@pytest.mark.slow
def test_readme_tinker_sft_against_the_service(tmp_path, tiny_model_dir):
    """README "Tinker-compatible API": a twinkle dataset, `input_feature_to_datum`, the unmodified tinker SDK, three
    epochs with a saved state each; the loss of the last state is below the first's."""
    tinker = pytest.importorskip('tinker')
    from twinkle_core.server.common import input_feature_to_datum
    from twinkle_server import ServerConfig, start_in_thread
    from twinkle_server.service.auth import create_api_key

    logging.getLogger('tinker').setLevel(logging.ERROR)
    served = 'twinkle/tiny-qwen3'
    hub_root = tmp_path / 'hub'
    shutil.copytree(tiny_model_dir, hub_root / 'ms' / 'twinkle' / 'tiny-qwen3' / 'master')  # the test hub root
    running = start_in_thread(
        ServerConfig(models={served: str(tiny_model_dir)}, data_dir=str(tmp_path / 'srv'), port=free_port())
    )
    try:
        key = create_api_key(running.service.store, 'seed')
        run(
            [sys.executable, str(SEEDS / 'readme_tinker_sft.py')],
            tmp_path,
            env={
                'TWINKLE_HUB_ROOT': str(hub_root),
                'TWINKLE_SEED_BASE_MODEL': f'ms://{served}',
                'TWINKLE_SEED_BASE_URL': running.base_url,
                'TWINKLE_SEED_API_KEY': key,
            },
        )
        client = tinker.ServiceClient(base_url=running.base_url, api_key=key)
        rest = client.create_rest_client()
        run_id = rest.list_training_runs().result().training_runs[0].training_run_id
        paths = [c.tinker_path for c in rest.list_checkpoints(run_id).result().checkpoints]
        assert {'twinkle-lora-0', 'twinkle-lora-1', 'twinkle-lora-2'} <= {p.rsplit('/', 1)[-1] for p in paths}
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
        ids = tokenizer.encode('I am twinkle Model, trained by ModelScope Team.')
        datum = input_feature_to_datum({'input_ids': ids, 'labels': ids})

        def loss(state: str) -> float:
            path = next(p for p in paths if p.endswith(state))
            trained = client.create_training_client_from_state(path).result()
            out = trained.forward([datum], 'cross_entropy').result()
            return -float(out.loss_fn_outputs[0]['logprobs'].to_numpy().sum())

        assert loss('twinkle-lora-2') < loss('twinkle-lora-0')
    finally:
        running.stop()


@pytest.mark.slow
def test_twinkle_client_sft_with_a_server_side_dataset(tmp_path, tiny_model_dir):
    """Best-practices guide 3.1: the native client lists runs and checkpoints, builds the dataset on the server
    (data from an allowed root, the hosted model's template), trains with gradient accumulation 2 and the split
    clip/step/zero_grad/lr_step calls, and saves a resumable checkpoint per epoch; the loss falls."""
    from twinkle_core.fixtures import data_path
    from twinkle_server import ServerConfig, start_in_thread
    from twinkle_server.service.auth import create_api_key

    data = data_path('self_cognition.jsonl')
    running = start_in_thread(
        ServerConfig(
            models={'twinkle/tiny-qwen3': str(tiny_model_dir)},
            data_dir=str(tmp_path / 'srv'),
            port=free_port(),
            allowed_roots=(str(data.parent),),
        )
    )
    try:
        key = create_api_key(running.service.store, 'seed')
        env = {
            'TWINKLE_SEED_BASE_MODEL': 'ms://twinkle/tiny-qwen3',
            'TWINKLE_SEED_DATA': str(data),
            'TWINKLE_SEED_BASE_URL': running.base_url,
            'TWINKLE_SEED_API_KEY': key,
        }
        output = run([sys.executable, str(SEEDS / 'client_sft.py')], tmp_path, env=env)
        assert "'gradient_accumulation_steps': 2" in output
        losses = [float(m) for m in re.findall(r"Current is step \d+, loss: [^\n]*?'loss': ([0-9.]+)", output)]
        assert len(losses) > 10 and sum(losses[-3:]) < sum(losses[:3]), losses
        saved = re.findall(r'Saved checkpoint: (twinkle://\S+)', output)
        assert len(saved) == 3
        # a second run lists what the first saved (the listing's resume hook reads checkpoint.twinkle_path)
        from twinkle_client import init_twinkle_client

        client = init_twinkle_client(running.base_url, key)
        listed = {
            c.twinkle_path
            for run_ in client.list_training_runs()
            for c in client.list_checkpoints(run_.training_run_id)
        }
        assert set(saved) <= listed
    finally:
        running.stop()


def test_a_server_side_dataset_refuses_paths_outside_the_allowed_roots(tmp_path, tiny_model_dir):
    from twinkle_client import init_twinkle_client
    from twinkle_client.dataset import Dataset
    from twinkle_core.dataset import DatasetMeta
    from twinkle_core.errors import TwinkleError
    from twinkle_server import ServerConfig, start_in_thread
    from twinkle_server.service.auth import create_api_key

    secret, allowed = tmp_path / 'secret.jsonl', tmp_path / 'allowed' / 'data.jsonl'
    allowed.parent.mkdir()
    for path in (secret, allowed):
        path.write_text('{"messages": [{"role": "user", "content": "x"}]}\n')
    running = start_in_thread(
        ServerConfig(
            models={'m': str(tiny_model_dir)},
            data_dir=str(tmp_path / 'srv'),
            port=free_port(),
            allowed_roots=(str(allowed.parent),),
        )
    )
    try:
        client = init_twinkle_client(running.base_url, create_api_key(running.service.store, 't'))
        with pytest.raises(TwinkleError, match='not from another path on the server'):
            len(Dataset(DatasetMeta(str(secret)), client=client))
        with pytest.raises(TwinkleError, match='registered component name'):
            len(Dataset(DatasetMeta(str(allowed)), client=client).map('hf://x/y:Evil'))
        with pytest.raises(TwinkleError, match="model_id 'nope' is not a base model served here"):
            len(Dataset(DatasetMeta(str(allowed)), client=client).set_template('Template', model_id='nope'))
        assert len(Dataset(DatasetMeta(str(allowed)), client=client).set_template('Template').encode()) == 1
        with pytest.raises(TwinkleError, match='objects cannot travel'):
            Dataset(DatasetMeta(str(secret)), client=client).map(object())
    finally:
        running.stop()


@pytest.mark.parametrize(
    'module, name',
    [
        ('loss', 'Loss'),
        ('metric', 'Metric'),
        ('patch', 'Patch'),
        ('preprocessor', 'Preprocessor'),
        ('preprocessor', 'Filter'),
        ('processor', 'InputProcessor'),
        ('model', 'TwinkleModel'),
        ('sampler', 'Sampler'),
        ('reward', 'Reward'),
        ('advantage', 'Advantage'),
        ('template', 'Template'),
        ('checkpoint_engine', 'CheckpointEngine'),
    ],
)
def test_architecture_documents_base_classes_exist_where_it_says(module, name):
    """Architecture document, "Customizable Components": every base class at the path it names."""
    import importlib
    import inspect

    base = getattr(importlib.import_module(f'twinkle_core.{module}'), name)
    assert inspect.isclass(base)
