"""`get_device_placement`: where this script's components run, as text (the Twinkle documents log it)."""

from __future__ import annotations

import os

from twinkle_core.runtime.context import current_runtime, device_groups, global_device_mesh


def get_device_placement() -> str:
    """The runtime, this process's rank (under torchrun), the global device mesh and the device groups."""
    runtime = current_runtime()
    lines = [f'runtime: {runtime.name if runtime is not None else "none (call twinkle_core.initialize)"}']
    if 'RANK' in os.environ:
        lines.append(
            f'rank {os.environ["RANK"]} of {os.environ.get("WORLD_SIZE", "?")} '
            f'(local rank {os.environ.get("LOCAL_RANK", "?")})'
        )
    mesh = global_device_mesh()
    if mesh is not None:
        lines.append(f'global mesh: {mesh!r}')
    for group in device_groups():
        lines.append(f'group {group.name!r}: ranks {group.ranks} on {group.device_type}')
    return '\n'.join(lines)
