"""`Qwen3Template`: ChatML with Qwen3's thinking switch."""

from __future__ import annotations

from typing import Any

from twinkle_core.template.chat_template import ChatTemplate, TruncationStrategy
from twinkle_core.template.vision import VisionTemplate


class Qwen3Template(ChatTemplate):
    """Qwen3 (ChatML) template. `enable_thinking` is passed to Qwen3's chat template: ``False`` renders an empty
    ``<think>\\n\\n</think>`` block after the generation prompt (non-thinking mode); None keeps the model's default.
    """

    def __init__(
        self,
        model_id_or_tokenizer: Any,
        max_length: int | None = None,
        truncation_strategy: TruncationStrategy = 'right',
        enable_thinking: bool | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        kwargs = dict(chat_template_kwargs or {})
        if enable_thinking is not None:
            kwargs['enable_thinking'] = enable_thinking
        super().__init__(
            model_id_or_tokenizer,
            max_length=max_length,
            truncation_strategy=truncation_strategy,
            chat_template_kwargs=kwargs,
        )
        self.enable_thinking = enable_thinking


class Qwen3_5Template(VisionTemplate):
    """The Qwen3.5 family: Qwen3's thinking switch, and images (Qwen3.5 is natively multimodal). A Qwen3.5-style
    checkpoint without an image processor encodes text only; rows with images are then an error."""

    images_optional = True

    def __init__(
        self,
        model_id_or_tokenizer: Any,
        max_length: int | None = None,
        truncation_strategy: TruncationStrategy = 'right',
        enable_thinking: bool | None = None,
        min_pixels: int | None = None,
        max_pixels: int | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        kwargs = dict(chat_template_kwargs or {})
        if enable_thinking is not None:
            kwargs['enable_thinking'] = enable_thinking
        super().__init__(
            model_id_or_tokenizer,
            max_length=max_length,
            truncation_strategy=truncation_strategy,
            min_pixels=min_pixels,
            max_pixels=max_pixels,
            chat_template_kwargs=kwargs,
        )
        self.enable_thinking = enable_thinking
