"""Data formats shared by every component and runtime (pydantic models: validated, JSON-serialisable).

Pipelines (HF `datasets` rows, DataLoader batches) carry plain dicts with exactly these fields; components accept
either the model or its dict, and validate at the boundary with `as_input_features` / `Trajectory.model_validate`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from twinkle_core.errors import InvalidInputError

Role = Literal['system', 'user', 'assistant', 'tool']
#: Why a sampled continuation ended: a stop token/string, or the token limit.
StopReason = Literal['stop', 'length']
#: The label of a position without loss (HF convention; docs/conventions.md). Import it from here.
IGNORE_INDEX = -100
#: Row fields of image inputs (a vision template writes them; processors concatenate them over a batch's rows in
#: order: ``pixel_values`` [patches, dim] and ``image_grid_thw`` [images, 3]).
IMAGE_ROW_FIELDS = ('pixel_values', 'image_grid_thw')
#: Per-token integer fields that stay aligned with ``input_ids`` (not shifted like labels): 1 marks image tokens.
TOKEN_TYPE_FIELD = 'mm_token_type_ids'


class Message(BaseModel):
    """One chat message. `loss` overrides whether an assistant turn is trained on (default: assistant turns are).

    `content` is text, or a list of parts (``{'type': 'text', 'text': ...}``, ``{'type': 'image', 'image': ...}``)
    for multimodal turns; see `twinkle_core.template.images` for the image layouts a vision template reads.
    """

    model_config = ConfigDict(extra='allow', arbitrary_types_allowed=True)
    role: Role
    content: str | list[dict[str, Any]]
    loss: bool | None = None


class Trajectory(BaseModel):
    """A conversation in the standard format, plus optional per-trajectory fields (reward inputs, answers...)."""

    model_config = ConfigDict(extra='allow')
    messages: list[Message]
    tools: list[dict[str, Any]] | None = None

    @field_validator('messages')
    @classmethod
    def _non_empty(cls, v: list[Message]) -> list[Message]:
        if not v:
            raise ValueError('a trajectory needs at least one message')
        return v


class InputFeature(BaseModel):
    """One encoded sequence, ready for a model's input processor.

    `labels[i]` is the target for position i *after* the processor's shift, i.e. labels are aligned with
    input_ids and -100 marks positions without loss (HF convention). Extra fields (advantages, old_logprobs,
    ref_logprobs, adapter_name, ...) are kept and reach the loss untouched.
    """

    model_config = ConfigDict(extra='allow', arbitrary_types_allowed=True)
    input_ids: list[int]
    labels: list[int] | None = None
    attention_mask: list[int] | None = None
    position_ids: list[int] | None = None

    @model_validator(mode='after')
    def _lengths_match(self) -> InputFeature:
        n = len(self.input_ids)
        if n == 0:
            raise ValueError('input_ids is empty')
        for name in ('labels', 'attention_mask', 'position_ids'):
            v = getattr(self, name)
            if v is not None and len(v) != n:
                raise ValueError(f'{name} has length {len(v)} but input_ids has length {n}')
        return self


def as_input_features(batch: Any) -> list[dict[str, Any]]:
    """Validate a batch (an InputFeature, a dict, or a list of either) and return it as a list of dicts.

    Sampler results stand for their samples: a `SampleResponse` (or its JSON form, a dict with ``sequences``) in
    the batch is replaced by each of its sequences' ``new_input_feature``, in order. Raises `InvalidInputError`
    naming the first bad row.
    """
    if isinstance(batch, (InputFeature, dict, SampleResponse)):
        batch = [batch]
    if not isinstance(batch, (list, tuple)) or not batch:
        raise InvalidInputError(f'Expected a non-empty list of InputFeature rows, got {type(batch).__name__}.')
    batch = [row for item in batch for row in _sampled_rows(item)]
    rows: list[dict[str, Any]] = []
    for i, row in enumerate(batch):
        if isinstance(row, InputFeature):
            rows.append(row.model_dump(exclude_none=True))
            continue
        if not isinstance(row, dict):
            raise InvalidInputError(f'Batch row {i} is a {type(row).__name__}, expected an InputFeature or dict.')
        try:
            InputFeature.model_validate(_listify(row))
        except Exception as exc:  # pydantic.ValidationError, with the row index added
            raise InvalidInputError(f'Batch row {i} is not a valid InputFeature: {exc}') from exc
        rows.append(row)
    return rows


def _sampled_rows(item: Any) -> list[Any]:
    """`item` itself, or -- a sampler result -- its sequences' trainable rows."""
    if isinstance(item, SampleResponse):  # read in place: no dump of the samples' log-probs
        rows = [seq.new_input_feature for seq in item.sequences]
    elif isinstance(item, dict) and isinstance(item.get('sequences'), list) and 'input_ids' not in item:
        rows = [seq.get('new_input_feature') if isinstance(seq, dict) else None for seq in item['sequences']]
    else:
        return [item]
    if any(row is None for row in rows):
        raise InvalidInputError(
            'A SampleResponse in the batch has a sequence without new_input_feature; sample '
            'from prompt rows (not bare token lists) to get trainable rows.'
        )
    return rows


