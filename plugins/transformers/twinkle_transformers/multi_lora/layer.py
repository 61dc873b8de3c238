"""`MultiLoraLinear`: a frozen `nn.Linear` plus any number of LoRA adapters applied per token.

    y = base(x) + sum over adapters a of  scale_a * B_a(A_a(dropout_a(x[tokens of a])))

Tokens are routed by the shared `AdapterRouter`: the adapter tokens sorted by adapter (a view when the batch is
already laid out tenant after tenant, else one gather), then one small matmul pair per adapter on its contiguous
segment, added into the base output in place -- one autograd node for all adapters (`segmented.py`). Each adapter
has its own rank, alpha, dropout and scaling; an adapter that does not target this module simply has no entry here
(its tokens get the base output). Gradients of an adapter's A/B come only from its own tokens.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from twinkle_transformers.multi_lora.routing import AdapterRouter
from twinkle_transformers.multi_lora.segmented import segmented_lora_


class LoraWeights(nn.Module):
    """One adapter's weights on one module, laid out like peft (`lora_A`: r x in, `lora_B`: out x r)."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        r: int,
        lora_alpha: float,
        lora_dropout: float = 0.0,
        use_rslora: bool = False,
        *,
        device: torch.device | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if r <= 0:
            raise ValueError(f'LoRA rank must be a positive integer, got r={r}.')
        self.r = r
        self.scaling = lora_alpha / math.sqrt(r) if use_rslora else lora_alpha / r
        self.lora_A = nn.Linear(in_features, r, bias=False, device=device, dtype=dtype)
        self.lora_B = nn.Linear(r, out_features, bias=False, device=device, dtype=dtype)
        self.dropout = nn.Dropout(lora_dropout) if lora_dropout > 0 else nn.Identity()

    @torch.no_grad()
    def reset_parameters(self, init: bool | str = True, generator: torch.Generator | None = None) -> None:
        """Initialise exactly like peft: A kaiming-uniform(a=sqrt(5)) (or normal(1/r) for 'gaussian'), B zeros.

        `init=False` leaves A and B random (kaiming-uniform both), which makes the adapter non-identity.
        """
        if init is False:
            for lin in (self.lora_A, self.lora_B):
                nn.init.kaiming_uniform_(lin.weight, a=math.sqrt(5), generator=generator)
            return
        if init is True:
            nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5), generator=generator)
        elif isinstance(init, str) and init.lower() == 'gaussian':
            nn.init.normal_(self.lora_A.weight, std=1 / self.r, generator=generator)
        else:
            raise ValueError(f"Unsupported init_lora_weights={init!r}; use True, False or 'gaussian'.")
        nn.init.zeros_(self.lora_B.weight)

    @property
    def dropout_active(self) -> bool:
        return self.training and isinstance(self.dropout, nn.Dropout) and self.dropout.p > 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(self.lora_A.weight.dtype)
        return self.lora_B(self.lora_A(self.dropout(x))) * self.scaling


class MultiLoraLinear(nn.Module):
    """Wraps a frozen `nn.Linear` (`base_layer`); `adapters` maps str(adapter slot) -> `LoraWeights`."""

    # set through __dict__ in __init__ (plain attributes, not submodules)
    router: AdapterRouter
    _by_slot: dict[int, LoraWeights]

    def __init__(self, base_layer: nn.Linear, router: AdapterRouter) -> None:
        super().__init__()
        self.base_layer = base_layer
        self.adapters = nn.ModuleDict()  # str(slot) -> LoraWeights (registered: parameters, state_dict, .to())
        self.in_features, self.out_features = base_layer.in_features, base_layer.out_features
        # Plain attributes (not submodules): the router every layer of a model shares, and a fast slot lookup.
        self.__dict__['router'] = router
        self.__dict__['_by_slot'] = {}

    @property
    def weight(self) -> torch.Tensor:  # code that inspects `module.weight` (tied weights, dtype checks) keeps working
        return self.base_layer.weight

    @property
    def bias(self) -> torch.Tensor | None:
        return self.base_layer.bias

    def add(self, slot: int, weights: LoraWeights) -> None:
        if slot in self._by_slot:
            raise KeyError(f'adapter slot {slot} already has weights on this module')
        self.adapters[str(slot)] = weights
        self._by_slot[slot] = weights

    def remove(self, slot: int) -> None:
        if self._by_slot.pop(slot, None) is not None:
            del self.adapters[str(slot)]

    def get(self, slot: int) -> LoraWeights | None:
        return self._by_slot.get(slot)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base_layer(x)
        if not self._by_slot:
            return out
        plan = self.router.plan_for(x)
        if plan is None:
            return out
        if plan.uniform_slot is not None:  # every token uses one adapter: no gather/scatter
            weights = self.get(plan.uniform_slot)
            return out if weights is None else out + weights(x).to(out.dtype)
        present = [(self.get(slot), start, end) for slot, start, end in plan.segments]
        if all(w is None for w, _, _ in present):
            return out
        assert plan.order is not None  # a plan without a uniform slot always orders its tokens
        x_flat = x.reshape(-1, self.in_features)
        rows: int | torch.Tensor
        if plan.offset is not None:  # tokens already sorted by adapter: a view, no copy kept for backward
            x_sorted, rows = x_flat.narrow(0, plan.offset, plan.order.numel()), plan.offset
        else:
            x_sorted, rows = x_flat.index_select(0, plan.order), plan.order
        if not any(w is not None and w.dropout_active for w, _, _ in present):
            live = [(w, start, end) for w, start, end in present if w is not None]
            return segmented_lora_(
                out,
                x_sorted,
                rows,
                [(start, end, w.scaling) for w, start, end in live],
                [t for w, _, _ in live for t in (w.lora_A.weight, w.lora_B.weight)],
            )
        # An adapter with active dropout (its mask is drawn by `LoraWeights`): plain autograd. One split, whose
        # backward is one concatenation -- a slice per adapter would allocate and zero a full-size gradient each.
        pieces = x_sorted.split([end - start for _, start, end in present])
        deltas = [
            w(piece).to(out.dtype) if w is not None else out.new_zeros(piece.shape[0], self.out_features)
            for (w, _, _), piece in zip(present, pieces)
        ]
        delta = torch.cat(deltas) if len(deltas) > 1 else deltas[0]
        return out.reshape(-1, self.out_features).index_add(0, plan.order, delta).view(out.shape)

    def extra_repr(self) -> str:
        ranks = {k: w.r for k, w in self.adapters.items()}
        return f'in_features={self.in_features}, out_features={self.out_features}, adapters(slot->r)={ranks}'
