"""`VisionTemplate` (also registered as ``Qwen3VLTemplate``): image + text trajectories for Qwen-VL-family models.

Encoding renders the conversation with the model's chat template (each image as one ``<|image_pad|>`` between
``<|vision_start|>``/``<|vision_end|>``), finds the trained tokens exactly as `ChatTemplate` does, then runs the
model's image processor and expands each image's pad token to the number of tokens the model sees for it
(``grid_t * grid_h * grid_w / merge_size**2``). Image tokens never carry loss.

An encoded row holds, besides ``input_ids``/``labels``: ``pixel_values`` (float32 ``[patches, dim]``, the images'
patches in order), ``image_grid_thw`` (``[[t, h, w], ...]``, one per image) and ``mm_token_type_ids`` (1 on image
tokens, 0 elsewhere). The raw images are not kept in the row: `Dataset.encode` drops the source columns, so a
cached encoding stores each image once, as the patches the model consumes. Text-only trajectories encode exactly
as `ChatTemplate` would.
"""

from __future__ import annotations

import os
from typing import Any

from twinkle_core.errors import InvalidInputError
from twinkle_core.template.chat_template import ChatTemplate, TruncationStrategy
from twinkle_core.template.images import load_image, split_images
from twinkle_core.template.tokenizer import resolve_source
from twinkle_core.types import TOKEN_TYPE_FIELD, Trajectory

IMAGE_TOKEN = '<|image_pad|>'


