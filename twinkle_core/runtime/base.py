"""The Runtime interface: where components live (this process, Ray actors, an HTTP server)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any


class Runtime(ABC):
    name: str = ''

    @abstractmethod
    def start(self, *, groups: list[Any] | None = None, global_device_mesh: Any = None, **kwargs: Any) -> None:
        """Bring the runtime up (idempotent)."""

    @abstractmethod
    def build(
        self,
        cls: type,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        remote_group: str | None = None,
        device_mesh: Any = None,
    ) -> Any:
        """Construct a component of class `cls` (locally, or as a proxy to remote workers)."""

    def weight_sync(self, model: Any, sampler: Any, **options: Any) -> Any | None:
        """A weight sync between a model and a sampler this runtime hosts apart (an object whose
        ``sync_weights(merge_and_sync=)`` returns `SyncReport` fields), or None when it does not host them so:
        `CheckpointEngineManager(model=, sampler=)` then syncs in this process."""
        return None

    def reset_group(self, name: str) -> None:
        """Stop the workers of device group `name`, dead or alive (e.g. after one crashed): the next component
        built into it starts fresh ones. Runtimes without device groups have nothing to reset."""

    def shutdown(self) -> None:
        """Release workers and connections."""
