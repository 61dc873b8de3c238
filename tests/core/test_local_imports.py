"""Function-local imports of this project's own modules (docs/architecture.md, "Layers"): with no import cycle
anywhere (`test_project_imports.py`), a first-party import inside a function is there only to defer a heavy
dependency its module does not load already (torch, transformers, Ray, vLLM, uvicorn, ... at import time), or for
one of the reasons named in REASONS. Everything else imports at module level."""

from __future__ import annotations

import functools

from tests.core.test_project_imports import packages
from tests.import_graph import local_first_party_imports, package_modules, third_party_at_import

#: third-party packages whose import is worth deferring (seconds, or an optional install)
HEAVY = {
    'torch', 'transformers', 'peft', 'ray', 'vllm', 'megatron', 'datasets', 'safetensors', 'PIL', 'tinker',
    'tinker_cookbook', 'fastapi', 'uvicorn', 'starlette', 'numpy', 'modelscope', 'huggingface_hub', 'kernels', 'gguf',
    'wandb', 'swanlab', 'tensorboardX', 'psycopg', 'jinja2', 'tokenizers', 'openai', 'httpx', 'pydantic', 'yaml',
    'tqdm', 'accelerate',
    'pluggy',  # kept out of `import twinkle_core` (test_import_cost.py)
}  # fmt: skip

#: importing module (or package prefix) -> why its function-local first-party imports stay there
REASONS = {
    'twinkle_core.cli': 'every `twinkle` command imports each subcommand module: a subcommand loads its work when run',
    'twinkle_core.console.cli': 'a `twinkle` subcommand module (as twinkle_core.cli)',
    'twinkle_core.hooks': 'the hook manager is built while plugins load; it reads the plugin table when first used',
    'twinkle_core.fixtures.hub_cache': 'a test fixture helper reading the registry index only when it fills a cache',
    'twinkle_server.engine.ray_deploy': 'twinkle-ray is an optional extra (twinkle-server[ray]) a Ray deployment loads',
    'twinkle_ray.weight_sync': 'the torch-using CheckpointEngineManager, in a Ray worker when a sync opens',
    'twinkle_ray.worker': 'twinkle_core.initialize() in the worker process, when the group sets it up',
    'twinkle_transformers.sequence_parallel': 'the vision module only when a model is checked for a split',
}


@functools.cache
def project_modules() -> dict:
    modules: dict = {}
    for package, (directory, _) in packages().items():
        modules.update(package_modules(package, directory))
    return modules


def unjustified() -> list[str]:
    modules = project_modules()
    loads = third_party_at_import(modules)
    out = []
    for module, line, target in local_first_party_imports(modules):
        deferred = (loads[target] - loads[module]) & HEAVY
        reason = any(module == k or module.startswith(k + '.') for k in REASONS)
        if not deferred and not reason:
            out.append(f'{modules[module]}:{line}: {module} imports {target} inside a function (move it up)')
    return out


def test_a_function_local_import_defers_a_heavy_dependency_or_names_its_reason() -> None:
    assert unjustified() == []


def test_every_reason_is_still_needed() -> None:
    modules = project_modules()
    loads = third_party_at_import(modules)
    used = {
        key
        for module, _, target in local_first_party_imports(modules)
        if not (loads[target] - loads[module]) & HEAVY
        for key in REASONS
        if module == key or module.startswith(key + '.')
    }
    assert set(REASONS) - used == set()
