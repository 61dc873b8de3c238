"""Stop-gap engine on plain transformers + peft: one adapter per pass, HF-style sampling loop.

Used only while the real multi-LoRA engine (`MultiLoraTransformersModel` + `TorchSampler`, see
`twinkle_engine.py`) is unavailable; `load_engine` prefers the real one. It keeps the exact `Engine` contract
(sum losses, per-adapter AdamW, PEFT-format checkpoints) so the service and its tests behave the same.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import torch

from twinkle_core.types import SampledSequence, SampleResponse
from twinkle_server.engine.base import AdamStep, Engine, LoraSpec, SampleJob, TrainBatch, TrainResult
from twinkle_server.engine.tinker_losses import LOSSES
from twinkle_server.errors import unprocessable

PER_TOKEN = {'weights': 1.0, 'old_logps': 0.0, 'advantages': 0.0}


class PeftEngine(Engine):
    def __init__(self, base_model: str, model_dir: str) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer
        self.base_model, self.model_dir = base_model, str(model_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32)
        self.max_context_length = int(getattr(self.model.config, 'max_position_embeddings', 4096))
        self.peft: Any = None
        self.optimizers: dict[str, torch.optim.Optimizer] = {}
        self.sampler_adapters: set[str] = set()

    # ---- adapters ------------------------------------------------------------------------------------------
    def _add(self, name: str, lora: LoraSpec, trainable: bool) -> None:
        from peft import LoraConfig, get_peft_model
        config = LoraConfig(r=lora.rank, lora_alpha=lora.alpha, target_modules=list(lora.targets), lora_dropout=0.0)
        if lora.seed is not None:
            torch.manual_seed(lora.seed)
        if self.peft is None:
            self.peft = get_peft_model(self.model, config, adapter_name=name)
        else:
            self.peft.add_adapter(name, config)
        if trainable:
            self.optimizers[name] = torch.optim.AdamW(self._params(name), lr=1e-4)
        for p in self._params(name):
            p.requires_grad_(False)

    def _params(self, name: str) -> list[torch.nn.Parameter]:
        return [p for n, p in self.peft.named_parameters() if f'.{name}.' in n]

    def add_adapter(self, adapter: str, lora: LoraSpec) -> None:
        self._add(adapter, lora, trainable=True)

    def remove_adapter(self, adapter: str) -> None:
        if self.peft is not None and adapter in self.peft.peft_config:
            self.peft.delete_adapter(adapter)
        self.optimizers.pop(adapter, None)
        self.sampler_adapters.discard(adapter)

    def has_adapter(self, adapter: str) -> bool:
        return adapter in self.optimizers

    # ---- training ------------------------------------------------------------------------------------------
    def forward_backward(self, batches: list[TrainBatch]) -> list[TrainResult | BaseException]:
        out: list[TrainResult | BaseException] = []
        for batch in batches:
            try:
                out.append(self._one(batch))
            except Exception as exc:  # noqa: BLE001 - isolate tenants
                if batch.adapter in self.optimizers:
                    for p in self._params(batch.adapter):
                        p.grad = None
                out.append(exc)
        return out

    def _one(self, batch: TrainBatch) -> TrainResult:
        fn = LOSSES.get(batch.loss_fn)
        if fn is None:
            raise unprocessable(f'unknown loss_fn {batch.loss_fn!r}; supported: {sorted(LOSSES)}')
        ids, labels, fields, attn = _collate(batch.rows)
        params = self._params(batch.adapter)
        self.peft.set_adapter(batch.adapter)
        for p in params:
            p.requires_grad_(not batch.forward_only)
        try:
            with torch.set_grad_enabled(not batch.forward_only):
                logits = self.peft(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
                targets = labels[:, 1:]
                mask = (targets != -100).float()
                lp = torch.log_softmax(logits, -1).gather(-1, targets.clamp_min(0).unsqueeze(-1)).squeeze(-1) * mask
                loss = fn(lp, mask, {k: v[:, 1:] for k, v in fields.items()}, batch.loss_config)
                if not batch.forward_only:
                    loss.backward()
        finally:
            for p in params:
                p.requires_grad_(False)
        lens = [len(r['input_ids']) for r in batch.rows]
        lp_rows = [[0.0] + lp[i, :n - 1].tolist() for i, n in enumerate(lens)]
        return TrainResult(float(loss.detach()), lp_rows)

    def optim_step(self, adapter: str, step: AdamStep) -> dict[str, float]:
        opt = self.optimizers[adapter]
        for group in opt.param_groups:
            group.update(lr=step.learning_rate, betas=(step.beta1, step.beta2), eps=step.eps,
                         weight_decay=step.weight_decay)
        params = [p for p in self._params(adapter) if p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(params, step.grad_clip_norm if step.grad_clip_norm > 0 else math.inf)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return {'grad_norm:mean': float(norm), 'learning_rate:mean': step.learning_rate}

    # ---- checkpoints ---------------------------------------------------------------------------------------
    def save_state(self, adapter: str, directory: str, *, optimizer: bool) -> None:
        from peft import get_peft_model_state_dict
        from safetensors.torch import save_file
        state = get_peft_model_state_dict(self.peft, adapter_name=adapter, save_embedding_layers=False)
        save_file({k: v.detach().contiguous() for k, v in state.items()}, os.path.join(directory, 'adapter_model.safetensors'))
        self.peft.peft_config[adapter].save_pretrained(directory)
        if optimizer:
            torch.save(self.optimizers[adapter].state_dict(), os.path.join(directory, 'optimizer.pt'))

    def load_state(self, adapter: str, directory: str, *, optimizer: bool) -> None:
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file
        set_peft_model_state_dict(self.peft, load_file(os.path.join(directory, 'adapter_model.safetensors')),
                                  adapter_name=adapter)
        if optimizer:
            path = os.path.join(directory, 'optimizer.pt')
            if not os.path.exists(path):
                raise unprocessable(f'checkpoint {directory} has no optimizer state; load it without optimizer')
            self.optimizers[adapter].load_state_dict(torch.load(path, weights_only=True))

    def load_sampler_adapter(self, name: str, directory: str) -> None:
        if name in self.sampler_adapters:
            return
        cfg = json.loads(Path(directory, 'adapter_config.json').read_text())
        self._add(name, LoraSpec(cfg['r'], cfg['lora_alpha'], tuple(cfg['target_modules'])), trainable=False)
        self.load_state(name, directory, optimizer=False)
        self.sampler_adapters.add(name)

    # ---- sampling ------------------------------------------------------------------------------------------
    def sample(self, jobs: list[SampleJob]) -> list[SampleResponse | BaseException]:
        out: list[SampleResponse | BaseException] = []
        for job in jobs:
            try:
                out.append(self._sample(job))
            except Exception as exc:  # noqa: BLE001
                out.append(exc)
        return out

    @torch.no_grad()
    def _sample(self, job: SampleJob) -> SampleResponse:
        model = self.peft if self.peft is not None else self.model
        ctx = _NoAdapter(self.peft) if job.adapter is None else _Adapter(self.peft, job.adapter)
        with ctx:
            p = job.params
            gen = torch.Generator().manual_seed(p.seed if p.seed is not None else torch.seed() % 2**31)
            ids = torch.tensor([job.prompt] * job.num_samples)
            prompt_lp = None
            out = model(input_ids=ids, use_cache=True)
            if job.prompt_logprobs:
                lp = torch.log_softmax(out.logits[0, :-1].float(), -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
                prompt_lp = [None] + lp.tolist()
            stop_ids = set(p.stop_token_ids()) if p.stop is not None else {self.tokenizer.eos_token_id}
            stop_strs = p.stop_strings()
            seqs: list[list[int]] = [[] for _ in range(job.num_samples)]
            lps: list[list[float]] = [[] for _ in range(job.num_samples)]
            done = [None] * job.num_samples
            past, logits = out.past_key_values, out.logits[:, -1].float()
            for _ in range(p.max_tokens):
                tok, tok_lp = _draw(logits, p, gen)
                for i in range(job.num_samples):
                    if done[i] is None:
                        seqs[i].append(int(tok[i]))
                        lps[i].append(float(tok_lp[i]))
                        if int(tok[i]) in stop_ids or (stop_strs and any(
                                s in self.tokenizer.decode(seqs[i]) for s in stop_strs)):
                            done[i] = 'stop'
                if all(d is not None for d in done):
                    break
                out = model(input_ids=tok[:, None], past_key_values=past, use_cache=True)
                past, logits = out.past_key_values, out.logits[:, -1].float()
        return SampleResponse(sequences=[SampledSequence(tokens=s, logprobs=l, stop_reason=d or 'length')
                                         for s, l, d in zip(seqs, lps, done)], prompt_logprobs=prompt_lp)

    def native_call(self, adapter: str, method: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
        raise unprocessable(f'native method {method!r} needs the multi-LoRA engine (twinkle-transformers)')


def _draw(logits: torch.Tensor, p: Any, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row; returns the tokens and their log-probs under the unmodified model."""
    logp = torch.log_softmax(logits, -1)
    if p.temperature == 0:
        tok = logits.argmax(-1)
    else:
        scaled = logits / p.temperature
        if p.top_k > 0:
            kth = scaled.topk(min(p.top_k, scaled.shape[-1]), -1).values[:, -1:]
            scaled = scaled.masked_fill(scaled < kth, -math.inf)
        probs = torch.softmax(scaled, -1)
        if p.top_p < 1.0:
            sorted_p, idx = probs.sort(-1, descending=True)
            drop = sorted_p.cumsum(-1) - sorted_p > p.top_p
            probs = probs.scatter(-1, idx, sorted_p.masked_fill(drop, 0.0))
        tok = torch.multinomial(probs, 1, generator=gen).squeeze(-1)
    return tok, logp.gather(-1, tok[:, None]).squeeze(-1)


