"""LoRA adapters of a vLLM engine, by name.

vLLM identifies a LoRA by an integer id (its KV prefix-cache entries are keyed by it) and loads it from a PEFT
directory. This table maps our names to ids and directories: every add or replace takes a NEW id, so a replaced
adapter can never be served from KV cached under its old weights; tensors given in memory are written to a
private PEFT directory (vLLM has no documented in-memory LoRA loading). Checks that vLLM would only make inside
its worker (where a failure kills the engine) are made here first.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from twinkle_core.errors import InvalidInputError
from twinkle_core.utils.json import to_json

LORA_KEY_PARTS = ('.lora_A.', '.lora_B.', '.lora_embedding_A', '.lora_embedding_B')


@dataclass(frozen=True)
class AdapterEntry:
    name: str
    lora_id: int
    path: Path
    owned_dir: bool  # a directory this table wrote (deleted when the adapter goes)


class AdapterTable:
    """`handle`: the sampler's `LLMHandle` (its engine's add_lora / remove_lora); `max_rank`: the engine's
    `max_lora_rank`."""

    def __init__(self, handle: Any, *, max_rank: int, enabled: bool) -> None:
        self._handle, self._max_rank, self._enabled = handle, max_rank, enabled
        self._entries: dict[str, AdapterEntry] = {}
        self._next_id = 1
        self._tmp = Path(tempfile.mkdtemp(prefix='twinkle-vllm-lora-'))

    def names(self) -> list[str]:
        return sorted(self._entries)

    def request(self, name: str) -> Any:
        """The `LoRARequest` serving adapter `name` now."""
        from vllm.lora.request import LoRARequest

        entry = self._entries[name]
        return LoRARequest(entry.name, entry.lora_id, str(entry.path))

    def check_known(self, names: list[str | None]) -> None:
        unknown = sorted({n for n in names if n is not None and n not in self._entries})
        if unknown:
            raise InvalidInputError(
                f'Unknown adapter(s) {unknown}; this sampler has {self.names() or "no adapters"}. '
                'Add one first with `sampler.add_adapter(name, config, tensors)` or '
                '`add_adapter(name, path=peft_dir)`.'
            )

    def add(
        self,
        name: str,
        config: Mapping[str, Any] | Any = None,
        tensors: Mapping[str, Any] | None = None,
        *,
        path: str | None = None,
    ) -> None:
        """Add or replace `name`. The engine loads the new adapter before the old one is dropped, so a failed
        replacement leaves the old adapter serving."""
        if not self._enabled:
            raise InvalidInputError(
                'This vLLMSampler was built with enable_lora=False; pass '
                "engine_args={'enable_lora': True} to serve adapters."
            )
        if (tensors is None) == (path is None):
            raise InvalidInputError(f'add_adapter({name!r}): pass exactly one of tensors= or path=.')
        lora_id = self._next_id
        self._next_id += 1
        if path is not None:
            directory, owned = Path(path), False
            config_dict = _read_config(directory)
            self._check_config(name, config_dict)
        else:
            if config is None:
                raise InvalidInputError(
                    f'Adapter {name!r} given as tensors needs its config (adapter_config.json '
                    'fields: r, lora_alpha, target_modules).'
                )
            assert tensors is not None  # exactly one of tensors / path, checked above
            config_dict = _config_dict(config)
            self._check_config(name, config_dict)
            _check_tensors(name, tensors)
            directory, owned = self._tmp / f'{lora_id}', True
            _write_peft_dir(directory, config_dict, tensors)
        from vllm.lora.request import LoRARequest

        try:
            self._handle.call(
                'add_adapter', lambda llm: llm.llm_engine.add_lora(LoRARequest(name, lora_id, str(directory)))
            )
        except Exception:
            if owned:
                shutil.rmtree(directory, ignore_errors=True)
            raise
        old = self._entries.get(name)
        self._entries[name] = AdapterEntry(name, lora_id, directory, owned)
        if old is not None:
            self._drop(old)

    def remove(self, name: str) -> None:
        self.check_known([name])
        self._drop(self._entries.pop(name))

    def close(self) -> None:
        shutil.rmtree(self._tmp, ignore_errors=True)

    def restore(self) -> None:
        """Re-register every adapter (new ids) in a restarted engine."""
        from vllm.lora.request import LoRARequest

        for name, entry in list(self._entries.items()):
            lora_id = self._next_id
            self._next_id += 1
            self._handle.llm_engine.add_lora(LoRARequest(name, lora_id, str(entry.path)))
            self._entries[name] = AdapterEntry(name, lora_id, entry.path, entry.owned_dir)

    def _drop(self, entry: AdapterEntry) -> None:
        self._handle.call('remove_adapter', lambda llm: llm.llm_engine.remove_lora(entry.lora_id))
        if entry.owned_dir:
            shutil.rmtree(entry.path, ignore_errors=True)

    def _check_config(self, name: str, config: Mapping[str, Any]) -> None:
        ranks = [int(config.get('r', 8)), *map(int, (config.get('rank_pattern') or {}).values())]
        if max(ranks) > self._max_rank:
            raise InvalidInputError(
                f"Adapter {name!r} has rank {max(ranks)}, above this engine's max_lora_rank="
                f'{self._max_rank}; build the sampler with engine_args={{"max_lora_rank": '
                f'{max(ranks)}}} or more.'
            )
        if config.get('use_dora'):
            raise InvalidInputError(f'Adapter {name!r} is a DoRA adapter; vLLM serves plain LoRA only.')


def _config_dict(config: Any) -> dict[str, Any]:
    if hasattr(config, 'to_dict'):
        config = config.to_dict()
    elif not isinstance(config, Mapping):
        config = dict(vars(config))
    out = to_json(dict(config))
    out.setdefault('peft_type', 'LORA')
    return out


def _read_config(directory: Path) -> dict[str, Any]:
    file = directory / 'adapter_config.json'
    if not file.is_file():
        raise InvalidInputError(f'{directory} is not a PEFT adapter directory (no adapter_config.json).')
    return json.loads(file.read_text())


def _check_tensors(name: str, tensors: Mapping[str, Any]) -> None:
    if not tensors:
        raise InvalidInputError(f'Adapter {name!r}: no tensors given.')
    stray = [k for k in tensors if not any(part in k for part in LORA_KEY_PARTS)]
    if stray:
        raise InvalidInputError(
            f'Adapter {name!r}: {stray[:3]} are not LoRA tensors in PEFT naming '
            '(base_model.model.<module>.lora_A.weight / lora_B.weight).'
        )


def _write_peft_dir(directory: Path, config: Mapping[str, Any], tensors: Mapping[str, Any]) -> None:
    from safetensors.torch import save_file

    directory.mkdir(parents=True)
    save_file(
        {k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(directory / 'adapter_model.safetensors')
    )
    (directory / 'adapter_config.json').write_text(json.dumps(config))
