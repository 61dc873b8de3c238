"""Tinker image chunks -> model tokens and image fields, with the served model's own image processor.

A model input arrives as chunks: runs of token ids and `WireImage`s. `ImageEncoder.expand` turns it into
`ModelTokens`: every image becomes N copies of the model's image placeholder id (``<|image_pad|>``), N being what
this server's image processor computes for it (``t * h * w / merge_size**2``), plus the row fields of the images
(``pixel_values``, ``image_grid_thw``, ``mm_token_type_ids``; layout in `twinkle_core.template.vision`). An image
occupies N Tinker positions, as `ModelInput.length` counts it (its `expected_tokens`).

Refused with a 400 naming the chunk: `expected_tokens` different from N, bytes that do not decode (or are too
large, or are not the format the chunk names), formats other than png/jpeg, images for a text-only model, and
the placeholder id inside a text chunk of a VL model (the model would find more image tokens than images).

The encoder of a base model (a `VisionTemplate` over its directory) is built on first use and kept.
"""
from __future__ import annotations

import io
import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

import numpy as np

from twinkle_core.errors import InvalidInputError
from twinkle_core.types import TOKEN_TYPE_FIELD
from twinkle_server.errors import ApiError, bad_request

#: image formats a Tinker ImageChunk may name
WIRE_FORMATS = ('png', 'jpeg')


@dataclass(frozen=True)
class WireImage:
    """An ImageChunk as sent: encoded bytes, the format the client names, its advisory token count."""
    data: bytes
    format: str
    expected_tokens: int | None = None


#: one chunk of a model input: token ids, or an image
Chunk = Union[list[int], WireImage]


@dataclass
class ModelTokens:
    """A model input ready for a row: `tokens` with images expanded; image fields only when it has images."""
    tokens: list[int]
    token_types: list[int] | None = None  # 1 on image positions, 0 on text; None without images
    pixel_values: np.ndarray | None = None  # float32 [patches, dim]
    image_grid_thw: list[list[int]] = field(default_factory=list)

    @property
    def has_images(self) -> bool:
        return self.token_types is not None

    def image_fields(self, trailing_text: int = 0) -> dict[str, Any]:
        """``pixel_values`` / ``image_grid_thw`` / ``mm_token_type_ids`` (aligned with `tokens` followed by
        `trailing_text` more text tokens); {} without images."""
        if not self.has_images:
            return {}
        return {'pixel_values': self.pixel_values, 'image_grid_thw': self.image_grid_thw,
                TOKEN_TYPE_FIELD: list(self.token_types or []) + [0] * trailing_text}


def declared_length(chunks: list[Chunk]) -> int:
    """Positions the client counts for `chunks` (an image: its expected_tokens, 0 when unset)."""
    return sum(len(c) if isinstance(c, list) else (c.expected_tokens or 0) for c in chunks)