def _collate(rows: list[dict[str, Any]]) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor], torch.Tensor]:
    n = max(len(r['input_ids']) for r in rows)
    ids = torch.zeros(len(rows), n, dtype=torch.long)
    labels = torch.full((len(rows), n), -100, dtype=torch.long)
    attn = torch.zeros(len(rows), n, dtype=torch.long)
    fields = {k: torch.full((len(rows), n), d, dtype=torch.float32) for k, d in PER_TOKEN.items()}
    for i, r in enumerate(rows):
        m = len(r['input_ids'])
        ids[i, :m] = torch.tensor(r['input_ids'])
        labels[i, :m] = torch.tensor(r['labels'])
        attn[i, :m] = 1
        for k in PER_TOKEN:
            if k in r:
                fields[k][i, :m] = torch.tensor(r[k], dtype=torch.float32)
    return ids, labels, fields, attn


class _Adapter:
    def __init__(self, peft: Any, name: str) -> None:
        self.peft, self.name = peft, name

    def __enter__(self) -> None:
        self.peft.set_adapter(self.name)
        for n, p in self.peft.named_parameters():
            if f'.{self.name}.' in n:
                p.requires_grad_(False)

    def __exit__(self, *exc: Any) -> None:
        pass


class _NoAdapter:
    def __init__(self, peft: Any) -> None:
        self.ctx = peft.disable_adapter() if peft is not None else None

    def __enter__(self) -> None:
        if self.ctx is not None:
            self.ctx.__enter__()

    def __exit__(self, *exc: Any) -> None:
        if self.ctx is not None:
            self.ctx.__exit__(*exc)
