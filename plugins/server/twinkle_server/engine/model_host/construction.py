"""Building a host's training backend and sampler from their registry names, as their declared capabilities say.

The server never decides by a class's name or guesses from its constructor's signature: what it passes besides
``model_id`` is what the class declares in its `capabilities` (`twinkle_core.model.ModelCapabilities`,
`twinkle_core.sampler.SamplerCapabilities`, read from the class before it is built):

- ``device=`` to a backend or sampler that declares `takes_device`;
- ``device_mesh=`` (a training group of several ranks) only to a backend that declares `takes_device_mesh`;
- ``pass_strategy`` in ``backend_args`` only to a backend that declares it among its `pass_strategies`.

Every host is built here (in the server process, or on each rank of a Ray training group), so these checks run
before any weights load, whichever way the config was given. The config checker (`twinkle_server.config.loading`)
asks `takes_device_mesh` of the same declarations for a Ray training group of several ranks.
"""

from __future__ import annotations

from typing import Any, Mapping

from twinkle_core.errors import InvalidInputError
from twinkle_core.model import Model, ModelCapabilities
from twinkle_core.registry import resolve, resolve_class
from twinkle_core.sampler import Sampler, SamplerCapabilities
from twinkle_core.train.activation_checkpointing import checkpoint_policy

__all__ = [
    'backend_args_problem',
    'build_backend',
    'build_sampler',
    'mesh_problem',
    'model_capabilities',
    'sampler_capabilities',
    'takes_device_mesh',
]

#: (what is wrong, what is expected), each one line: how a config problem is reported
Problem = tuple[str, str]


def model_capabilities(backend: str) -> ModelCapabilities:
    """What the model backend registered as `backend` declares (raises as `resolve_class` does when it is not
    installed); a class that declares nothing gets the conservative defaults."""
    return _declared(resolve_class('model', backend), ModelCapabilities)


def sampler_capabilities(sampler: str) -> SamplerCapabilities:
    """What the sampler registered as `sampler` declares (conservative defaults when it declares nothing)."""
    return _declared(resolve_class('sampler', sampler), SamplerCapabilities)


def takes_device_mesh(backend: str) -> bool:
    """Whether the model backend registered as `backend` declares `takes_device_mesh` (one that cannot be
    resolved: yes -- its name is reported on its own)."""
    try:
        return model_capabilities(backend).takes_device_mesh
    except Exception:  # noqa: BLE001 - not installed or broken: reported by the registry check
        return True


def backend_args_problem(backend: str, caps: ModelCapabilities, backend_args: Mapping[str, Any]) -> Problem | None:
    """What is wrong with `backend_args` for `backend` (declaring `caps`), or None. The server checks the model
    options it documents: ``pass_strategy`` must be one of the backend's declared `pass_strategies`, and
    ``gradient_checkpointing`` needs a backend that declares it and a valid policy."""
    if backend_args.get('gradient_checkpointing') not in (None, False):
        problem = _checkpointing_problem(backend, caps, backend_args['gradient_checkpointing'])
        if problem is not None:
            return problem
    if 'pass_strategy' not in backend_args:
        return None
    value = backend_args['pass_strategy']
    if not caps.pass_strategies:
        return (
            f"{backend} takes no pass_strategy: it does not split several adapters' queued work into passes",
            'no pass_strategy, or a backend that declares pass strategies (e.g. MultiLoraTransformersModel)',
        )
    if value not in caps.pass_strategies:
        return f'unknown pass strategy {value!r} for {backend}', f'one of {", ".join(caps.pass_strategies)}'
    return None


def _checkpointing_problem(backend: str, caps: ModelCapabilities, value: Any) -> Problem | None:
    if not caps.gradient_checkpointing:
        return f'{backend} takes no gradient_checkpointing', 'a backend that declares it (e.g. TransformersModel)'
    try:
        checkpoint_policy(value)
    except InvalidInputError as exc:
        return str(exc).rstrip('.'), "true, 'full', 'selective', an integer k, or {every, layers, selective}"
    return None


def mesh_problem(backend: str, caps: ModelCapabilities, ranks: int) -> Problem | None:
    """What is wrong with training `backend` (declaring `caps`) on `ranks` ranks, or None."""
    if ranks > 1 and not caps.takes_device_mesh:
        return (
            f'{backend} trains on one rank (it takes no device_mesh)',
            'ranks: 1, or a backend that takes a mesh (e.g. TransformersModel, one adapter at a time)',
        )
    return None


def build_backend(
    backend: str,
    model_dir: str,
    *,
    device: str | None = None,
    device_mesh: Any = None,
    backend_args: Mapping[str, Any] | None = None,
) -> Model:
    """The model backend registered as `backend`, built on `model_dir` with `backend_args`, plus ``device`` and
    ``device_mesh`` where it declares it takes them. Raises ValueError for arguments it does not declare."""
    caps = model_capabilities(backend)
    args = dict(backend_args or {})
    problem = backend_args_problem(backend, caps, args) or mesh_problem(
        backend, caps, 1 if device_mesh is None else device_mesh.world_size
    )
    if problem is not None:
        raise ValueError(f'{problem[0]} (expected {problem[1]})')
    if caps.takes_device:
        args.setdefault('device', device)
    if device_mesh is not None:
        args['device_mesh'] = device_mesh
    return resolve('model', backend, model_id=model_dir, **args)


def build_sampler(
    sampler: str, model_dir: str, *, device: str | None = None, sampler_args: Mapping[str, Any] | None = None
) -> Sampler:
    """The sampler registered as `sampler`, built on `model_dir` with `sampler_args` (plus ``device`` where it
    declares it takes one; `sampler_args` win)."""
    args = dict(sampler_args or {})
    if sampler_capabilities(sampler).takes_device:
        args = {'device': device, **args}
    return resolve('sampler', sampler, model_id=model_dir, **args)


def _declared(cls: Any, kind: type) -> Any:
    caps = getattr(cls, 'capabilities', None)
    if caps is None:
        return kind()
    if not isinstance(caps, kind):
        raise TypeError(
            f'{getattr(cls, "__qualname__", cls)}.capabilities must be a {kind.__name__}, got {type(caps).__name__}'
        )
    return caps
