"""Which mesh dimensions a model backend implements, and the one check that refuses the others.

A backend declares them in `ModelCapabilities.mesh_dims` (and, optionally, what to use instead of the ones it
lacks in `mesh_advice`). A mesh asking for more than one rank along any other dimension is refused -- by the
backend's constructor (`check_mesh_support`) and by the server's config check (`mesh_problem`) -- with an error
naming the dimension and the backend; a size is never silently ignored.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from twinkle_core.errors import MeshError

if TYPE_CHECKING:
    from twinkle_core.model.base import Model, ModelCapabilities

#: every mesh dimension, with what it splits
MESH_DIMS: dict[str, str] = {
    'dp': 'data parallel',
    'fsdp': 'fully sharded data parallel',
    'tp': 'tensor parallel',
    'pp': 'pipeline parallel',
    'cp': 'context / sequence parallel',
    'ep': 'expert parallel',
}

__all__ = ['MESH_DIMS', 'check_mesh_support', 'mesh_problem', 'mesh_sizes']


def mesh_sizes(mesh: Any) -> dict[str, int]:
    """``{dim: size}`` of a `DeviceMesh` (its ``sizes`` plus ``ep``), or of a ``{'dp_size': 2, ...}`` mapping (the
    ``DeviceMesh.from_sizes`` arguments, as in a server config); None: one rank, nothing."""
    if mesh is None:
        return {}
    if isinstance(mesh, Mapping):
        sizes = {str(k).removesuffix('_size'): int(v) for k, v in mesh.items() if v is not None}
        if 'sp' in sizes:  # `DeviceMesh.from_sizes`' other name for cp
            sizes['cp'] = max(sizes.pop('sp'), sizes.get('cp', 1))
        return sizes
    return {**mesh.sizes, 'ep': int(getattr(mesh, 'ep_size', 1))}


def mesh_problem(backend: str, caps: ModelCapabilities, mesh: Any) -> str | None:
    """Why `backend` (declaring `caps`) cannot train over `mesh`, or None: the first dimension of size > 1 that
    it does not declare in `caps.mesh_dims`."""
    advice = dict(caps.mesh_advice)
    for dim, size in mesh_sizes(mesh).items():
        if size > 1 and dim not in caps.mesh_dims:
            implemented = ', '.join(f'{d}_size' for d in MESH_DIMS if d in caps.mesh_dims) or 'none'
            hint = advice.get(dim, f'use a mesh with {dim}_size=1')
            return (
                f'{dim}_size={size} ({MESH_DIMS.get(dim, dim)}) is not implemented by {backend} '
                f'(it implements: {implemented}); {hint}.'
            )
    return None


def check_mesh_support(backend: type[Model], mesh: Any) -> None:
    """Raise `MeshError` when the model class `backend` does not implement a dimension `mesh` splits over."""
    problem = mesh_problem(backend.__name__, backend.capabilities, mesh)
    if problem is not None:
        raise MeshError(problem)
