"""Run megatron-core 0.16.1 on a machine without CUDA (CPU, gloo): the bridges, each with its reason.

megatron-core assumes CUDA in a handful of places that the CPU training path reaches: it creates small tensors
with a literal ``device="cuda"`` (the causal mask, the pipeline schedules' token counter, the gradient-norm and
overflow buffers of the optimizer and its clipping) and asks ``torch.cuda.current_device()`` for where to put
RoPE frequencies and p2p buffers. `apply()` bridges exactly those modules, and only when
``torch.cuda.is_available()`` is false: on a CUDA machine it returns at once and changes nothing.

The bridge is scoped: each listed megatron module gets its own ``torch`` (a `_CpuTorch` that delegates every
attribute to the real torch) whose tensor factories read ``device="cuda"`` as the CPU and whose
``torch.cuda.current_device()`` answers ``"cpu"`` (``synchronize`` / ``empty_cache`` do nothing). torch itself,
and every other module, are untouched.

Two assumptions sit on tensors rather than in modules: Megatron's optimizer checks ``tensor.type() ==
'torch.cuda.FloatTensor'`` (gradient clipping, the distributed optimizer's shard groups), and the model moves the
tied output-layer copy of a pipeline's last stage with ``Tensor.cuda()``. `tensors_as_cuda()` is a context
manager, entered only around model construction and calls into Megatron's optimizer, in which ``Tensor.type()``
without arguments names a CPU tensor by its CUDA type and ``Tensor.cuda()`` leaves it where it is;
``Tensor.type(dtype)`` casts as always. On CUDA machines it does nothing.

The RNG tracker needs no bridge: `groups.initialize` asks megatron for its inference tracker
(``model_parallel_cuda_manual_seed(seed, inference_rng_tracker=True)``), which uses CPU generators.
"""

from __future__ import annotations

import contextlib
import importlib
from types import SimpleNamespace
from typing import Any, Iterator

import torch

#: megatron-core modules with a CUDA assumption on the CPU path -> what it is
MODULES: dict[str, str] = {
    'megatron.core.transformer.utils': 'get_default_causal_mask builds the causal mask with device="cuda"',
    'megatron.core.models.common.embeddings.rotary_pos_embedding': (
        'RotaryEmbedding.get_emb moves inv_freq to torch.cuda.current_device()'
    ),
    'megatron.core.pipeline_parallel.schedules': 'the token counter of every schedule is created on "cuda"',
    'megatron.core.pipeline_parallel.p2p_communication': 'p2p receive buffers on torch.cuda.current_device()',
    'megatron.core.optimizer.clip_grads': 'the grad-norm and overflow buffers are created on "cuda"',
    'megatron.core.optimizer.optimizer': 'found_inf / scale buffers on "cuda"',
    'megatron.core.optimizer.grad_scaler': 'loss-scale tensors on "cuda"',
    'megatron.core.optimizer.distrib_optimizer': 'gather buffers on torch.cuda.current_device()',
    'megatron.core.distributed.param_and_grad_buffer': 'a warm-up tensor on "cuda"',
    'megatron.core.utils': 'GlobalMemoryBuffer (attention scores, sequence-parallel gathers) on '
    'torch.cuda.current_device()',
    'megatron.core.tensor_parallel.layers': 'weight buffers on torch.cuda.current_device()',
    'megatron.core.tensor_parallel.mappings': 'all-gather buffers on torch.cuda.current_device()',
    'megatron.core.transformer.moe.moe_utils': 'router statistics on "cuda"',
    'megatron.core.transformer.moe.router': 'the router weight is cast on torch.cuda.current_device()',
}
_FACTORIES = (
    'zeros',
    'ones',
    'empty',
    'full',
    'tensor',
    'arange',
    'zeros_like',
    'ones_like',
    'empty_like',
    'randn',
    'rand',
)
_applied: list[str] = []


def _cpu(device: Any) -> Any:
    """A CUDA device spec (``'cuda'``, ``'cuda:N'``, a CUDA `torch.device`, an int) -> ``'cpu'``."""
    if isinstance(device, int) and not isinstance(device, bool):
        return 'cpu'
    if isinstance(device, torch.device) and device.type == 'cuda':
        return 'cpu'
    if isinstance(device, str) and device.startswith('cuda'):
        return 'cpu'
    return device


class _CpuTorch:
    """``torch`` as megatron sees it on a CPU machine (see the module docstring)."""

    def __init__(self) -> None:
        self.cuda = SimpleNamespace(**{k: getattr(torch.cuda, k) for k in dir(torch.cuda) if not k.startswith('__')})
        self.cuda.current_device = lambda: 'cpu'
        self.cuda.synchronize = self.cuda.empty_cache = lambda *a, **k: None
        for name in _FACTORIES:
            setattr(self, name, self._factory(getattr(torch, name)))

    @staticmethod
    def _factory(fn: Any) -> Any:
        def make(*args: Any, **kwargs: Any) -> Any:
            if 'device' in kwargs:
                kwargs['device'] = _cpu(kwargs['device'])
            return fn(*args, **kwargs)

        make.__name__ = fn.__name__
        return make

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


def apply() -> bool:
    """Install the bridges (idempotent). Returns False, doing nothing, when CUDA is available."""
    if torch.cuda.is_available():
        return False
    if _applied:
        return True
    shim = _CpuTorch()
    for name in MODULES:
        module = importlib.import_module(name)
        module.torch = shim  # type: ignore[attr-defined]
        _applied.append(name)
    return True


def applied() -> list[str]:
    """The modules bridged in this process (empty on a CUDA machine)."""
    return list(_applied)


@contextlib.contextmanager
def tensors_as_cuda() -> Iterator[None]:
    """Within the block, a CPU tensor's ``Tensor.type()`` (no arguments) answers ``'torch.cuda.<Type>'`` and
    ``Tensor.cuda()`` returns the tensor itself; nothing changes on a CUDA machine. For the training thread only
    (megatron's model construction and optimizer calls)."""
    if torch.cuda.is_available():
        yield
        return
    original_type, original_cuda = torch.Tensor.type, torch.Tensor.cuda

    def type_(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        result = original_type(self, *args, **kwargs)
        if not args and not kwargs and isinstance(result, str) and not result.startswith('torch.cuda.'):
            return result.replace('torch.', 'torch.cuda.', 1)
        return result

    torch.Tensor.type = type_  # type: ignore[method-assign, assignment]  # monkeypatch of an overloaded stub
    torch.Tensor.cuda = lambda self, *args, **kwargs: self  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.Tensor.type, torch.Tensor.cuda = original_type, original_cuda  # type: ignore[method-assign]


def define_missing_te_gemm() -> None:
    """megatron-core 0.16.1's MoE router calls ``te_general_gemm`` when it is not None, but leaves the name
    undefined when TransformerEngine is absent (a NameError on every MoE forward, CPU or GPU). Define it as None
    there -- the router then uses ``torch.mm`` -- and nothing else; with TransformerEngine installed the name
    exists and this does nothing."""
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, 'te_general_gemm'):
        moe_utils.te_general_gemm = None
