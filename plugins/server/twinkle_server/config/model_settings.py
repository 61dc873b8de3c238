"""Settings of hosted models and their placement: `ModelSpec` (a `models` entry of the config file), `GroupSpec`
(its `train_group` / `sampler_group`), `HubPushConfig` (`hub_push`), `DeploymentConfig` and `RayConfig`
(`deployment`). Each file key is declared once, on its field (`options.option`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from twinkle_core.mesh import DeviceGroup, DeviceMesh
from twinkle_server.config.options import option
from twinkle_server.config.rules import (
    BOOL,
    DEVICE_TYPE,
    HUBS,
    MAPPING,
    NULLABLE_MAPPING,
    POSITIVE_OR_NULL,
    Rule,
    choice_rule,
    int_rule,
    number_rule,
    text_rule,
)


@dataclass(frozen=True)
class HubPushConfig:
    """Pushing saved checkpoints to a model hub: the settings (checked by `config.loading`, used by `hub_push`)."""

    enabled: bool = option(False, rule=BOOL, meaning='push named checkpoints after they are saved')
    hub: str = option('ms', rule=choice_rule(*HUBS), meaning='`ms` (ModelScope) or `hf` (Hugging Face)')
    repo_prefix: str | None = option(
        None,
        rule=text_rule(
            "'NAMESPACE' or 'NAMESPACE/NAME-PREFIX' (a hub user or organization)",
            r'[A-Za-z0-9][A-Za-z0-9._-]*(/.*)?',
            nullable=True,
        ),
        meaning='`NAMESPACE` or `NAMESPACE/NAME-PREFIX`: where repositories are created; required when `enabled`',
    )
    private: bool = option(True, rule=BOOL, meaning='create repositories private')
    token_env: str | None = option(
        None,
        rule=text_rule(
            'the NAME of an environment variable holding the token', r'[A-Za-z_][A-Za-z0-9_]*', nullable=True
        ),
        meaning='the NAME of the environment variable holding the hub token (never the token itself); `null`: the '
        "hub client's own login",
    )
    per_request: bool = option(False, rule=BOOL, meaning='`true`: push only the saves that ask for it')


@dataclass(frozen=True)
class GroupSpec:
    """Ray device group of one role of a model: `ranks` processes (for a sampler group: per replica), each on one
    `device_type` device and reserving, per rank, `num_cpus` / `num_gpus` Ray resources and any custom Ray
    `resources` (e.g. ``{'node_b': 1}`` to place the group on nodes that offer `node_b`)."""

    ranks: int = option(
        1,
        rule=int_rule(1),
        meaning='processes of the group (of each replica). More than one training rank needs a backend that takes a '
        '`device_mesh` (`TransformersModel`; `MultiLoraTransformersModel` over `dp_size` and `fsdp_size`); a sampler '
        'replica is one process (`ranks_per_replica: 1`; give it several GPUs with `num_gpus`, e.g. for vLLM '
        '`tensor_parallel_size`)',
    )
    device_type: str | None = option(
        None,
        rule=DEVICE_TYPE,
        meaning='`cpu` or `cuda` (`gpu` means `cuda`); `null`: CUDA when the machine running the server has it, '
        'else CPU',
    )
    num_cpus: float | None = option(None, rule=POSITIVE_OR_NULL, meaning='Ray CPUs reserved per rank (`null`: 1)')
    num_gpus: float | None = option(
        None,
        rule=number_rule(0, True, nullable=True),
        meaning='Ray GPUs reserved per rank (`null`: 1 for `cuda`, else 0)',
    )
    resources: dict[str, float] | None = option(
        None,
        rule=Rule((dict,), 'a mapping of Ray resource names to amounts per rank', nullable=True),
        meaning='custom Ray resources reserved per rank, e.g. `{node_b: 1}` to place the group on the nodes started '
        'with `ray start --resources \'{"node_b": 4}\'`',
    )

    def device_group(self, name: str) -> DeviceGroup:
        """The `twinkle_core.mesh.DeviceGroup` named `name` for these settings."""
        options = {
            k: v
            for k, v in (('num_cpus', self.num_cpus), ('num_gpus', self.num_gpus), ('resources', self.resources))
            if v is not None
        }
        return DeviceGroup(name=name, ranks=self.ranks, device_type=self.device_type, options=options)


@dataclass(frozen=True)
class RayConfig:
    """How the server reaches Ray (the `deployment.ray` section)."""

    address: str | None = option(
        None,
        rule=text_rule(
            "null (start Ray here), 'auto', 'ray://HOST:PORT' or 'HOST:PORT'",
            r'auto|ray://\S+|[\w.-]+:\d+',
            nullable=True,
        ),
        meaning='`null`: start a Ray instance on this node; `auto`: join the cluster this node belongs to; '
        "`ray://HOST:10001`: connect as a Ray client; `HOST:PORT`: a cluster's GCS address",
    )
    namespace: str | None = option(
        None,
        rule=text_rule(nullable=True),
        meaning="Ray namespace of the server's actors (`null`: the server's default namespace)",
    )
    num_cpus: int | None = option(
        None,
        rule=int_rule(1, nullable=True),
        meaning='CPUs of a Ray instance the server starts (`null`: what the node has). Not allowed with an '
        '`address`: a running cluster has its own resources',
    )


@dataclass(frozen=True)
class DeploymentConfig:
    """Where models run (the `deployment` section)."""

    mode: str = option(
        'embedded',
        rule=choice_rule('embedded', 'ray'),
        meaning='`embedded`: every model in the server process. `ray`: the HTTP front runs in this process and each '
        "model's training group and sampler replicas run as Ray actors (needs `pip install twinkle-ray`)",
    )
    ray: RayConfig = option(
        factory=RayConfig,
        rule=MAPPING,
        meaning='how to reach Ray (read only when `mode` is `ray`):',
        default_text='`{}`',
    )


def _loggers_ok(value: list[Any]) -> bool:
    return all(isinstance(x, str) or (isinstance(x, dict) and isinstance(x.get('name'), str)) for x in value)


@dataclass(frozen=True)
class ModelSpec:
    """One hosted base model: served as `name` from `path`, trained by the model backend `backend` and sampled by
    `sampler`. `device` places an embedded model host; `train_group`, `mesh`, `sampler_replicas` and
    `sampler_group` place it on Ray. `hub_push`: this model's effective push settings (the server's, with the
    model's overrides), None when pushing is not configured."""

    name: str = option(rule=text_rule(), meaning='the public name clients ask for (`base_model`); unique')
    path: str = option(
        rule=text_rule('a model directory or an ms:// / hf:// id'),
        meaning='a local model directory, or an `ms://` / `hf://` id downloaded at start',
    )
    backend: str = option(
        'MultiLoraTransformersModel',
        rule=text_rule(),
        meaning='the training backend, by registry name (kind `model`); must be installed (docs/extending.md)',
        flag='--backend',
        metavar='NAME',
    )
    backend_args: dict[str, Any] = option(
        factory=dict,
        rule=MAPPING,
        meaning='its constructor arguments, e.g. `{pass_strategy: mixed, max_length: 4096, max_pass_tokens: 4096}` '
        "(`max_pass_tokens`: the tokens one pass holds, a tenant's larger call runs in pieces: docs/multi_tenant.md, "
        '"Memory"); `pass_strategy` only '
        'for a backend that declares pass strategies (`ModelCapabilities.pass_strategies`, docs/extending.md), '
        'else the start fails naming the model; `gradient_checkpointing` (`true`, `selective`, `{every: 2}`, ...: '
        'docs/long_sequences.md) only for a backend that declares it (`ModelCapabilities.gradient_checkpointing`)',
        flag='--backend-args',
        metavar='JSON',
    )
    sampler: str = option(
        'TorchSampler',
        rule=text_rule(),
        meaning='the sampler, by registry name (kind `sampler`), e.g. `vLLMSampler` (docs/vllm.md)',
        flag='--sampler',
        metavar='NAME',
    )
    sampler_args: dict[str, Any] = option(
        factory=dict,
        rule=MAPPING,
        meaning='its constructor arguments, e.g. `{engine_args: {max_model_len: 4096}}`',
        flag='--sampler-args',
        metavar='JSON',
    )
    device: str | None = option(
        None,
        rule=text_rule('cpu, cuda, cuda:N or null', r'cpu|cuda(:\d+)?', nullable=True),
        meaning='embedded mode only: `cpu`, `cuda` or `cuda:N`; `null`: `--device`, else CUDA when available, else '
        "CPU. In ray mode set the groups' `device_type` instead",
        flag='--device',
    )
    train_group: GroupSpec = option(
        factory=GroupSpec,
        rule=MAPPING,
        meaning='the training ranks, a `DeviceGroup` (below)',
        default_text='one rank',
    )
    mesh: dict[str, int] | None = option(
        None,
        rule=Rule((dict,), 'a mapping of mesh sizes', nullable=True),
        meaning='how the training ranks are arranged, `DeviceMesh.from_sizes(...)` sizes (below); `null`: data '
        'parallel over `train_group.ranks`',
    )
    sampler_replicas: int = option(
        1, rule=int_rule(1), meaning="independent samplers sharing the model's sampling traffic"
    )
    sampler_group: GroupSpec = option(
        factory=GroupSpec,
        rule=MAPPING,
        meaning='the ranks of each sampler replica, a `DeviceGroup` (below)',
        default_text='one rank',
    )
    hub_push: HubPushConfig | None = option(
        None,
        rule=NULLABLE_MAPPING,
        meaning="this model's overrides of the `hub_push` section",
        default_text="the server's",
    )
    loggers: list[Any] = option(
        factory=list,
        rule=Rule(
            (list,),
            'a list of metrics logger names (wandb, swanlab, tensorboard, jsonl, console) or {name: NAME, ...} '
            'mappings',
            _loggers_ok,
            problem='not a list of logger names or {name: ...} mappings',
        ),
        meaning='metrics loggers fed with every training run on this model, by name or `{name: NAME, ...arguments}`: '
        '`console`, `jsonl`, `tensorboard`, `wandb`, `swanlab` (docs/plugins.md, "Shipped metrics loggers"); they '
        "log what the console's curves show (`loss:sum`, `learning_rate`, `grad_norm:mean`, ...) at the run's "
        'step, one W&B run per training run',
    )

    def mesh_world_size(self) -> int:
        """Ranks the mesh covers: the product of its sizes (`ep_size` folds over data ranks), an unset `dp_size`
        filling `train_group.ranks` where it divides evenly (else counting 1)."""
        if not self.mesh:
            return self.train_group.ranks
        others = math.prod(v for k, v in self.mesh.items() if k not in ('dp_size', 'ep_size'))
        dp = self.mesh.get('dp_size')
        if dp is None:
            dp = self.train_group.ranks // others if self.train_group.ranks % others == 0 else 1
        return dp * others

    def device_mesh(self) -> DeviceMesh:
        """The `twinkle_core.mesh.DeviceMesh` of the training group (data parallel when `mesh` is None)."""
        return DeviceMesh.from_sizes(
            **(self.mesh or {}), world_size=self.train_group.ranks, device_type=self.train_group.device_type
        )

    def ray_only_settings(self) -> list[str]:
        """The keys of this spec (relative to the model) that only a Ray deployment can honour."""
        out = []
        for key, group, size in (
            ('train_group', self.train_group, 'ranks'),
            ('sampler_group', self.sampler_group, 'ranks_per_replica'),
        ):
            if group.ranks != 1:
                out.append(f'{key}.{size}')
            out += [
                f'{key}.{k}'
                for k in ('device_type', 'num_cpus', 'num_gpus', 'resources')
                if getattr(group, k) is not None
            ]
        if self.mesh and self.mesh_world_size() != 1:
            out.append('mesh')
        if self.sampler_replicas != 1:
            out.append('sampler_replicas')
        return out
