"""The curated index (`registry/*.toml`) and the pyproject entry points name the same first-party components.

Both are written by hand: an entry point registers a name once its distribution is installed (resolution step 2),
the index says which distribution to `pip install` while it is not (step 3). For every distribution in this repo
(`pyproject.toml` = twinkle-core, `plugins/*/pyproject.toml`) the test reads the ``twinkle.<kind>`` entry-point
groups and checks, kind by kind and distribution by distribution:

- a plugin's component entry points and the index's ``distribution = ...`` entries for it list the same names;
- twinkle-core lists nothing in the index: it is always installed, so its entry points always answer first;
- ``twinkle.hooks`` is not a component kind (hooks are not resolved by name), so it has no index entries;
- the index names distributions outside this repo only in `PLANNED`.

`PLANNED`: distributions the index may name that are not in this repo yet -- a first-party backend that is
planned (README, docs/plugins.md) can be indexed before its code lands, so that resolving its names prints the
pip line to run. None today: twinkle-megatron, the last planned one, now lives in plugins/megatron. Add a name
here when the index lists a distribution ahead of its plugin; remove it once the plugin exists under plugins/,
and this test checks its entry points like the others. (The "indexed but not installed" behaviour itself is
tested with a made-up component in an isolated index: tests/core/test_registry.py and friends.)
"""

from __future__ import annotations

import tomllib
from collections import defaultdict
from pathlib import Path

from core_helpers import REPO_ROOT

from twinkle_core.registry import KINDS

CORE = 'twinkle-core'
PLANNED: set[str] = set()
NOT_COMPONENTS = {'hooks'}  # `twinkle.hooks`: pluggy hook implementations, found by group, never by name

Listing = dict[tuple[str, str], set[str]]  # (distribution, kind) -> names


def _pyprojects() -> list[Path]:
    return [REPO_ROOT / 'pyproject.toml', *sorted(REPO_ROOT.glob('plugins/*/pyproject.toml'))]


def _entry_points() -> Listing:
    out: Listing = defaultdict(set)
    for path in _pyprojects():
        project = tomllib.loads(path.read_text())['project']
        for group, names in project.get('entry-points', {}).items():
            prefix, _, kind = group.partition('.')
            if prefix == 'twinkle':
                out[project['name'], kind] |= set(names)
    return dict(out)


def _index() -> Listing:
    out: Listing = defaultdict(set)
    for path in sorted((REPO_ROOT / 'registry').glob('*.toml')):
        for item in tomllib.loads(path.read_text()).get('component', []):
            if item.get('distribution'):
                out[item['distribution'], item['kind']].add(item['name'])
    return dict(out)


def _distributions() -> set[str]:
    return {tomllib.loads(p.read_text())['project']['name'] for p in _pyprojects()}


def test_entry_point_groups_are_known_kinds() -> None:
    unknown = {(dist, kind) for dist, kind in _entry_points() if kind not in KINDS and kind not in NOT_COMPONENTS}
    assert not unknown, f'entry-point groups twinkle.<kind> with no such kind (a typo?): {sorted(unknown)}'


def test_index_lists_exactly_the_plugins_component_entry_points() -> None:
    def plugin_components(listing: Listing) -> Listing:  # core, hooks, planned: checked by the tests below
        return {
            key: names
            for key, names in listing.items()
            if key[0] != CORE and key[0] not in PLANNED and key[1] not in NOT_COMPONENTS
        }

    declared, indexed = plugin_components(_entry_points()), plugin_components(_index())
    for key in sorted(declared.keys() | indexed.keys()):
        dist, kind = key
        in_pyproject, in_index = declared.get(key, set()), indexed.get(key, set())
        assert in_pyproject == in_index, (
            f'{dist}, kind {kind!r}: entry points only {sorted(in_pyproject - in_index)}, registry/ only '
            f'{sorted(in_index - in_pyproject)}; list every plugin component in both places'
        )


def test_core_and_hooks_have_no_index_entries() -> None:
    listed = {key: names for key, names in _index().items() if key[0] == CORE or key[1] in NOT_COMPONENTS}
    assert not listed, f'registry/ lists {listed}: twinkle-core and hooks are found through entry points only'


def test_index_names_no_distribution_outside_the_repo_but_the_planned_ones() -> None:
    in_repo = _distributions()
    assert {
        CORE,
        'twinkle-transformers',
        'twinkle-ray',
        'twinkle-client',
        'twinkle-server',
        'twinkle-megatron',
    } <= in_repo
    assert not PLANNED & in_repo, f'{sorted(PLANNED & in_repo)} are in this repo now: remove them from PLANNED'
    outside = {dist for dist, _ in _index()} - in_repo
    assert outside == PLANNED, (
        f'registry/ names distributions not in this repo: {sorted(outside - PLANNED)} '
        f'(a typo, or a new planned one to add to PLANNED); planned ones now in the repo '
        f'or no longer listed: {sorted(PLANNED - outside)} (remove them from PLANNED)'
    )


def test_no_name_is_registered_twice_for_one_kind() -> None:
    owners: dict[tuple[str, str], set[str]] = defaultdict(set)
    for listing in (_entry_points(), _index()):
        for (dist, kind), names in listing.items():
            for name in names:
                owners[kind, name].add(dist)
    clashes = {key: sorted(dists) for key, dists in owners.items() if len(dists) > 1}
    assert not clashes, f'one name of one kind from several distributions (the first installed wins): {clashes}'
