"""Server settings: `ServerConfig` (the `server` and `storage` sections of the config file, the hosted models,
limits, deployment) and `TenantLimits` (the `limits` section).

`ServerConfig` is what the server runs from; `twinkle server start` builds it from flags or from one YAML file
(`loading.load_server_config`, docs/deployment.md). Each file key (and the flag that sets it) is declared once, on its
field (`options.option`). Each hosted base model is a `ModelSpec` (`model_settings`); `ServerConfig.model_specs` is
the one table model hosts are built from.

Limits come in one table (`Limits`) with built-in defaults sized for a small machine (2 cores, ~24 GiB: one
`forward_backward` of 32k tokens on a 0.6B model stays well inside memory). `--limits FILE` overrides them key by
key: `{"default": {...}, "tenants": {"alice": {...}}}`. The `default` entry overrides only the keys it names in
the built-in table, and a tenant's entry only the keys it names in the (overridden) default. `null` = unlimited.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from twinkle_core.template.images import MAX_IMAGE_PIXELS
from twinkle_server.config.model_settings import DeploymentConfig, HubPushConfig, ModelSpec
from twinkle_server.config.options import option, parse_json_object
from twinkle_server.config.rules import (
    ADDRESSES,
    DIRECTORIES,
    POSITIVE,
    POSITIVE_OR_NULL,
    Rule,
    choice_rule,
    int_rule,
    is_ip_or_network,
    text_rule,
)
from twinkle_server.logs import LOG_FORMATS

MIB = 1024 * 1024
server_option = functools.partial(option, section='server')
storage_option = functools.partial(option, section='storage')


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


@dataclass
class ServerConfig:
    """`models`: public name -> local directory (or a `ms://`/`hf://` id resolved at start-up).

    `model_specs` (name -> `ModelSpec`) is what model hosts are built from. Left empty, it is derived from `models` and
    the server-wide `backend*` / `sampler*` fields (the flags of `twinkle server start`); given (a config file),
    `models` is derived from it (or must agree with it)."""

    models: dict[str, str]
    data_dir: str = storage_option(
        rule=text_rule('a directory for metadata and checkpoints'),
        meaning='checkpoints (and the SQLite metadata file `server.db` unless `database_url` says otherwise); '
        'created if missing',
        flag='--data-dir',
    )
    host: str = server_option(
        '127.0.0.1',
        rule=text_rule(),
        meaning='address to listen on (`0.0.0.0`: every interface; put TLS in front)',
        flag='--host',
    )
    port: int = server_option(8000, rule=int_rule(1, 65535), meaning='1..65535', flag='--port')
    max_body_bytes: int = server_option(
        64 * MIB,
        key='max_body_mb',
        scale=MIB,
        rule=POSITIVE,
        meaning='largest accepted request body, in MiB (checked on `Content-Length` and while chunked bodies stream)',
        flag='--max-body-mb',
    )
    long_poll_s: float = server_option(
        30.0,
        rule=Rule(
            (int, float), 'seconds > 0 and < 45 (the tinker SDK gives up on a poll after 45 s)', lambda v: 0 < v < 45
        ),
        meaning="how long `retrieve_future` waits for a result before answering `try_again` (under 45 s: the SDK's "
        'poll timeout)',
    )
    session_ttl_s: float = server_option(
        30 * 60.0, rule=POSITIVE, meaning='a session without heartbeats for this long is closed'
    )
    seq_gap_timeout_s: float = server_option(
        120.0,
        rule=POSITIVE,
        meaning='how long work of a training model waits for a missing earlier `seq_id` before it is failed',
        flag='--seq-gap-timeout',
        metavar='SECONDS',
    )
    drain_timeout_s: float = server_option(
        60.0,
        rule=POSITIVE,
        meaning='on SIGTERM/SIGINT, how long accepted work may still run before what is left is failed clearly '
        '(docs/server.md, "Operations")',
    )
    max_failed_logins_per_minute: int = server_option(
        30,
        rule=int_rule(1),
        meaning='failed logins within a minute, per client address and key id (a separate count per address for '
        "unknown keys), before further tries are answered 429; a valid key is never blocked by others' guesses",
        flag='--max-failed-logins',
        metavar='N',
    )
    trusted_proxies: tuple[str, ...] = server_option(
        (),
        rule=ADDRESSES,
        meaning='reverse proxies (IP addresses or CIDR networks) whose `X-Forwarded-For` names the client address; '
        'from any other peer the header is ignored',
        flag='--trusted-proxy',
        metavar='ADDR',
    )
    max_queued_samples: int = server_option(
        256, rule=int_rule(1), meaning='sample requests queued per model; more answer 429', flag='--max-queued-samples'
    )
    max_batch: int = server_option(
        16,
        rule=int_rule(1),
        meaning='most requests of different tenants joined into one forward/backward pass or one sampler batch',
    )
    allowed_roots: tuple[str, ...] = server_option(
        (),
        rule=DIRECTORIES,
        meaning="existing directories (besides each model's own) whose files native calls may name",
        flag='--allow-path',
        metavar='DIR',
    )
    image_decode_budget_bytes: int | None = server_option(
        1024 * MIB,
        key='image_decode_budget_mb',
        scale=MIB,
        rule=POSITIVE_OR_NULL,
        meaning='memory for decoding images at once, server-wide (an image of W x H pixels holds W x H x 16 bytes '
        'while it is decoded); an image that does not fit waits up to 10 s, then its request is answered 429 with '
        '`Retry-After`; one larger than all of it is a 413; `null` = unbounded',
    )
    min_checkpoint_ttl_s: float = server_option(
        3600.0,
        rule=POSITIVE,
        meaning='the shortest checkpoint `ttl_seconds` accepted (`save_state`, `save_weights_for_sampler`, '
        "`save_weights_external`, `copy_weights`, `set_checkpoint_ttl`); the hosted service's bound is one hour, "
        'the longest is 10 years',
    )
    checkpoint_sweep_s: float = server_option(
        60.0,
        rule=POSITIVE,
        meaning='how often expired checkpoints are deleted, files and rows (they leave listings and lookups the '
        'moment they expire)',
    )
    custom_loss_cost_factor: float = server_option(
        0.25,
        rule=POSITIVE,
        meaning="a server-side custom loss's estimated work for one datum of a model's full context (priced per op "
        'from its shapes, docs/server.md "Custom losses") may be at most this fraction of the model\'s forward pass '
        'over that context (2 x parameters x context FLOPs); a graph over it is refused at `create_custom_loss` '
        '(422 naming its costliest node)',
    )
    custom_loss_max_gflop: float | None = server_option(
        4.0,
        rule=POSITIVE_OR_NULL,
        meaning="... and at most this many GFLOPs per full context of tokens, whatever the model's size (custom "
        'losses run on the CPU); `null` = only the relative bound',
    )
    custom_loss_time_s: float = server_option(
        2.0,
        rule=POSITIVE,
        meaning='wall clock of one custom-loss evaluation (every datum of a request); past it the loss is stopped at '
        "its next node and disabled (later uses: 422 naming it) and its tenant's custom-loss requests are answered "
        '429 for 60 s, doubling per offence up to an hour',
    )
    log_format: str = server_option(
        'text',
        rule=choice_rule(*LOG_FORMATS),
        meaning='log lines on stderr: `text`, or `json` (one object per line with `request_id`, `tenant`, `model`)',
        flag='--log-format',
    )
    database_url: str | None = storage_option(
        None,
        rule=text_rule('a database URL or null', nullable=True),
        meaning='the metadata database: `null` = SQLite in `data_dir`; `sqlite:///PATH.db`; '
        '`postgresql://USER[:PASSWORD]@HOST[:PORT]/DB` (also `postgres://`; needs `pip install '
        "'twinkle-server[postgres]'`); a password can come from the environment: "
        '`postgresql://twinkle:${DB_PASSWORD}@db/twinkle`',
        flag='--database-url',
        metavar='URL',
    )
    default_limits: TenantLimits = field(default_factory=TenantLimits)
    tenant_limits: dict[str, TenantLimits] = field(default_factory=dict)
    lora_alpha: float = 32.0
    #: (when `model_specs` is derived from `models`: the flags of `twinkle server start`) every hosted model's
    #: backend, sampler and their arguments, as `ModelSpec` declares them
    backend: str = ModelSpec.backend
    backend_args: dict[str, Any] = field(default_factory=dict)
    sampler: str = ModelSpec.sampler
    sampler_args: dict[str, Any] = field(default_factory=dict)
    #: public name -> everything about one hosted model; the table model hosts are built from (class docstring)
    model_specs: dict[str, ModelSpec] = field(default_factory=dict)
    deployment: DeploymentConfig = field(default_factory=DeploymentConfig)
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
        return parse_json_object(text, option)

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
