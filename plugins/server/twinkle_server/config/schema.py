"""The tables of known keys the loader checks a config file against, section by section.

The keys of `server`, `storage`, `models`, `hub_push`, `deployment` and the device groups come from their
declarations on the settings fields (`options.rules_of`); the sections that set no field one to one (`auth`,
`limits`, `mesh`) are declared here.
"""

from __future__ import annotations

from twinkle_server.config.model_settings import DeploymentConfig, GroupSpec, HubPushConfig, ModelSpec, RayConfig
from twinkle_server.config.options import rules_of
from twinkle_server.config.rules import LIMIT, MESH_KEYS, Rule, int_rule
from twinkle_server.config.settings import ServerConfig, TenantLimits

TOP = ('server', 'storage', 'auth', 'limits', 'deployment', 'hub_push', 'models')
SERVER: dict[str, Rule] = rules_of(ServerConfig, 'server')
STORAGE: dict[str, Rule] = rules_of(ServerConfig, 'storage')
AUTH: dict[str, Rule] = {
    'api_keys_required': Rule(
        (bool,),
        'true: every request carries a key from `twinkle server keys create`',
        lambda v: v is True,
        problem='not supported',
    )
}
DEPLOYMENT: dict[str, Rule] = rules_of(DeploymentConfig)
RAY: dict[str, Rule] = rules_of(RayConfig)
HUB_PUSH: dict[str, Rule] = rules_of(HubPushConfig)
MODEL: dict[str, Rule] = rules_of(ModelSpec)
TRAIN_GROUP: dict[str, Rule] = rules_of(GroupSpec)
#: a sampler group's `ranks` is per replica, and the file says so
SAMPLER_GROUP: dict[str, Rule] = {('ranks_per_replica' if k == 'ranks' else k): r for k, r in TRAIN_GROUP.items()}
MESH: dict[str, Rule] = {key: int_rule(1) for key in MESH_KEYS}
LIMITS = ('default', 'tenants')
LIMIT_VALUES: dict[str, Rule] = {name: LIMIT for name in TenantLimits.names()}
