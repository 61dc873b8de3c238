"""What a config value must be: `Rule` (types, a check, the words that say so in an error) and the named values
the rules check against. A leaf module: the settings declare their keys with these rules (`options`), the loader
checks a file with them (`loading`)."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Any, Callable

DEVICE_TYPES = ('cpu', 'cuda')
HUBS = ('ms', 'hf')
MESH_KEYS = ('dp_size', 'fsdp_size', 'tp_size', 'pp_size', 'cp_size', 'sp_size', 'ep_size')


def is_ip_or_network(text: str) -> bool:
    """An IP address, or a CIDR network without host bits (how uvicorn's proxy-header check reads it)."""
    try:
        ipaddress.ip_network(text) if '/' in text else ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class Rule:
    """What a value must be: one of `types` (bool is never an int) and `ok`; `expected` says so in words."""

    types: tuple[type, ...]
    expected: str
    ok: Callable[[Any], bool] = lambda value: True
    nullable: bool = False
    problem: str = 'out of range'

    def problem_with(self, value: Any) -> str | None:
        """None when `value` passes, else what is wrong with it (`expected` says what would pass)."""
        if value is None and self.nullable:
            return None
        if not isinstance(value, self.types) or (isinstance(value, bool) and bool not in self.types):
            return wrong_type(value)
        if not self.ok(value):
            return f'{self.problem}: {yaml_text(value)}'
        return None


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
NULLABLE_MAPPING = Rule((dict,), 'a mapping of names to values, or null', nullable=True)
DIRECTORIES = Rule((list,), 'a list of directories')
ADDRESSES = Rule((list,), 'a list of IP addresses or networks')
PROXY = Rule(
    (str,),
    'an IP address or network, e.g. 10.0.0.5 or 10.0.0.0/8',
    is_ip_or_network,
    problem='not an IP address or network',
)
POSITIVE = number_rule(0, inclusive=False)
POSITIVE_OR_NULL = number_rule(0, inclusive=False, nullable=True)
AMOUNT = number_rule(0, inclusive=True)
LIMIT = int_rule(0, nullable=True)
DEVICE_TYPE = choice_rule(*DEVICE_TYPES, 'gpu', nullable=True, fold=True)


def kind_of(value: Any) -> str:
    """The YAML name of `value`'s type: null, boolean, integer, number, string, list, mapping."""
    for types, name in (
        (type(None), 'null'),
        (bool, 'boolean'),
        (int, 'integer'),
        (float, 'number'),
        (str, 'string'),
        (list, 'list'),
        (dict, 'mapping'),
    ):
        if isinstance(value, types):
            return name
    return type(value).__name__


def yaml_text(value: Any) -> str:
    """`value` as the file spells it (true, null, 'text'), cut to 60 characters."""
    text = (
        {True: 'true', False: 'false', None: 'null'}.get(value, repr(value))
        if value is None or isinstance(value, bool)
        else repr(value)
    )
    return text if len(text) <= 60 else text[:57] + '...'


def wrong_type(value: Any) -> str:
    """The problem of a value of the wrong type: `wrong type: got integer 5` (a mapping or list is not shown)."""
    shown = '' if value is None or isinstance(value, (dict, list)) else f' {yaml_text(value)}'
    return f'wrong type: got {kind_of(value)}{shown}'
