"""LLM-as-judge rewards: a model grades each completion against a rubric.

The judge is any OpenAI-compatible chat endpoint (``base_url``: vLLM's, a hosted API, or this project's own
``/v1``, with a tenant's adapter as ``model``) or any twinkle sampler with a template (``sampler``: batched, in
process). Each completion becomes one judge request -- the rubric, the conversation's user turns and the
completion -- and the reply's score is parsed (`parse_score`): ``Score: 7``, ``7/10``, ``**8**``, a lone number.
A reply with no score in [min_score, max_score], an HTTP error or a timeout gives `invalid_score` and is counted
(`JudgeStats`; ``metrics()`` for the loggers). Identical requests are answered from a cache. Scores are returned
as they are, or scaled to [0, 1] with ``normalize=True``.
"""

from __future__ import annotations

import json
import re
import socket
import urllib.error
import urllib.request
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any, Sequence

from twinkle_core.errors import InvalidInputError
from twinkle_core.reward.answers import completion_text
from twinkle_core.reward.base import Reward
from twinkle_core.types import SamplingParams

DEFAULT_RUBRIC = (
    'You are a strict grader. Rate how well the RESPONSE answers the REQUEST: correct, complete, clear and '
    'concise. Reply with one line, "Score: N", where N is an integer from {min_score} (worst) to {max_score} (best).'
)
_SCORE = re.compile(r'(?:score|rating|grade)\s*[:=]?\s*\**\s*(-?\d+(?:\.\d+)?)', re.IGNORECASE)
_FRACTION = re.compile(r'(-?\d+(?:\.\d+)?)\s*/\s*\d+')
_NUMBER = re.compile(r'-?\d+(?:\.\d+)?')


def parse_score(reply: str, min_score: float, max_score: float) -> float | None:
    """The score in a judge's `reply`: after "Score:" (or rating / grade), else the numerator of "N/M", else the
    reply's only number; None when there is none or it lies outside [min_score, max_score]."""
    for pattern in (_SCORE, _FRACTION):
        match = pattern.search(reply)
        if match:
            value = float(match.group(1))
            return value if min_score <= value <= max_score else None
    numbers = _NUMBER.findall(reply)
    if len(numbers) == 1 and min_score <= float(numbers[0]) <= max_score:
        return float(numbers[0])
    return None


@dataclass
class JudgeStats:
    """Counts since the reward was built: ``requests`` sent to the judge, ``cache_hits`` (completions answered
    without a request of their own: remembered, or a repeat within the call), ``invalid`` replies (no score in
    range), ``timeouts``, ``errors`` (HTTP or connection failures)."""

    requests: int = 0
    cache_hits: int = 0
    invalid: int = 0
    timeouts: int = 0
    errors: int = 0


