"""twinkle-ray: the Ray runtime of twinkle_core (``initialize(mode='ray', groups=[DeviceGroup(...)])``).

Registered through the entry point ``ray = "twinkle_ray.runtime:RayRuntime"`` (group ``twinkle.runtime``).
Importing this package does not import Ray; `twinkle_ray.proxy` / `twinkle_ray.group` do.
"""

from twinkle_ray.errors import GroupBrokenError, RemoteCallError

__all__ = ['GroupBrokenError', 'RemoteCallError']
