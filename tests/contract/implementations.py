"""Which implementations the contract suites run against: every installed one -- registry names of kind
`sampler` / `model` provided by an installed distribution's entry point (index-only names, e.g. a backend that
is not installed, are left out)."""

from __future__ import annotations

from twinkle_core.registry import list_components


def installed(kind: str) -> list[str]:
    return sorted(c.name for c in list_components(kind) if c.source == 'entry_point')


def skip_unless_causal_lm(backend: str) -> None:
    """Skip a model-contract test for a backend whose forward gives values, not log-probs (a critic / reward model
    backend, `ModelCapabilities.outputs`): its contract is tests/transformers/test_value_model.py. Resolved here,
    at run time, not at collection: collecting must not import every backend."""
    import pytest

    from twinkle_core.registry import resolve_class

    if resolve_class('model', backend).capabilities.outputs != 'logprobs':
        pytest.skip(f'{backend} gives values, not log-probs: tests/transformers/test_value_model.py')


def build_sampler(request, name: str, model_dir):
    """The sampler `name` on `model_dir`; vLLMSampler is the session's shared engine (its start costs ~15 s)."""
    if name == 'vLLMSampler':
        return request.getfixturevalue('vllm_sampler')
    from twinkle_core.registry import resolve

    kwargs = {'device': 'cpu'} if name == 'TorchSampler' else {}
    return resolve('sampler', name, model_id=str(model_dir), **kwargs)


def release(model) -> None:
    """Free what a backend holds process-wide (MegatronModel: its process groups), so later tests in this
    process see no process group."""
    shutdown = getattr(model, 'shutdown', None)
    if callable(shutdown):
        shutdown()