class LLMJudgeReward(Reward):
    """Scores from a judge model; see the module docstring. Exactly one of `base_url` (with `model`) or `sampler`.

    `rubric`: the system message (``{min_score}`` / ``{max_score}`` filled in); `max_concurrency`: endpoint requests
    in flight at once; `timeout_s`: per request; `cache_size`: judged requests remembered (0: none)."""

    def __init__(
        self,
        *,
        base_url: str | None = None,
        model: str | None = None,
        api_key: str | None = None,
        sampler: Any = None,
        rubric: str = DEFAULT_RUBRIC,
        min_score: float = 0.0,
        max_score: float = 10.0,
        invalid_score: float = 0.0,
        normalize: bool = False,
        max_tokens: int = 32,
        timeout_s: float = 60.0,
        max_concurrency: int = 8,
        cache_size: int = 4096,
    ) -> None:
        if (base_url is None) == (sampler is None):
            raise InvalidInputError('LLMJudgeReward needs exactly one judge: base_url= (with model=) or sampler=.')
        if base_url is not None and not model:
            raise InvalidInputError('LLMJudgeReward(base_url=...) needs model=: the judge model the endpoint serves.')
        if not min_score < max_score:
            raise InvalidInputError(f'LLMJudgeReward: min_score {min_score} must be below max_score {max_score}.')
        if timeout_s <= 0 or max_concurrency < 1 or cache_size < 0:
            raise InvalidInputError(
                'LLMJudgeReward: timeout_s must be > 0, max_concurrency >= 1 and cache_size >= 0; got '
                f'{timeout_s}, {max_concurrency}, {cache_size}.'
            )
        self.base_url, self.model, self.api_key, self.sampler = base_url, model, api_key, sampler
        self.system = rubric.format(min_score=_plain(min_score), max_score=_plain(max_score))
        self.min_score, self.max_score, self.invalid_score = float(min_score), float(max_score), float(invalid_score)
        self.normalize, self.max_tokens, self.timeout_s = normalize, int(max_tokens), float(timeout_s)
        self.max_concurrency, self.cache_size = int(max_concurrency), int(cache_size)
        self.stats = JudgeStats()
        self._cache: OrderedDict[str, float | None] = OrderedDict()

    def __call__(self, trajectories: Sequence[dict[str, Any]], **kwargs: Any) -> list[float]:
        requests = [self.messages(t, i) for i, t in enumerate(trajectories)]
        keys = [json.dumps(m, sort_keys=True) for m in requests]
        scores: dict[str, float | None] = {k: self._cache[k] for k in keys if k in self._cache}
        todo = list(dict.fromkeys(k for k in keys if k not in scores))  # each distinct request once
        self.stats.cache_hits += len(keys) - len(todo)
        for key, reply in zip(todo, self._judge([json.loads(k) for k in todo])):
            score = None if reply is None else parse_score(reply, self.min_score, self.max_score)
            scores[key] = score
            if reply is not None:  # a failed request is asked again next time; a judged one is remembered
                self.stats.invalid += score is None
                self._remember(key, score)
        return [self._reward(scores[k]) for k in keys]

    def messages(self, trajectory: dict[str, Any], index: int) -> list[dict[str, str]]:
        """The judge's conversation for one trajectory: the rubric, then the request (its user turns) and the
        response (its final assistant message)."""
        response = completion_text(trajectory, index, 'LLMJudgeReward')
        turns = trajectory.get('messages', []) if isinstance(trajectory, dict) else trajectory.messages
        request = '\n\n'.join(str(_field(m, 'content') or '') for m in turns[:-1] if _field(m, 'role') == 'user')
        return [
            {'role': 'system', 'content': self.system},
            {'role': 'user', 'content': f'REQUEST:\n{request}\n\nRESPONSE:\n{response}'},
        ]

    def metrics(self, prefix: str = 'judge/') -> dict[str, float]:
        return {f'{prefix}{k}': float(v) for k, v in asdict(self.stats).items()}

    # ---- judging -------------------------------------------------------------------------------------------
    def _judge(self, requests: list[list[dict[str, str]]]) -> list[str | None]:
        """One reply per request (None: it failed, counted)."""
        if not requests:
            return []
        self.stats.requests += len(requests)
        if self.sampler is not None:
            params = SamplingParams(max_tokens=self.max_tokens, temperature=0.0)
            responses = self.sampler.sample([{'messages': m} for m in requests], params)
            return [r.sequences[0].text or '' for r in responses]
        with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(requests))) as pool:
            return list(pool.map(self._post, requests))

    def _post(self, messages: list[dict[str, str]]) -> str | None:
        body = {'model': self.model, 'messages': messages, 'temperature': 0.0, 'max_tokens': self.max_tokens}
        headers = {'Content-Type': 'application/json'}
        if self.api_key:
            headers['Authorization'] = f'Bearer {self.api_key}'
        url = f'{str(self.base_url).rstrip("/")}/chat/completions'
        request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method='POST')
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return str(json.loads(response.read())['choices'][0]['message'].get('content') or '')
        except TimeoutError:
            self.stats.timeouts += 1
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, (TimeoutError, socket.timeout)):
                self.stats.timeouts += 1
            else:
                self.stats.errors += 1
        except (OSError, ValueError, KeyError, IndexError):
            self.stats.errors += 1
        return None

    def _remember(self, key: str, score: float | None) -> None:
        if self.cache_size == 0:
            return
        self._cache[key] = score
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)

    def _reward(self, score: float | None) -> float:
        if score is None:
            return self.invalid_score
        if self.normalize:
            return (score - self.min_score) / (self.max_score - self.min_score)
        return score


def _field(message: Any, name: str) -> Any:
    """A message's `name`, whether it is a dict or a `Message` model."""
    return message.get(name) if isinstance(message, dict) else getattr(message, name, None)


def _plain(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)
