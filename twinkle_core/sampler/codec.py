"""`TextCodec`: how a sampler turns chat prompts into token ids and completions into text -- through a template
when one is set, else the tokenizer's own chat template. Shared by every sampler so they encode and decode alike.
Image prompts need a template that encodes images (a `VisionTemplate`); a text-only one refuses them."""

from __future__ import annotations

from typing import Any

from twinkle_core.errors import InvalidInputError
from twinkle_core.registry import resolve
from twinkle_core.types import Trajectory


class TextCodec:
    """`tokenizer`: a Hugging Face tokenizer (or None); `model_id`: what names and classes of templates are built
    from when no tokenizer is given."""

    def __init__(self, tokenizer: Any, model_id: Any = None) -> None:
        self.tokenizer, self.model_id = tokenizer, model_id
        self.template: Any = None

    def set_template(self, template: Any, model_id: Any = None, **kwargs: Any) -> None:
        """Template by name (kind ``template``), class or instance. Names and classes get `model_id` (a model dir
        or tokenizer), by default the tokenizer; `kwargs` go to the template's constructor."""
        if isinstance(template, (str, type)):
            kwargs.setdefault('model_id_or_tokenizer', model_id or self.tokenizer or self.model_id)
        self.template = resolve('template', template, **kwargs)

    @property
    def can_encode_chat(self) -> bool:
        return self.template is not None or getattr(self.tokenizer, 'chat_template', None) is not None

    def encode_chat_row(self, trajectory: Trajectory) -> dict[str, Any]:
        """The encoded prompt of a Trajectory, generation prompt added: ``input_ids`` plus, from a vision template,
        the image fields (``pixel_values``, ``image_grid_thw``, ``mm_token_type_ids``). A trajectory with images
        and a template that drops them raises `InvalidInputError`."""
        if self.template is not None:
            row = dict(self.template.encode(trajectory, add_generation_prompt=True))
            row['input_ids'] = list(row['input_ids'])
        else:
            messages = [m.model_dump(exclude_none=True) for m in trajectory.messages]
            row = {
                'input_ids': list(
                    self.tokenizer.apply_chat_template(
                        messages, tools=trajectory.tools, add_generation_prompt=True, tokenize=True, return_dict=False
                    )
                )
            }
        if row.get('pixel_values') is None and _has_images(trajectory):
            used = type(self.template).__name__ if self.template is not None else "the tokenizer's chat template"
            raise InvalidInputError(
                f'The prompt has images but {used} encodes text only; set a vision template '
                "(sampler.set_template('VisionTemplate')) on a vision-language model."
            )
        return row

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str | None:
        """Text of `token_ids` (None without a template or tokenizer)."""
        if self.template is not None:
            return self.template.decode(token_ids, skip_special_tokens=skip_special_tokens)
        if self.tokenizer is not None:
            return self.tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)
        return None


def _has_images(trajectory: Trajectory) -> bool:
    """Whether `trajectory` holds images (an ``images`` list, or image parts in a message's content)."""
    if getattr(trajectory, 'images', None):
        return True
    return any(
        isinstance(m.content, list)
        and any(isinstance(part, dict) and part.get('type') in ('image', 'image_url') for part in m.content)
        for m in trajectory.messages
    )