def _listify(row: dict[str, Any]) -> dict[str, Any]:
    """The declared fields' tensors/arrays -> lists for validation only (rows themselves are passed on unchanged;
    extra fields such as ``pixel_values`` are not validated, so they are not converted)."""
    return {
        k: as_list(v) if k in InputFeature.model_fields and callable(getattr(v, 'tolist', None)) else v
        for k, v in row.items()
    }


def as_list(values: Any) -> list[Any]:
    """A row field (tensor, array or sequence) as a Python list: its ``tolist()`` when it has one."""
    tolist = getattr(values, 'tolist', None)
    return tolist() if callable(tolist) else list(values)


class SamplingParams(BaseModel):
    """How to sample. `stop` takes strings or token ids; `None` stops at EOS only."""

    max_tokens: int = Field(default=128, ge=1)
    temperature: float = Field(default=1.0, ge=0.0)
    top_k: int = -1
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    stop: str | list[str] | list[int] | None = None
    seed: int | None = None
    num_samples: int = Field(default=1, ge=1)
    #: True: `SampledSequence.logprobs` is the log-prob of each sampled token (a float each); an int k (vLLM's
    #: and the Twinkle documents' form, e.g. ``logprobs=1``): per token a list of (token, log-prob) pairs, the
    #: sampled token first, then the others among the k most likely; False: none
    logprobs: bool | int = True
    #: per generated token, also the k most likely tokens with their log-probs (0: none)
    top_logprobs: int = Field(default=0, ge=0)
    prompt_logprobs: bool = False
    #: per prompt token, the k most likely (token, log-prob) pairs of the raw model at that position, most likely
    #: first (0: none; position 0, which nothing predicts, gets None). Needs `SamplerCapabilities.prompt_top_logprobs`
    prompt_top_logprobs: int = Field(default=0, ge=0)
    #: score only the last n prompt tokens: `prompt_logprobs` and `prompt_top_logprobs` are None before them
    #: (1 <= n <= len(prompt) - 1; None: the whole prompt). Leaves `prompt_target_tokens`/`prompt_alt_tokens` alone
    prompt_logprobs_last_n: int | None = Field(default=None, ge=1)
    #: token ids to score at prompt positions, the same for every prompt of the call: row i lists ids scored at
    #: prompt position i + 1 (len(prompt) - 1 rows, any number of columns), -1 = no id. Answered in
    #: `SampleResponse.prompt_target_logprobs`. Needs `SamplerCapabilities.prompt_target_logprobs`
    prompt_target_tokens: list[list[int]] | None = None
    #: at every prompt position after the first, k tokens drawn independently (with replacement, at `temperature`;
    #: top_k/top_p do not apply; seeded by `seed`) from the model's next-token distribution, with their raw
    #: log-probs (0: none). Answered in `SampleResponse.prompt_alt_tokens`. Needs
    #: `SamplerCapabilities.prompt_alt_tokens`
    prompt_alt_tokens: int = Field(default=0, ge=0)

    @field_validator('logprobs')
    @classmethod
    def _logprobs(cls, v: bool | int) -> bool | int:
        if not isinstance(v, bool) and v < 0:
            raise ValueError('logprobs must be True/False or a number of log-probs per token >= 0')
        return v

    @property
    def logprob_pairs(self) -> int | None:
        """k when `logprobs` asks for (token, log-prob) pairs (an int, not a bool), else None."""
        return None if isinstance(self.logprobs, bool) else self.logprobs

    @property
    def alternatives(self) -> int:
        """How many most-likely tokens per step a sampler must compute (for `top_logprobs` and pair logprobs)."""
        return max(self.top_logprobs, self.logprob_pairs or 0)

    @property
    def scores_prompt(self) -> bool:
        """Whether the prompt's positions must be scored (any of the prompt_* outputs asked for)."""
        return bool(
            self.prompt_logprobs
            or self.prompt_top_logprobs
            or self.prompt_target_tokens is not None
            or self.prompt_alt_tokens
        )

    @field_validator('prompt_target_tokens')
    @classmethod
    def _prompt_target_tokens(cls, v: list[list[int]] | None) -> list[list[int]] | None:
        if v is not None:
            if len({len(row) for row in v}) > 1:
                raise ValueError('prompt_target_tokens rows must all have the same length (pad with -1)')
            if not any(t >= 0 for row in v for t in row):
                raise ValueError('prompt_target_tokens names no token id (every cell is -1)')
            if any(t < -1 for row in v for t in row):
                raise ValueError('prompt_target_tokens holds ids below -1 (-1 marks a cell without an id)')
        return v

    @model_validator(mode='after')
    def _last_n_scores_something(self) -> SamplingParams:
        if self.prompt_logprobs_last_n is not None and not (self.prompt_logprobs or self.prompt_top_logprobs):
            raise ValueError('prompt_logprobs_last_n limits prompt_logprobs / prompt_top_logprobs; ask for one of them')
        return self

    @field_validator('top_k')
    @classmethod
    def _top_k(cls, v: int) -> int:
        if v == 0 or v < -1:
            raise ValueError('top_k must be -1 (disabled) or >= 1')
        return v

    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        if isinstance(self.stop, str):
            return [self.stop]
        return [s for s in self.stop if isinstance(s, str)]

    def stop_token_ids(self) -> list[int]:
        if self.stop is None or isinstance(self.stop, str):
            return []
        return [s for s in self.stop if isinstance(s, int)]


