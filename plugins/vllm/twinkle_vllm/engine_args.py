"""The `engine_args` a `vLLMSampler` builds its engine with: our defaults, the user's overrides, validated before
vLLM sees them (a bad argument inside vLLM can kill its engine process; here it is a clear error instead)."""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any, Mapping

from twinkle_core.errors import InvalidInputError

WORKER_EXTENSION = 'twinkle_vllm.worker_extension.TwinkleWorkerExtension'

# Set by the sampler itself; a user value would break it.
RESERVED = {
    'model': 'pass the model as model_id=',
    'worker_extension_cls': f'the sampler needs {WORKER_EXTENSION} to receive weights',
    'logprobs_mode': "logprobs must be the raw model log-softmax ('raw_logprobs'), as the training forward computes",
}


def defaults(*, on_cpu: bool) -> dict[str, Any]:
    """What a twinkle sampler wants unless told otherwise: LoRA on (8 adapters per batch, 64 resident), rank up to
    64, a fixed seed; on CPU eager mode (graph compilation costs more than it saves on small batches) and a 1 GiB KV
    cache (vLLM's CPU default reserves a fraction of ALL host memory and refuses to start when less is free)."""
    args: dict[str, Any] = {'enable_lora': True, 'max_lora_rank': 64, 'max_loras': 8, 'max_cpu_loras': 64, 'seed': 0}
    if on_cpu:
        args.update(enforce_eager=True, kv_cache_memory_bytes=1 << 30)
    return args


def engine_args(
    model_id: str, user: Mapping[str, Any] | None, *, on_cpu: bool, tensor_parallel_size: int | None = None
) -> dict[str, Any]:
    """The keyword arguments for `vllm.LLM`: `defaults` updated by `user`, plus the reserved ones."""
    user = dict(user or {})
    check_names(user)
    args = {**defaults(on_cpu=on_cpu), **user}
    if tensor_parallel_size is not None and tensor_parallel_size > 1:
        if user.get('tensor_parallel_size', tensor_parallel_size) != tensor_parallel_size:
            raise InvalidInputError(
                f'engine_args tensor_parallel_size={user["tensor_parallel_size"]} disagrees with '
                f'the device mesh (tp={tensor_parallel_size}).'
            )
        args['tensor_parallel_size'] = tensor_parallel_size
    if args.get('enable_lora') and args.get('max_cpu_loras', 0) < args.get('max_loras', 1):
        args['max_cpu_loras'] = args['max_loras']
    return {**args, 'model': model_id, 'worker_extension_cls': WORKER_EXTENSION, 'logprobs_mode': 'raw_logprobs'}


def check_names(user: Mapping[str, Any]) -> None:
    """Unknown or reserved keys -> InvalidInputError naming them (and the closest known spelling)."""
    from vllm.engine.arg_utils import EngineArgs

    known = {f.name for f in dataclasses.fields(EngineArgs)}
    for key in user:
        if key in RESERVED:
            raise InvalidInputError(f'engine_args[{key!r}] is set by vLLMSampler: {RESERVED[key]}.')
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=3)
            hint = f'; did you mean {", ".join(close)}?' if close else ' (see vllm.EngineArgs for the full list).'
            raise InvalidInputError(f'Unknown vLLM engine argument {key!r}{hint}')
