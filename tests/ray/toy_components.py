"""A small real torch component with the Model interface's training subset (real nn.Module, real gloo DDP).

Used to test the Ray runtime's dispatch/collect machinery independently of the Transformers backend.
"""

from __future__ import annotations

from typing import Any

import torch

from twinkle_core.dispatch import remote_method
from twinkle_core.runtime import distributed
from twinkle_core.runtime.context import HostedComponentMeta, global_device_mesh


class LinearRegressor(metaclass=HostedComponentMeta):
    """y = w.x + b trained with a token-mean-like MSE; data parallel (composable DDP) under a process group."""

    def __init__(self, dim: int = 4, seed: int = 0, lr: float = 0.1, device_mesh: Any = None) -> None:
        torch.manual_seed(seed)
        self.net = torch.nn.Linear(dim, 1)
        self.mesh = device_mesh or global_device_mesh()
        if self.mesh is not None and self.mesh.world_size > 1:
            from torch.distributed._composable.replicate import replicate

            replicate(self.net)
        self.opt = torch.optim.SGD(self.net.parameters(), lr=lr)

    @remote_method('slice_dp', 'mean')
    def forward_backward(self, *, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        x = torch.tensor([r['x'] for r in inputs], dtype=torch.float32)
        y = torch.tensor([r['y'] for r in inputs], dtype=torch.float32)
        loss = ((self.net(x).squeeze(-1) - y) ** 2).mean()
        (loss * distributed.data_parallel_loss_scale(len(inputs))).backward()
        return {
            'loss': distributed.weighted_mean(loss.item(), len(inputs)),
            'rank_of_row': [distributed.get_rank()] * len(inputs),
        }

    @remote_method('all', 'first')
    def clip_grad_and_step(self) -> dict[str, Any]:
        self.opt.step()
        self.opt.zero_grad()
        return {'step': 1}

    @remote_method('all', 'list', mutates=False)
    def weights(self) -> list[float]:
        return [float(v) for v in torch.cat([p.detach().reshape(-1) for p in self.net.parameters()])]

    def reset(self) -> None:
        """Deliberately not a remote method."""
        self.opt.zero_grad()

    @remote_method('all', 'list', mutates=False)
    def world(self) -> tuple[int, int]:
        return distributed.get_rank(), distributed.get_world_size()

    @remote_method('all', 'first')
    def fail_on_rank(self, rank: int) -> None:
        """Raises on `rank`; the other ranks wait in a collective that never completes."""
        if distributed.get_rank() == rank:
            raise ValueError(f'deliberate failure on rank {rank}')
        distributed.barrier()


class RowSource(metaclass=HostedComponentMeta):
    """Yields this data rank's slice of fixed global batches (like a sharded DataLoader)."""

    def __init__(self, batches: list[list[dict[str, Any]]], device_mesh: Any = None) -> None:
        from twinkle_core.dispatch import split_for_dp

        mesh = device_mesh or global_device_mesh()
        rank = distributed.get_rank()
        world, data_rank = (mesh.data_world_size, mesh.data_rank(rank)) if mesh else (1, 0)
        self.batches = [split_for_dp(b, world)[data_rank] for b in batches]

    def __iter__(self):
        return iter(self.batches)


def make_batches(num_batches: int = 4, batch_size: int = 6, dim: int = 4, seed: int = 1) -> list[list[dict]]:
    g = torch.Generator().manual_seed(seed)
    w_true = torch.randn(dim, generator=g)
    out = []
    for _ in range(num_batches):
        x = torch.randn(batch_size, dim, generator=g)
        y = x @ w_true + 0.5
        out.append([{'x': xi.tolist(), 'y': float(yi)} for xi, yi in zip(x, y)])
    return out