class ImageEncoder:
    """Image chunks of one served model. VL-ness is read from the model's ``config.json`` (a ``vision_config``);
    the `VisionTemplate` is built on first use, once (thread-safe)."""

    def __init__(self, base_model: str, model_dir: str) -> None:
        self.base_model, self.model_dir = base_model, model_dir
        self.accepts_images = _has_vision_config(model_dir)
        self._template: Any = None
        self._error: str | None = None
        self._lock = threading.Lock()

    def template(self) -> Any:
        """The model's `VisionTemplate`; a 400 when the model takes no images."""
        if not self.accepts_images:
            raise bad_request(f'model {self.base_model!r} does not accept images (it has no vision tower); send '
                              f'encoded_text chunks only')
        with self._lock:
            if self._template is None and self._error is None:
                from twinkle_core.template.vision import VisionTemplate
                try:
                    self._template = VisionTemplate(self.model_dir)
                except InvalidInputError as exc:
                    self._error = str(exc)
        if self._error is not None:
            raise bad_request(f'model {self.base_model!r} does not accept images: {self._error}')
        return self._template

    def placeholder_id(self) -> int | None:
        """The image placeholder token id; None when the model takes no images."""
        if not self.accepts_images:
            return None
        try:
            return int(self.template().image_token_id)
        except ApiError:
            return None

    def measure(self, chunks: list[Chunk], where: str) -> int:
        """The input's length with every image counted by this server, from the image headers alone (no pixel is
        decoded), so request caps can be checked first; refuses early what `expand` refuses (a text-only model,
        an unknown or mismatched format, a wrong `expected_tokens`)."""
        if any(isinstance(c, WireImage) for c in chunks):
            self.template()  # a text-only model refuses before any image is looked at
        length = 0
        for k, c in enumerate(chunks):
            if isinstance(c, list):
                length += len(c)
                continue
            size = _header_size(c, f'{where}: chunk {k} (image)')
            n = self._tokens_for(size)
            if n is not None:
                _check_expected(c, n, size, f'{where}: chunk {k} (image)', self.base_model)
            length += n if n is not None else (c.expected_tokens or 0)
        return length

    def expand(self, chunks: list[Chunk], where: str) -> ModelTokens:
        """`chunks` as model tokens (see the module docstring); `where` names the datum/prompt in errors. Images
        are decoded and processed one at a time (one decoded image in memory at once)."""
        pad = self.placeholder_id()
        for k, c in enumerate(chunks):
            if pad is not None and isinstance(c, list) and pad in c:
                raise bad_request(f'{where}: chunk {k} (encoded_text) contains token id {pad}, the image '
                                  f'placeholder of {self.base_model!r}; send images as ImageChunks (the server '
                                  f'writes their placeholder tokens)')
        if not any(isinstance(c, WireImage) for c in chunks):
            return ModelTokens([t for c in chunks for t in c])  # type: ignore[union-attr]
        template = self.template()
        tokens: list[int] = []
        types: list[int] = []
        pixels: list[np.ndarray] = []
        grids: list[list[int]] = []
        for k, c in enumerate(chunks):
            if isinstance(c, list):
                tokens += c
                types += [0] * len(c)
                continue
            image = _decode(c, f'{where}: chunk {k} (image)')
            try:
                vision = template.process_images([image])
            except (InvalidInputError, ValueError) as exc:
                raise bad_request(f'{where}: chunk {k} (image): the image processor of {self.base_model!r} '
                                  f'refused it: {exc}') from None
            n = int(vision['tokens_per_image'][0])
            _check_expected(c, n, image.size, f'{where}: chunk {k} (image)', self.base_model)
            tokens += [template.image_token_id] * n
            types += [1] * n
            pixels.append(vision['pixel_values'])
            grids += vision['image_grid_thw']
        return ModelTokens(tokens, types, np.concatenate(pixels), grids)

    def _tokens_for(self, size: tuple[int, int]) -> int | None:
        """Tokens of a `size` (width, height) image by the processor's own count; None when it cannot count."""
        processor = self.template().image_processor
        count = getattr(processor, 'get_number_of_image_patches', None)
        if count is None:
            return None
        width, height = size
        return int(count(height, width, {})) // self.template().merge_size ** 2


def _check_expected(image: WireImage, n: int, size: tuple[int, int], where: str, base_model: str) -> None:
    if image.expected_tokens is not None and image.expected_tokens != n:
        raise bad_request(f'{where} has expected_tokens={image.expected_tokens}, but this server computes {n} '
                          f'tokens for that {size[0]}x{size[1]} image with the image processor of {base_model!r}')


def _header_size(image: WireImage, where: str) -> tuple[int, int]:
    """(width, height) from the image header; a 400 for an unknown format or bytes that are not that format."""
    from PIL import Image, UnidentifiedImageError
    if image.format not in WIRE_FORMATS:
        raise bad_request(f'{where}: format {image.format!r} is not supported; use one of {list(WIRE_FORMATS)}')
    try:
        with Image.open(io.BytesIO(image.data)) as header:
            actual, size = (header.format or '').lower(), header.size
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        raise bad_request(f'{where}: the bytes are not a decodable image ({exc}).') from None
    if actual != image.format:
        raise bad_request(f'{where}: the bytes are {actual.upper() or "not an image"}, but the format was given as '
                          f'{image.format!r}.')
    return size


def _decode(image: WireImage, where: str) -> Any:
    from twinkle_core.template.images import decode_image_bytes
    if image.format not in WIRE_FORMATS:
        raise bad_request(f'{where}: format {image.format!r} is not supported; use one of {list(WIRE_FORMATS)}')
    try:
        return decode_image_bytes(image.data, where=where, expected_format=image.format)
    except InvalidInputError as exc:
        raise bad_request(str(exc)) from None


def _has_vision_config(model_dir: str) -> bool:
    try:
        config = json.loads((Path(model_dir) / 'config.json').read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and config.get('vision_config') is not None


_ENCODERS: dict[tuple[str, str], ImageEncoder] = {}
_ENCODERS_LOCK = threading.Lock()


def encoder_for(base_model: str, model_dir: str) -> ImageEncoder:
    """The (shared, lazily built) image encoder of a served model."""
    key = (base_model, str(model_dir))
    with _ENCODERS_LOCK:
        if key not in _ENCODERS:
            _ENCODERS[key] = ImageEncoder(base_model, str(model_dir))
        return _ENCODERS[key]
