"""Several tenants' LoRA adapters on one base model, each trained asynchronously by its own `AsyncRLDriver` (its
own buffer, policy versions and sampler): running them concurrently gives each tenant exactly what it gets alone."""

from __future__ import annotations

import threading
from typing import Any

import torch

from twinkle_core.advantage import GRPOAdvantage
from twinkle_core.fixtures.repeat_task import RepeatTaskWorker
from twinkle_core.registry import resolve, resolve_class
from twinkle_core.rl import AsyncRLDriver, PolicyGradientStep, RolloutGroup, RunReport
from twinkle_transformers.multi_lora import MultiLoraTransformersModel

TENANTS = {'ann': 0, 'bob': 1}  # name -> seed of its prompts
STEPS = 3


def tenants_model(model_dir: Any) -> MultiLoraTransformersModel:
    torch.manual_seed(0)
    model = MultiLoraTransformersModel(model_id=model_dir)
    for name in TENANTS:
        generator = torch.Generator().manual_seed(len(name) * 7 + TENANTS[name])
        model.add_adapter_to_model(name, {'r': 4, 'lora_alpha': 8}, generator=generator)
        model.set_optimizer('AdamW', lr=5e-3, adapter_name=name)
        model.set_loss('GRPOLoss', adapter_name=name)
    return model


def tenant_driver(model: Any, name: str, train_lock: threading.Lock, max_staleness: int) -> AsyncRLDriver:
    template = resolve('template', 'Template', model_id_or_tokenizer=model.tokenizer)

    def new_worker() -> RepeatTaskWorker:
        sampler = resolve_class('sampler', 'TorchSampler')(model_id=model.model_dir)
        return RepeatTaskWorker(
            sampler, template, prompts_per_call=2, group_size=4, seed=TENANTS[name], adapter_name=name
        )

    step_fn = PolicyGradientStep(model, GRPOAdvantage(scale='group'), adapter_name=name)

    def train_step(groups: list[RolloutGroup], step: int) -> dict[str, Any]:
        with train_lock:  # the tenants share the base model's forward/backward; one step at a time
            return step_fn(groups, step)

    return AsyncRLDriver(
        model, new_worker, train_step, groups_per_step=2, max_staleness=max_staleness, adapter_name=name
    )


def adapter_state(model: Any, name: str) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.manager.state_dict(name).items()}


def run_tenants(model_dir: Any, concurrent: bool, max_staleness: int) -> tuple[dict, dict[str, RunReport]]:
    model = tenants_model(model_dir)
    lock = threading.Lock()
    drivers = {name: tenant_driver(model, name, lock, max_staleness) for name in TENANTS}
    reports: dict[str, RunReport] = {}
    if concurrent:
        threads = [threading.Thread(target=lambda n=n: reports.__setitem__(n, drivers[n].run(STEPS))) for n in TENANTS]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
    else:
        reports = {name: drivers[name].run(STEPS) for name in TENANTS}
    return {name: adapter_state(model, name) for name in TENANTS}, reports


def test_concurrent_tenants_train_exactly_as_each_alone(tiny_model_dir):
    alone, _ = run_tenants(tiny_model_dir, concurrent=False, max_staleness=0)
    together, reports = run_tenants(tiny_model_dir, concurrent=True, max_staleness=0)
    assert sorted(reports) == sorted(TENANTS)
    for name in TENANTS:
        assert alone[name].keys() == together[name].keys()
        for key, tensor in alone[name].items():
            assert torch.equal(together[name][key], tensor), (name, key)
    initial = tenants_model(tiny_model_dir)
    for name in TENANTS:  # and they did train
        assert any(not torch.equal(t, adapter_state(initial, name)[k]) for k, t in alone[name].items()), name


def test_each_tenant_has_its_own_versions_and_staleness_bound(tiny_model_dir):
    states, reports = run_tenants(tiny_model_dir, concurrent=True, max_staleness=1)
    for name, report in reports.items():
        assert len(report.steps) == STEPS and report.dropped == 0
        assert all(max(r.staleness) <= 1 for r in report.steps), name
        assert [r.step for r in report.steps] == list(range(STEPS))  # versions count this tenant's steps only
