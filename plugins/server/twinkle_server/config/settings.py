"""Server settings: the dataclasses of hosted models, data directory, limits, deployment.

`ServerConfig` is what the server runs from; `twinkle server start` builds it from flags or from one YAML file
(`loading.load_server_config`, docs/deployment.md). Each hosted base model is a `ModelSpec` (backend,
sampler, device groups, mesh, sampler replicas); `ServerConfig.model_specs` is the one table model hosts are built
from.

Limits come in one table (`Limits`) with built-in defaults sized for a small machine (2 cores, ~24 GiB: one
`forward_backward` of 32k tokens on a 0.6B model stays well inside memory). `--limits FILE` overrides them key by
key: `{"default": {...}, "tenants": {"alice": {...}}}`. The `default` entry overrides only the keys it names in
the built-in table, and a tenant's entry only the keys it names in the (overridden) default. `null` = unlimited.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from twinkle_core.template.images import MAX_IMAGE_PIXELS


@dataclass(frozen=True)
class TenantLimits:
    """Per-request and per-tenant caps; `None` = unlimited. Exceeding one answers a 4xx naming the cap and its
    value, before any large allocation (never 402). Caps a client can wait out answer 429 with Retry-After."""

    # ---- per request ----
    max_tokens_per_request: int | None = 32768  # tokens summed over a forward_backward's datums
    max_rows_per_request: int | None = 1024  # datums of one forward_backward
    max_num_samples: int | None = 64  # num_samples of one sample request
    max_sample_tokens: int | None = 4096  # max_tokens of one sample request (also bounded by the context)
    # k of top-k log-probs (per sampled token or prompt position) and of prompt alt-token draws, per request
    max_topk_logprobs: int | None = 64
    # prompt length x (top-k width | distinct target ids | alt draws) of one sample request, each: 2 Mi cells
    max_prompt_logprob_cells: int | None = 1 << 21
    # pixels of one image, read from its header; never above the decoder's own MAX_IMAGE_PIXELS (8192 x 8192)
    max_image_pixels: int | None = MAX_IMAGE_PIXELS
    # memory decoding a request's images takes, summed (width x height x 16 bytes each, service/images.py): 32 Mi pixels
    max_image_bytes_per_request: int | None = 512 * 1024 * 1024
    # ---- per tenant ----
    max_adapters: int | None = 8  # live training models at once (not waitable: 403)
    max_lora_rank: int | None = 128
    max_sessions: int | None = 64  # unfinished sessions (not waitable: 403; finish one first)
    max_pending_futures: int | None = 64  # requests queued or running at once (waitable: 429 + Retry-After)
    requests_per_minute: int | None = None

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    def merged(self, overrides: dict[str, Any], where: str = 'limits') -> TenantLimits:
        """A copy with only the keys named in `overrides` replaced (each a non-negative int or null)."""
        unknown = sorted(set(overrides) - set(self.names()))
        if unknown:
            raise ValueError(f'{where}: unknown limit(s) {unknown}; known: {", ".join(self.names())}')
        for key, value in overrides.items():
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ValueError(f'{where}: {key} must be a non-negative integer or null (unlimited), got {value!r}')
        return dataclasses.replace(self, **overrides)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TenantLimits:
        """The built-in defaults with `d`'s keys replaced."""
        return cls().merged(d)


def is_ip_or_network(text: str) -> bool:
    """An IP address, or a CIDR network without host bits (how uvicorn's proxy-header check reads it)."""
    try:
        ipaddress.ip_network(text) if '/' in text else ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


DEVICE_TYPES = ('cpu', 'cuda')
HUBS = ('ms', 'hf')
MESH_KEYS = ('dp_size', 'fsdp_size', 'tp_size', 'pp_size', 'cp_size', 'sp_size', 'ep_size')


@dataclass(frozen=True)
class HubPushConfig:
    """Pushing saved checkpoints to a model hub: the settings (checked by `config.loading`, used by `hub_push`)."""

    enabled: bool = False
    hub: str = 'ms'  # 'ms' (ModelScope) | 'hf' (Hugging Face)
    repo_prefix: str | None = None  # e.g. 'my-org/twinkle-': repositories are named from it
    private: bool = True
    token_env: str | None = None  # the environment variable holding the hub token (never the token itself)
    per_request: bool = False  # only checkpoints whose save request asks for a push are pushed


@dataclass(frozen=True)
class GroupSpec:
    """Ray device group of one role of a model: `ranks` processes (for a sampler group: per replica), each on one
    `device_type` device (None: CUDA when this machine has it, else CPU) and reserving, per rank, `num_cpus` /
    `num_gpus` Ray resources (None: 1 CPU, plus 1 GPU for CUDA) and any custom Ray `resources` (e.g.
    ``{'node_b': 1}`` to place the group on nodes that offer `node_b`)."""

    ranks: int = 1
    device_type: str | None = None
    num_cpus: float | None = None
    num_gpus: float | None = None
    resources: dict[str, float] | None = None

    def device_group(self, name: str) -> Any:
        """The `twinkle_core.mesh.DeviceGroup` named `name` for these settings."""
        from twinkle_core.mesh import DeviceGroup

        options = {
            k: v
            for k, v in (('num_cpus', self.num_cpus), ('num_gpus', self.num_gpus), ('resources', self.resources))
            if v is not None
        }
        return DeviceGroup(name=name, ranks=self.ranks, device_type=self.device_type, options=options)