class VisionTemplate(ChatTemplate):
    """Chat template with images (see the module docstring for the row layout).

    Args:
        model_id_or_tokenizer: a model directory / ``ms://`` / ``hf://`` reference / HF id holding a tokenizer and
            an image processor; a processor object with ``.tokenizer`` and ``.image_processor``; or a tokenizer
            loaded from such a directory (the image processor is read from its ``name_or_path``).
        max_length, truncation_strategy, chat_template_kwargs: as `ChatTemplate`. Truncation never cuts into an
            image: a row whose limit falls inside or before an image raises `InvalidInputError`.
        min_pixels, max_pixels: bounds on each image's area after resizing (default: the image processor's);
            they decide how many tokens an image costs.
        image_token: the placeholder token that the chat template writes for an image.

    A subclass that sets ``images_optional = True`` also serves text-only checkpoints of a family: without an
    image processor (or image token) it encodes text, and a row with images is an error naming the model.
    """

    images_optional = False

    def __init__(
        self,
        model_id_or_tokenizer: Any,
        max_length: int | None = None,
        truncation_strategy: TruncationStrategy = 'right',
        min_pixels: int | None = None,
        max_pixels: int | None = None,
        image_token: str = IMAGE_TOKEN,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        processor = model_id_or_tokenizer
        if hasattr(processor, 'image_processor') and hasattr(processor, 'tokenizer'):
            tokenizer, image_processor = processor.tokenizer, processor.image_processor
        elif hasattr(processor, 'apply_chat_template'):
            tokenizer, image_processor = processor, self._image_processor_of(processor.name_or_path)
        else:
            source = resolve_source(processor)
            tokenizer, image_processor = source, self._image_processor_of(source)
        super().__init__(
            tokenizer,
            max_length=max_length,
            truncation_strategy=truncation_strategy,
            chat_template_kwargs=chat_template_kwargs,
        )
        self.image_processor = image_processor
        self.min_pixels = min_pixels
        self.max_pixels = max_pixels
        self.merge_size = int(getattr(image_processor, 'merge_size', 1) or 1)
        self.image_token = image_token
        self.image_token_id = self.tokenizer.convert_tokens_to_ids(image_token)
        problem = None
        if self.image_token_id is None or self.image_token_id == self.tokenizer.unk_token_id:
            problem = (
                f'the tokenizer of {self.tokenizer.name_or_path!r} has no {image_token!r} token: it is not a '
                'vision-language tokenizer (or pass image_token=...)'
            )
        elif image_processor is None:
            problem = f'{self.tokenizer.name_or_path!r} has no image processor (preprocessor_config.json)'
        if problem and not self.images_optional:
            raise InvalidInputError(problem[0].upper() + problem[1:] + '.')
        self.text_only_reason = problem

    def _image_processor_of(self, source: Any) -> Any:
        try:
            return load_image_processor(source)
        except InvalidInputError:
            if self.images_optional:
                return None
            raise

    # ---- encoding ----------------------------------------------------------------------------------------------
    def _encode(self, traj: Trajectory, add_generation_prompt: bool) -> dict[str, Any]:
        raw = [m.model_dump(exclude_none=True, exclude={'loss'}) for m in traj.messages]
        extras = traj.model_dump(exclude={'messages', 'tools', 'images'})
        messages, sources = split_images(raw, getattr(traj, 'images', None))
        if not sources:
            row = super()._encode(traj, add_generation_prompt)
            row.pop('images', None)
            return row
        if self.text_only_reason:
            raise InvalidInputError(f'This row has {len(sources)} image(s), but {self.text_only_reason}.')
        images = [load_image(s, where=f'image {i}') for i, s in enumerate(sources)]
        input_ids, labels = self._token_ids(traj, messages, add_generation_prompt)
        vision = self.process_images(images)
        input_ids, labels = self.expand_image_tokens(input_ids, labels, vision['tokens_per_image'])
        input_ids, labels = self._truncate_whole_images(
            input_ids, labels, len(vision['tokens_per_image']), keep_end=add_generation_prompt
        )
        row = {'input_ids': input_ids}
        if labels is not None:
            row['labels'] = labels
        row.update(pixel_values=vision['pixel_values'], image_grid_thw=vision['image_grid_thw'])
        row[TOKEN_TYPE_FIELD] = [int(t == self.image_token_id) for t in input_ids]
        return {**row, **extras}

    def process_images(self, images: list[Any]) -> dict[str, Any]:
        """PIL images -> ``pixel_values`` (float32 numpy ``[patches, dim]``), ``image_grid_thw`` and
        ``tokens_per_image`` (what each image costs in the token sequence)."""
        import numpy as np

        kwargs: dict[str, Any] = {}
        if self.min_pixels is not None or self.max_pixels is not None:
            size = dict(getattr(self.image_processor, 'size', None) or {})
            if self.min_pixels is not None:
                size['shortest_edge'] = self.min_pixels
            if self.max_pixels is not None:
                size['longest_edge'] = self.max_pixels
            kwargs['size'] = size
        out = self.image_processor(images=images, return_tensors='np', **kwargs)
        grid = np.asarray(out['image_grid_thw']).astype(int).tolist()
        tokens = [t * h * w // self.merge_size**2 for t, h, w in grid]
        return {
            'pixel_values': np.asarray(out['pixel_values'], dtype=np.float32),
            'image_grid_thw': grid,
            'tokens_per_image': tokens,
        }

    def expand_image_tokens(
        self, input_ids: list[int], labels: list[int] | None, tokens_per_image: list[int]
    ) -> tuple[list[int], list[int] | None]:
        """Replace the k-th image pad token by ``tokens_per_image[k]`` copies (labels: -100 on all of them)."""
        found = input_ids.count(self.image_token_id)
        if found != len(tokens_per_image):
            raise InvalidInputError(
                f'The rendered conversation has {found} {self.image_token!r} tokens for '
                f'{len(tokens_per_image)} images: the chat template must write one per image '
                f'(and the text must not contain {self.image_token!r} itself).'
            )
        ids_out: list[int] = []
        labels_out: list[int] = []
        k = 0
        for i, token in enumerate(input_ids):
            repeat = 1
            if token == self.image_token_id:
                repeat, k = tokens_per_image[k], k + 1
            ids_out += [token] * repeat
            if labels is not None:
                labels_out += [labels[i] if repeat == 1 and token != self.image_token_id else -100] * repeat
        return ids_out, labels_out if labels is not None else None

    def _truncate_whole_images(
        self, input_ids: list[int], labels: list[int] | None, num_images: int, keep_end: bool
    ) -> tuple[list[int], list[int] | None]:
        image_tokens = input_ids.count(self.image_token_id)
        ids, labs = self._truncate(input_ids, labels, keep_end=keep_end)
        if ids.count(self.image_token_id) != image_tokens:
            raise InvalidInputError(
                f'Encoded row has {len(input_ids)} tokens ({image_tokens} of them for {num_images} images), more than '
                f'max_length={self.max_length}, and truncating would cut an image. Raise max_length or lower '
                f'max_pixels (fewer tokens per image).'
            )
        return ids, labs

    def fingerprint(self) -> str:
        import hashlib
        import json

        digest = hashlib.sha256(super().fingerprint().encode())
        processor = self.image_processor
        config = processor.to_dict() if hasattr(processor, 'to_dict') else repr(processor)
        digest.update(
            json.dumps(
                [config, self.min_pixels, self.max_pixels, self.image_token], sort_keys=True, default=repr
            ).encode()
        )
        return digest.hexdigest()[:32]


def load_image_processor(source: str | os.PathLike[str]) -> Any:
    """The image processor stored with a model (the Pillow implementation where transformers has one: the
    torchvision-based 'fast' processors need torchvision, which CPU installs of this project do not have)."""
    from transformers import AutoImageProcessor

    try:
        return AutoImageProcessor.from_pretrained(source, backend='pil')
    except (OSError, ValueError, TypeError) as exc:
        try:
            return AutoImageProcessor.from_pretrained(source)
        except (OSError, ValueError) as second:
            raise InvalidInputError(
                f'Could not load an image processor from {os.fspath(source)!r}: a vision '
                f'template needs a vision-language model directory ({second}).'
            ) from exc
