"""The schema of the server's config file: which keys each section takes and what their values must be.

`loading` checks a file against these tables; `docs/deployment.md` describes every key (a test holds the
two equal).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

from twinkle_server.config.settings import DEVICE_TYPES, HUBS, MESH_KEYS, is_ip_or_network


@dataclass(frozen=True)
class Rule:
    """What a value must be: one of `types` (bool is never an int) and `ok`; `expected` says so in words."""

    types: tuple[type, ...]
    expected: str
    ok: Callable[[Any], bool] = lambda value: True
    nullable: bool = False
    problem: str = 'out of range'


def int_rule(lo: int, hi: int | None = None, nullable: bool = False) -> Rule:
    words = f'an integer from {lo} to {hi}' if hi is not None else f'an integer >= {lo}'
    return Rule(
        (int,), words + (' or null' if nullable else ''), lambda v: v >= lo and (hi is None or v <= hi), nullable
    )


def number_rule(lo: float, inclusive: bool, nullable: bool = False) -> Rule:
    words = f'a number {">=" if inclusive else ">"} {lo:g}' + (' or null' if nullable else '')
    return Rule((int, float), words, lambda v: v >= lo if inclusive else v > lo, nullable)


def choice_rule(*choices: str, nullable: bool = False, fold: bool = False) -> Rule:
    words = 'one of ' + ', '.join(choices) + (', or null' if nullable else '')
    return Rule((str,), words, lambda v: (v.lower() if fold else v) in choices, nullable, 'not allowed')


def text_rule(expected: str = 'a non-empty string', pattern: str = r'.+', nullable: bool = False) -> Rule:
    return Rule((str,), expected, lambda v: re.fullmatch(pattern, v, re.S) is not None, nullable, 'not allowed')


BOOL = Rule((bool,), 'true or false')
MAPPING = Rule((dict,), 'a mapping of names to values')
LIST = Rule((list,), 'a list of directories')
ADDRESSES = Rule((list,), 'a list of IP addresses or networks')
PROXY = Rule(
    (str,),
    'an IP address or network, e.g. 10.0.0.5 or 10.0.0.0/8',
    is_ip_or_network,
    problem='not an IP address or network',
)
POSITIVE = number_rule(0, inclusive=False)
DEVICE_TYPE = choice_rule(*DEVICE_TYPES, 'gpu', nullable=True, fold=True)
RESOURCES = {
    'num_cpus': number_rule(0, inclusive=False, nullable=True),
    'num_gpus': number_rule(0, True, nullable=True),
    'resources': Rule((dict,), 'a mapping of Ray resource names to amounts per rank', nullable=True),
}
AMOUNT = number_rule(0, inclusive=True)
LIMIT = int_rule(0, nullable=True)

TOP = ('server', 'storage', 'auth', 'limits', 'deployment', 'hub_push', 'models')
SERVER: dict[str, Rule] = {
    'host': text_rule(),
    'port': int_rule(1, 65535),
    'max_body_mb': POSITIVE,
    'long_poll_s': Rule(
        (int, float), 'seconds > 0 and < 45 (the tinker SDK gives up on a poll after 45 s)', lambda v: 0 < v < 45
    ),
    'session_ttl_s': POSITIVE,
    'seq_gap_timeout_s': POSITIVE,
    'max_failed_logins_per_minute': int_rule(1),
    'max_queued_samples': int_rule(1),
    'max_batch': int_rule(1),
    'allowed_roots': LIST,
    'drain_timeout_s': POSITIVE,
    'trusted_proxies': ADDRESSES,
    'image_decode_budget_mb': number_rule(0, inclusive=False, nullable=True),
    'min_checkpoint_ttl_s': POSITIVE,
    'checkpoint_sweep_s': POSITIVE,
    'custom_loss_cost_factor': POSITIVE,
    'custom_loss_max_gflop': number_rule(0, inclusive=False, nullable=True),
    'custom_loss_time_s': POSITIVE,
}
STORAGE: dict[str, Rule] = {
    'data_dir': text_rule('a directory for metadata and checkpoints'),
    'database_url': text_rule('a database URL or null', nullable=True),
}
AUTH: dict[str, Rule] = {
    'api_keys_required': Rule(
        (bool,),
        'true: every request carries a key from `twinkle server keys create`',
        lambda v: v is True,
        problem='not supported',
    )
}
DEPLOYMENT: dict[str, Rule] = {'mode': choice_rule('embedded', 'ray'), 'ray': MAPPING}
RAY: dict[str, Rule] = {
    'address': text_rule(
        "null (start Ray here), 'auto', 'ray://HOST:PORT' or 'HOST:PORT'", r'auto|ray://\S+|[\w.-]+:\d+', nullable=True
    ),
    'namespace': text_rule(nullable=True),
    'num_cpus': int_rule(1, nullable=True),
}
HUB_PUSH: dict[str, Rule] = {
    'enabled': BOOL,
    'hub': choice_rule(*HUBS),
    'private': BOOL,
    'repo_prefix': text_rule(
        "'NAMESPACE' or 'NAMESPACE/NAME-PREFIX' (a hub user or organization)",
        r'[A-Za-z0-9][A-Za-z0-9._-]*(/.*)?',
        nullable=True,
    ),
    'token_env': text_rule(
        'the NAME of an environment variable holding the token', r'[A-Za-z_][A-Za-z0-9_]*', nullable=True
    ),
    'per_request': BOOL,
}
MODEL: dict[str, Rule] = {
    'name': text_rule(),
    'path': text_rule('a model directory or an ms:// / hf:// id'),
    'backend': text_rule(),
    'backend_args': MAPPING,
    'sampler': text_rule(),
    'sampler_args': MAPPING,
    'device': text_rule('cpu, cuda, cuda:N or null', r'cpu|cuda(:\d+)?', nullable=True),
    'train_group': MAPPING,
    'mesh': Rule((dict,), 'a mapping of mesh sizes', nullable=True),
    'sampler_replicas': int_rule(1),
    'sampler_group': MAPPING,
    'hub_push': MAPPING,
    'loggers': Rule(
        (list,),
        'a list of metrics logger names (wandb, swanlab, tensorboard, jsonl, console) or {name: NAME, ...} mappings',
        lambda v: all(isinstance(x, str) or (isinstance(x, dict) and isinstance(x.get('name'), str)) for x in v),
        problem='not a list of logger names or {name: ...} mappings',
    ),
}
TRAIN_GROUP: dict[str, Rule] = {'ranks': int_rule(1), 'device_type': DEVICE_TYPE, **RESOURCES}
SAMPLER_GROUP: dict[str, Rule] = {'ranks_per_replica': int_rule(1), 'device_type': DEVICE_TYPE, **RESOURCES}
MESH: dict[str, Rule] = {key: int_rule(1) for key in MESH_KEYS}
LIMITS = ('default', 'tenants')