@dataclass(frozen=True)
class RayConfig:
    """How the server reaches Ray: `address` None starts a local instance (with `num_cpus`), 'auto' joins the
    cluster this node belongs to, 'ray://host:10001' connects a client."""

    address: str | None = None
    namespace: str | None = None
    num_cpus: int | None = None


@dataclass(frozen=True)
class DeploymentConfig:
    """`mode`: 'embedded' (every model in the server process) or 'ray' (models in Ray device groups)."""

    mode: str = 'embedded'
    ray: RayConfig = field(default_factory=RayConfig)


@dataclass(frozen=True)
class ModelSpec:
    """One hosted base model: served as `name` from `path` (local directory or `ms://` / `hf://` id), trained by
    the model backend `backend` (registry name, built with `backend_args`) and sampled by `sampler` (built with
    `sampler_args`). `device` places an embedded model host; `train_group`, `mesh` (DeviceMesh.from_sizes sizes, None =
    data parallel over the group), `sampler_replicas` and `sampler_group` place it on Ray. `hub_push`: this model's
    effective push settings (the server's, with the model's overrides), None when pushing is not configured."""

    name: str
    path: str
    backend: str = 'MultiLoraTransformersModel'
    backend_args: dict[str, Any] = field(default_factory=dict)
    sampler: str = 'TorchSampler'
    sampler_args: dict[str, Any] = field(default_factory=dict)
    device: str | None = None
    train_group: GroupSpec = field(default_factory=GroupSpec)
    mesh: dict[str, int] | None = None
    sampler_replicas: int = 1
    sampler_group: GroupSpec = field(default_factory=GroupSpec)
    hub_push: HubPushConfig | None = None
    #: metrics loggers fed with this model's training runs, by name or ``{'name': ..., **arguments}``
    #: (`twinkle_server.service.model_loggers`)
    loggers: list[Any] = field(default_factory=list)

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

    def device_mesh(self) -> Any:
        """The `twinkle_core.mesh.DeviceMesh` of the training group (data parallel when `mesh` is None)."""
        from twinkle_core.mesh import DeviceMesh

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