class SampledSequence(BaseModel):
    """One generated continuation. `logprobs[t]`: log p of `tokens[t]` (the raw model's, temperature 1) -- or,
    with ``SamplingParams(logprobs=k)``, the pairs ``[(tokens[t], log p), ...]`` (`SamplingParams.logprobs`).
    `top_logprobs[t]`: the `SamplingParams.top_logprobs` most likely (token, log p) at step t, most likely first.
    `new_input_feature`: the prompt row extended by the completion, trainable: ``input_ids`` = prompt +
    completion, ``labels`` (-100 on the prompt), the prompt row's other fields (e.g. ``ground_truth``) and, when
    it had ``messages``, the completion appended as the assistant's message -- what `forward_backward` and the
    rewards take (GRPO)."""

    tokens: list[int]
    logprobs: list[float] | list[list[tuple[int, float]]] | None = None
    stop_reason: StopReason
    text: str | None = None
    top_logprobs: list[list[tuple[int, float]]] | None = None
    new_input_feature: dict[str, Any] | None = None


class SampleResponse(BaseModel):
    """All samples for one prompt. `prompt_logprobs[0]` is None (nothing predicts the first token), and so are the
    entries before the last `SamplingParams.prompt_logprobs_last_n`.

    - `prompt_top_logprobs`: per prompt token the `SamplingParams.prompt_top_logprobs` most likely (token, log p)
      at that position, most likely first; None at position 0 and before the last `prompt_logprobs_last_n`.
    - `prompt_target_logprobs`: the log p of each id of `SamplingParams.prompt_target_tokens`, in its shape (row i:
      prompt position i + 1), 0.0 where the id is -1.
    - `prompt_alt_tokens`: row i holds the `SamplingParams.prompt_alt_tokens` draws (token, log p) at prompt
      position i + 1 (len(prompt) - 1 rows).

    Log-probs are the raw model's (temperature 1), like every other log-prob a sampler returns."""

    sequences: list[SampledSequence]
    prompt_logprobs: list[float | None] | None = None
    prompt_top_logprobs: list[list[tuple[int, float]] | None] | None = None
    prompt_target_logprobs: list[list[float]] | None = None
    prompt_alt_tokens: list[list[tuple[int, float]]] | None = None
