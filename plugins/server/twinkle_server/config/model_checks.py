"""What a model entry of the config file asks of this installation (`loading` reports it with the file's lines): its
backend and sampler resolve in the registry, its mesh fits its train group and what the backend declares
(`ModelCapabilities`), and its settings fit the deployment mode."""

from __future__ import annotations

import dataclasses
import difflib
from typing import TYPE_CHECKING

from twinkle_core.errors import ComponentNotFoundError, DistributionNotInstalledError, MeshError
from twinkle_core.model.mesh_support import mesh_problem as unsupported_dims
from twinkle_core.registry import list_components, resolve_class
from twinkle_server.config.settings import DeploymentConfig, ModelSpec
from twinkle_server.config.yaml_lines import KeyPath

if TYPE_CHECKING:
    from twinkle_core.model import ModelCapabilities

#: (where under the model's key, what is wrong, what is expected, a note)
Problem = tuple[KeyPath, str, str | None, str | None]


class InstalledModels:
    """The registry's answers for model entries, each looked up once per config file."""

    def __init__(self) -> None:
        self._resolved: dict[tuple[str, str], tuple[str, str] | None] = {}
        self._capabilities: dict[str, ModelCapabilities | None] = {}

    def resolve_problem(self, kind: str, name: str) -> tuple[str, str] | None:
        """None when `name` resolves as a `kind` (model or sampler), else (what is wrong, what is expected)."""
        if (kind, name) not in self._resolved:
            self._resolved[kind, name] = _resolve_problem(kind, name)
        return self._resolved[kind, name]

    def capabilities(self, backend: str) -> ModelCapabilities | None:
        """What the backend registered as `backend` declares; None when it cannot be resolved (reported by
        `resolve_problem` where the file names it)."""
        from twinkle_server.engine.model_host.construction import model_capabilities

        if backend not in self._capabilities:
            try:
                self._capabilities[backend] = model_capabilities(backend)
            except Exception:  # noqa: BLE001 - not installed or broken: `resolve_problem` says so
                self._capabilities[backend] = None
        return self._capabilities[backend]

    def placement_problems(self, spec: ModelSpec, deployment: DeploymentConfig) -> list[Problem]:
        """The model's mesh against its train group and the backend's declared mesh support; settings the
        deployment mode cannot honour."""
        problems: list[Problem] = []

        def error(where: KeyPath, problem: str, expected: str | None = None, note: str | None = None) -> None:
            problems.append((where, problem, expected, note))

        ranks = spec.train_group.ranks
        if spec.mesh and spec.mesh_world_size() != ranks:
            error(
                ('mesh',),
                f'the mesh spans {spec.mesh_world_size()} ranks but train_group.ranks is {ranks}',
                'the product of the mesh sizes to equal train_group.ranks',
            )
        elif spec.mesh:
            try:
                dataclasses.replace(
                    spec, train_group=dataclasses.replace(spec.train_group, device_type='cpu')
                ).device_mesh()
            except MeshError as exc:
                error(('mesh',), str(exc).rstrip('.'), 'sizes DeviceMesh.from_sizes accepts')
            else:  # a backend taking no mesh, or embedded mode: reported below as such
                declared = self.capabilities(spec.backend)
                meshed = deployment.mode != 'embedded' and declared is not None and declared.takes_device_mesh
                unsupported = meshed and declared and unsupported_dims(spec.backend, declared, spec.mesh)
                if unsupported:
                    error(('mesh',), unsupported.rstrip('.'), 'the mesh dimensions the backend implements')
        if deployment.mode == 'embedded':
            for key in spec.ray_only_settings():
                error(
                    tuple(key.split('.')),
                    'needs deployment.mode: ray',
                    note='embedded mode runs each model once, in the server process',
                )
        else:
            if spec.device is not None:
                error(
                    ('device',),
                    'only used with deployment.mode: embedded',
                    note='in ray mode set train_group.device_type and sampler_group.device_type',
                )
            from twinkle_server.engine.model_host.construction import mesh_problem

            caps = self.capabilities(spec.backend)
            problem = caps and mesh_problem(spec.backend, caps, spec.train_group.ranks)
            if problem:
                error(('train_group', 'ranks'), *problem)
            if spec.sampler_group.ranks > 1:
                error(
                    ('sampler_group', 'ranks_per_replica'),
                    'a sampler replica is one process',
                    'ranks_per_replica: 1; give a replica several GPUs with num_gpus instead (e.g. for '
                    'vLLM tensor_parallel_size)',
                )
        return problems


def _resolve_problem(kind: str, name: str) -> tuple[str, str] | None:
    """None when the registry resolves `name`, else (what is wrong, what is expected), each in one line."""
    what = 'model backend' if kind == 'model' else kind
    try:
        component = resolve_class(kind, name)
    except DistributionNotInstalledError as exc:
        return ' '.join(str(exc).split()), f'an installed {what}'
    except ComponentNotFoundError:
        installed = [c.name for c in list_components(kind) if c.source != 'index']
        close = difflib.get_close_matches(name, installed, n=1, cutoff=0.5)
        return (
            f'unknown {what} {name!r}' + (f'; did you mean {close[0]}?' if close else ''),
            f'an installed {what}: {", ".join(installed) or "none is installed"}',
        )
    except Exception as exc:  # noqa: BLE001 - a broken plugin or untrusted hub code: report, don't crash the check
        return f'{name!r} cannot be loaded: ' + ' '.join(f'{type(exc).__name__}: {exc}'.split()), f'a loadable {what}'
    outputs = getattr(getattr(component, 'capabilities', None), 'outputs', 'logprobs') if kind == 'model' else None
    if outputs not in (None, 'logprobs'):
        return (
            f'{name} is a {outputs} model (a scalar head: a PPO critic or a reward model), not a causal LM',
            'a causal-LM backend the service can train and sample, e.g. TransformersModel',
        )
    return None