@dataclass
class ServerConfig:
    """`models`: public name -> local directory (or a `ms://`/`hf://` id resolved at start-up).

    `model_specs` (name -> `ModelSpec`) is what model hosts are built from. Left empty, it is derived from `models` and
    the server-wide `backend*` / `sampler*` fields (the flags of `twinkle server start`); given (a config file),
    `models` is derived from it (or must agree with it)."""

    models: dict[str, str]
    data_dir: str
    host: str = '127.0.0.1'
    port: int = 8000
    max_body_bytes: int = 64 * 1024 * 1024
    #: memory for decoding images at once, server-wide (an image holds width x height x 16 bytes of it while it is
    #: decoded and processed, service/images.py): one that does not fit waits, then its request is answered 429; one
    #: larger than all of it is a 413. None = unbounded
    image_decode_budget_bytes: int | None = 1024 * 1024 * 1024
    #: server-side custom losses (engine/custom_loss/cost.py, docs/server.md): a graph's estimated work for one datum
    #: of a model's full context may be at most this fraction of the model's forward pass over that context
    #: (2 x parameters x context FLOPs) ...
    custom_loss_cost_factor: float = 0.25
    #: ... and at most this many GFLOPs (the loss runs on the CPU, however fast the model's device); None = no cap
    custom_loss_max_gflop: float | None = 4.0
    #: wall clock of one custom-loss evaluation (every datum of a request); past it the loss is stopped at its next
    #: node and disabled, and its tenant's custom losses are throttled (429) for a minute, doubling per offence
    custom_loss_time_s: float = 2.0
    long_poll_s: float = 30.0
    max_queued_samples: int = 256
    max_batch: int = 16
    session_ttl_s: float = 30 * 60
    #: the shortest checkpoint `ttl_seconds` accepted (save_state, copy_weights, set_checkpoint_ttl); the hosted
    #: service's bound is one hour
    min_checkpoint_ttl_s: float = 3600.0
    #: how often expired checkpoints are deleted (files and rows); they vanish from listings at once regardless
    checkpoint_sweep_s: float = 60.0
    #: how long work of a training model may wait for a missing earlier seq_id before it is failed
    seq_gap_timeout_s: float = 120.0
    #: failed logins within a minute, per client address and key id (`auth.LoginThrottle`), before 429
    max_failed_logins_per_minute: int = 30
    #: reverse proxies (IP addresses or CIDR networks) whose `X-Forwarded-For` names the client address; from
    #: any other peer the header is ignored (none by default)
    trusted_proxies: tuple[str, ...] = ()
    #: on SIGTERM/SIGINT, how long accepted work may finish before what is left is failed (docs/server.md)
    drain_timeout_s: float = 60.0
    #: directories (besides each hosted model's own) whose files native calls may name (e.g. set_template)
    allowed_roots: tuple[str, ...] = ()
    default_limits: TenantLimits = field(default_factory=TenantLimits)
    tenant_limits: dict[str, TenantLimits] = field(default_factory=dict)
    lora_alpha: float = 32.0
    #: (when `model_specs` is derived from `models`) the training backend of every hosted model, by registry name
    #: (kind `model`), and its constructor
    #: arguments (e.g. ``{'pass_strategy': 'mixed'}`` for a backend that declares pass strategies, such as
    #: MultiLoraTransformersModel: how queued work of several adapters splits into passes)
    backend: str = 'MultiLoraTransformersModel'
    backend_args: dict[str, Any] = field(default_factory=dict)
    #: the sampler serving Tinker sampling, by registry name (kind `sampler`), and its constructor arguments
    #: (e.g. ``{'engine_args': {'max_model_len': 4096}}`` for vLLMSampler)
    sampler: str = 'TorchSampler'
    sampler_args: dict[str, Any] = field(default_factory=dict)
    #: public name -> everything about one hosted model; the table model hosts are built from (class docstring)
    model_specs: dict[str, ModelSpec] = field(default_factory=dict)
    deployment: DeploymentConfig = field(default_factory=DeploymentConfig)
    #: `sqlite:///PATH` or `postgresql://user@host:port/db`; None = SQLite in `data_dir`
    database_url: str | None = None
    #: server-wide hub push settings (None: not configured); each `ModelSpec.hub_push` holds a model's effective ones
    hub_push: HubPushConfig | None = None

    def __post_init__(self) -> None:
        for proxy in self.trusted_proxies:
            if not is_ip_or_network(proxy):
                raise ValueError(f'trusted proxy {proxy!r} is not an IP address or network (e.g. 10.0.0.5, 10.0.0.0/8)')
        if not self.model_specs:
            self.model_specs = {
                name: ModelSpec(
                    name,
                    path,
                    backend=self.backend,
                    backend_args=dict(self.backend_args),
                    sampler=self.sampler,
                    sampler_args=dict(self.sampler_args),
                    hub_push=self.hub_push,
                )
                for name, path in self.models.items()
            }
        elif not self.models:
            self.models = {name: spec.path for name, spec in self.model_specs.items()}
        elif self.models != {name: spec.path for name, spec in self.model_specs.items()}:
            raise ValueError('ServerConfig: models and model_specs name different models or paths')
        if self.deployment.mode not in ('embedded', 'ray'):
            raise ValueError(f"ServerConfig: deployment.mode must be 'embedded' or 'ray', got {self.deployment.mode!r}")
        if self.deployment.mode == 'embedded':
            for spec in self.model_specs.values():
                if spec.ray_only_settings():
                    raise ValueError(
                        f'ServerConfig: model {spec.name!r} sets {", ".join(spec.ray_only_settings())}, '
                        f'which needs deployment.mode: ray'
                    )

    def limits(self, tenant: str) -> TenantLimits:
        return self.tenant_limits.get(tenant, self.default_limits)

    @staticmethod
    def parse_model(spec: str) -> tuple[str, str]:
        """`NAME=PATH` (serve PATH under the public alias NAME) or just `PATH` (its own name)."""
        if '=' in spec:
            name, path = spec.split('=', 1)
            if not name or not path:
                raise ValueError(f'--model {spec!r}: expected NAME=PATH')
            return name, path
        return spec.rstrip('/').split('/')[-1] if Path(spec).exists() else spec, spec

    @staticmethod
    def parse_json_object(text: str, option: str = '--sampler-args') -> dict[str, Any]:
        """`--sampler-args` / `--backend-args`: a JSON object."""
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f'{option}: not valid JSON: {exc}') from None
        if not isinstance(value, dict):
            raise ValueError(f'{option}: expected a JSON object, got {type(value).__name__}')
        return value

    @staticmethod
    def load_limits(path: str | None) -> tuple[TenantLimits, dict[str, TenantLimits]]:
        """A JSON file `{"default": {...}, "tenants": {"name": {...}}}`, merged key by key (module docstring)."""
        if not path:
            return TenantLimits(), {}
        try:
            raw = json.loads(Path(path).read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f'--limits {path}: not valid JSON: {exc}') from None
        if not isinstance(raw, dict) or set(raw) - {'default', 'tenants'}:
            raise ValueError(f'--limits {path}: expected {{"default": {{...}}, "tenants": {{"name": {{...}}}}}}')
        default = TenantLimits().merged(raw.get('default') or {}, f'--limits {path} default')
        tenants = {
            name: default.merged(entry or {}, f'--limits {path} tenants.{name}')
            for name, entry in (raw.get('tenants') or {}).items()
        }
        return default, tenants
