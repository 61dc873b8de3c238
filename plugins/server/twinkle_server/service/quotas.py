"""Limits enforced per request and per tenant (`TenantLimits`, see config.py): each check raises the `ApiError`
that names the cap and its value, before anything large is allocated. `MinuteWindow` is the sliding-minute
counter behind the request-rate limit and the failed-login throttle."""

from __future__ import annotations

import threading
import time
from collections import deque

from twinkle_core.types import SamplingParams
from twinkle_server.config import ServerConfig
from twinkle_server.errors import ApiError, bad_request, over_limit, unprocessable
from twinkle_server.store import Store

WINDOW_S = 60.0
MAX_KEYS = 10_000  # bound memory under key churn (e.g. many client addresses)


class MinuteWindow:
    """Events per key in the last minute (thread-safe)."""

    def __init__(self) -> None:
        self._events: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def admit(self, key: str, limit: int, what: str, *, record: bool = True) -> None:
        """Raise 429 (with Retry-After) if `key` already had `limit` events this minute; else record one."""
        with self._lock:
            now = time.monotonic()
            window = self._window(key, now)
            if len(window) >= limit:
                wait = WINDOW_S - (now - window[0])
                raise ApiError(
                    429,
                    f'{what}: {len(window)} in the last minute (limit {limit}); try again in {wait:.0f} s',
                    retry_after_s=wait,
                )
            if record:
                window.append(now)

    def record(self, key: str) -> None:
        with self._lock:
            now = time.monotonic()
            self._window(key, now).append(now)

    def reset(self) -> None:
        with self._lock:
            self._events.clear()

    def _window(self, key: str, now: float) -> deque[float]:
        window = self._events.setdefault(key, deque())
        while window and now - window[0] > WINDOW_S:
            window.popleft()
        if not window and len(self._events) > MAX_KEYS:
            self._events = {k: w for k, w in self._events.items() if w}
            self._events[key] = window
        return window


class Quotas:
    """The checks of `ServerConfig.limits(tenant)`; counts that live elsewhere are passed in."""

    def __init__(self, config: ServerConfig, store: Store) -> None:
        self.config = config
        self.store = store
        self._requests = MinuteWindow()

    def check_rate(self, tenant: str) -> None:
        limit = self.config.limits(tenant).requests_per_minute
        if limit is not None:
            self._requests.admit(tenant, limit, f'tenant {tenant!r} exceeded requests_per_minute')

    def check_new_adapter(self, tenant: str, rank: int, live: int) -> None:
        """`live`: the tenant's training models loaded now."""
        limits = self.config.limits(tenant)
        if limits.max_lora_rank is not None and rank > limits.max_lora_rank:
            raise unprocessable(
                f'LoRA rank {rank} exceeds the limit max_lora_rank={limits.max_lora_rank} for tenant {tenant!r}'
            )
        if limits.max_adapters is not None and live >= limits.max_adapters:  # waiting does not help: 403
            raise ApiError(
                403,
                f'tenant {tenant!r} already has {live} live training models (limit '
                f'max_adapters={limits.max_adapters}); unload a model or finish its session first',
            )

    def check_new_session(self, tenant: str) -> None:
        cap = self.config.limits(tenant).max_sessions
        if cap is not None:
            live = self.store.count_live_sessions(tenant, time.time() - self.config.session_ttl_s)
            if live >= cap:
                raise ApiError(
                    403,
                    f'tenant {tenant!r} already has {live} open sessions (limit max_sessions={cap}); '
                    f'finish a session (or let it expire) first',
                )

    def check_pending(self, tenant: str, pending: int) -> None:
        """`pending`: the tenant's requests queued or running now (a cap it can wait out: 429)."""
        cap = self.config.limits(tenant).max_pending_futures
        if cap is not None and pending >= cap:
            raise ApiError(
                429,
                f'tenant {tenant!r} has {cap} requests queued or running (limit '
                f'max_pending_futures={cap}); retrieve results before sending more',
                retry_after_s=2.0,
            )

    def check_train_request(self, tenant: str, lengths: list[int], context: int) -> None:
        """A forward_backward of datums with `lengths` tokens each, on a model with `context` positions."""
        limits = self.config.limits(tenant)
        rows, tokens = len(lengths), sum(lengths)
        if limits.max_rows_per_request is not None and rows > limits.max_rows_per_request:
            raise over_limit('max_rows_per_request', limits.max_rows_per_request, rows, 'the number of datums')
        if limits.max_tokens_per_request is not None and tokens > limits.max_tokens_per_request:
            raise over_limit(
                'max_tokens_per_request', limits.max_tokens_per_request, tokens, 'the total number of tokens'
            )
        longest = max(lengths, default=0)
        if longest + 1 > context:  # the server appends the last target token
            raise ApiError(
                413,
                f"datum {lengths.index(longest)} has {longest} tokens; the model's context length "
                f'is {context} (input + last target token must fit)',
            )

    def check_sample_request(self, tenant: str, num_samples: int, max_tokens: int) -> None:
        limits = self.config.limits(tenant)
        if num_samples < 1:
            raise bad_request(f'num_samples must be >= 1, got {num_samples}')
        if limits.max_num_samples is not None and num_samples > limits.max_num_samples:
            raise over_limit('max_num_samples', limits.max_num_samples, num_samples, 'num_samples', status=400)
        if max_tokens < 1:
            raise bad_request(f'max_tokens must be >= 1, got {max_tokens}')
        if limits.max_sample_tokens is not None and max_tokens > limits.max_sample_tokens:
            raise over_limit('max_sample_tokens', limits.max_sample_tokens, max_tokens, 'max_tokens', status=400)

    def check_sample_scores(self, tenant: str, prompt_length: int, params: SamplingParams) -> None:
        """The top-k widths and prompt scores one sample request asks for (`SamplingParams`' `top_logprobs`,
        `prompt_top_logprobs`, `prompt_target_tokens`, `prompt_alt_tokens`): each width at most `max_topk_logprobs`,
        and the prompt's length times each width (distinct target ids for the targets) at most
        `max_prompt_logprob_cells` -- both 400, before the job is queued."""
        limits = self.config.limits(tenant)
        widths = {
            'the top-k width of sampled-token logprobs': params.alternatives,
            'the top-k width of prompt logprobs': params.prompt_top_logprobs,
            'prompt alt-token draws per position': params.prompt_alt_tokens,
        }
        cap = limits.max_topk_logprobs
        for what, width in widths.items():
            if cap is not None and width > cap:
                raise over_limit('max_topk_logprobs', cap, width, what, status=400)
        targets = params.prompt_target_tokens
        distinct = len({t for row in targets for t in row if t >= 0}) if targets is not None else 0
        cells = {
            'prompt length x top-k width of prompt logprobs': params.prompt_top_logprobs,
            'prompt length x distinct target token ids': distinct,
            'prompt length x alt-token draws': params.prompt_alt_tokens,
        }
        cap = limits.max_prompt_logprob_cells
        for what, width in cells.items():
            if cap is not None and prompt_length * width > cap:
                raise over_limit('max_prompt_logprob_cells', cap, f'{prompt_length} x {width}', what, status=400)
