"""Tinker image chunks -> model tokens and image fields, with the served model's own image processor.

A model input arrives as chunks: runs of token ids and `WireImage`s. `ImageEncoder.expand` turns it into
`ModelTokens`: every image becomes N copies of the model's image placeholder id (``<|image_pad|>``), N being what
this server's image processor computes for it (``t * h * w / merge_size**2``), plus the row fields of the images
(``pixel_values``, ``image_grid_thw``, ``mm_token_type_ids``; layout in `twinkle_core.template.vision`). An image
occupies N Tinker positions, as `ModelInput.length` counts it (its `expected_tokens`).

Refused with a 400 naming the chunk: `expected_tokens` different from N, bytes that do not decode (or are too
large, or are not the format the chunk names), formats other than png/jpeg, a size the image processor refuses
(e.g. Qwen-VL's aspect ratio over 200), images for a text-only model, and the placeholder id inside a text chunk of
a VL model (the model would find more image tokens than images).

Decoding memory is bounded (`ImagePolicy`, all checked from the image headers before any pixel is decoded): per
image by the tenant's `max_image_pixels`, per request by its `max_image_bytes_per_request` (413 over either), and
per server by a `DecodeBudget` of `image_decode_budget_bytes`: each image holds `decode_cost` bytes of it while it
is decoded and processed (one image of a request at a time); an image that does not fit waits up to
`DECODE_WAIT_S`, then its request is answered 429 with Retry-After, and one larger than the whole budget is a 413.

The encoder of a base model (a `VisionTemplate` over its directory) is built on first use and kept.
"""

from __future__ import annotations

import io
import json
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from twinkle_core.errors import InvalidInputError
from twinkle_core.template.images import MAX_IMAGE_PIXELS, decode_image_bytes
from twinkle_core.template.vision import VisionTemplate
from twinkle_core.types import TOKEN_TYPE_FIELD
from twinkle_server.errors import ApiError, bad_request, over_limit

#: image formats a Tinker ImageChunk may name
WIRE_FORMATS = ('png', 'jpeg')
#: peak memory of decoding one image and running the image processor on it, per pixel of the image: the decoded
#: and RGB copies plus the processor's array and resize copies (~14 B measured with the Pillow Qwen2-VL processor),
#: rounded up. What an image is charged against the request and server budgets.
DECODE_BYTES_PER_PIXEL = 16
#: how long an image waits for room in the server's decode budget before its request is answered 429
DECODE_WAIT_S = 10.0
#: the Retry-After of that 429
DECODE_RETRY_AFTER_S = 2.0


@dataclass(frozen=True)
class WireImage:
    """An ImageChunk as sent: encoded bytes, the format the client names, its advisory token count."""

    data: bytes
    format: str
    expected_tokens: int | None = None


#: one chunk of a model input: token ids, or an image
Chunk = list[int] | WireImage
#: (width, height) of an image, as its header gives it
Size = tuple[int, int]


def decode_cost(size: Size) -> int:
    """Bytes decoding and processing a `size` image takes at its peak."""
    return size[0] * size[1] * DECODE_BYTES_PER_PIXEL


class DecodeBudget:
    """The bytes of images being decoded at once on one server: a semaphore counted in bytes (`capacity` None =
    unbounded, still tracked). `in_use` and `peak` are what it holds now and held at most."""

    def __init__(self, capacity: int | None, wait_s: float = DECODE_WAIT_S) -> None:
        self.capacity, self.wait_s = capacity, wait_s
        self.in_use = self.peak = 0
        self._changed = threading.Condition()

    def check_fits(self, cost: int, what: str) -> None:
        """413 when `cost` is more than the whole budget (waiting could never help)."""
        if self.capacity is not None and cost > self.capacity:
            raise over_limit('image_decode_budget_bytes', self.capacity, f'{cost} bytes', what)

    @contextmanager
    def hold(self, cost: int, what: str) -> Iterator[None]:
        """Hold `cost` bytes while the block runs: waits up to `wait_s` for them, then 429 with Retry-After."""
        self.check_fits(cost, what)
        deadline = time.monotonic() + self.wait_s
        with self._changed:
            while self.capacity is not None and self.in_use + cost > self.capacity:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ApiError(
                        429,
                        f'{what} needs {cost} bytes, but images being decoded now hold {self.in_use} '
                        f'of the server limit image_decode_budget_bytes={self.capacity}; retry shortly',
                        retry_after_s=DECODE_RETRY_AFTER_S,
                    )
                self._changed.wait(left)
            self.in_use += cost
            self.peak = max(self.peak, self.in_use)
        try:
            yield
        finally:
            with self._changed:
                self.in_use -= cost
                self._changed.notify_all()


@dataclass(frozen=True)
class Sized:
    """A model input as counted from its image headers: its length in tokens and its images' sizes."""

    tokens: int
    images: tuple[Size, ...] = ()


@dataclass(frozen=True)
class ImagePolicy:
    """What decoding the images of one request may cost: `max_pixels` per image (never above the decoder's own
    `MAX_IMAGE_PIXELS`), `max_request_bytes` for all of them (`decode_cost`; None = unlimited), and room in the
    server's `budget` while each is decoded."""

    max_pixels: int | None = MAX_IMAGE_PIXELS
    max_request_bytes: int | None = None
    budget: DecodeBudget = field(default_factory=lambda: DecodeBudget(None))

    def check_image(self, size: Size, where: str) -> None:
        """413 for an image over the pixel cap or larger than the whole server budget."""
        width, height = size
        cap = min(MAX_IMAGE_PIXELS, self.max_pixels if self.max_pixels is not None else MAX_IMAGE_PIXELS)
        if width * height > cap:
            raise over_limit(
                'max_image_pixels', cap, f'{width}x{height} = {width * height} pixels', f'{where}: the image'
            )
        self.budget.check_fits(decode_cost(size), f'{where}: decoding a {width}x{height} image')

    def check_request(self, inputs: list[Sized]) -> None:
        """413 when decoding every image of the request (`inputs`) costs more than `max_request_bytes` in all."""
        sizes = [size for s in inputs for size in s.images]
        total = sum(decode_cost(size) for size in sizes)
        if self.max_request_bytes is not None and total > self.max_request_bytes:
            width, height = max(sizes, key=lambda size: size[0] * size[1])
            raise over_limit(
                'max_image_bytes_per_request',
                self.max_request_bytes,
                f'{total} bytes: {len(sizes)} image(s), the largest {width}x{height}, '
                f'{DECODE_BYTES_PER_PIXEL} bytes per pixel',
                'decoding the images of this request',
            )


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
        return {
            'pixel_values': self.pixel_values,
            'image_grid_thw': self.image_grid_thw,
            TOKEN_TYPE_FIELD: list(self.token_types or []) + [0] * trailing_text,
        }


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
            raise bad_request(
                f'model {self.base_model!r} does not accept images (it has no vision tower); send '
                f'encoded_text chunks only'
            )
        with self._lock:
            if self._template is None and self._error is None:
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

    def measure(self, chunks: list[Chunk], where: str, policy: ImagePolicy) -> Sized:
        """The input's length with every image counted by this server, and its images' sizes, from the image
        headers alone (no pixel is decoded), so request caps can be checked first; refuses early what `expand`
        refuses (a text-only model, an unknown or mismatched format, a size the processor or `policy` refuses, a
        wrong `expected_tokens`)."""
        if any(isinstance(c, WireImage) for c in chunks):
            self.template()  # a text-only model refuses before any image is looked at
        length, sizes = 0, []
        for k, c in enumerate(chunks):
            if isinstance(c, list):
                length += len(c)
                continue
            size, n = self._admit(c, f'{where}: chunk {k} (image)', policy)
            sizes.append(size)
            length += n if n is not None else (c.expected_tokens or 0)
        return Sized(length, tuple(sizes))

    def expand(self, chunks: list[Chunk], where: str, policy: ImagePolicy | None = None) -> ModelTokens:
        """`chunks` as model tokens (see the module docstring); `where` names the datum/prompt in errors. Each image
        is checked from its header, then decoded and processed holding its `decode_cost` in `policy.budget`, one
        at a time (one decoded image in memory at once)."""
        policy = policy or ImagePolicy()
        pad = self.placeholder_id()
        for k, c in enumerate(chunks):
            if pad is not None and isinstance(c, list) and pad in c:
                raise bad_request(
                    f'{where}: chunk {k} (encoded_text) contains token id {pad}, the image '
                    f'placeholder of {self.base_model!r}; send images as ImageChunks (the server '
                    f'writes their placeholder tokens)'
                )
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
            what = f'{where}: chunk {k} (image)'
            size, _ = self._admit(c, what, policy)
            with policy.budget.hold(decode_cost(size), f'{what}: decoding a {size[0]}x{size[1]} image'):
                vision = self._process(c, what)
            n = int(vision['tokens_per_image'][0])
            _check_expected(c, n, size, what, self.base_model)
            tokens += [template.image_token_id] * n
            types += [1] * n
            pixels.append(vision['pixel_values'])
            grids += vision['image_grid_thw']
        return ModelTokens(tokens, types, np.concatenate(pixels), grids)

    def _admit(self, image: WireImage, where: str, policy: ImagePolicy) -> tuple[Size, int | None]:
        """(size, tokens) of an image from its header, after the checks that need no pixel: format, `policy`'s
        per-image caps, the processor's bounds and `expected_tokens` (tokens None: the processor cannot count)."""
        size = _header_size(image, where)
        policy.check_image(size, where)
        n = self._tokens_for(size, where)
        if n is not None:
            _check_expected(image, n, size, where, self.base_model)
        return size, n

    def _tokens_for(self, size: Size, where: str) -> int | None:
        """Tokens of a `size` image by the processor's own count (a 400 for a size it refuses, e.g. an aspect ratio
        over its limit); None when it cannot count."""
        processor = self.template().image_processor
        count = getattr(processor, 'get_number_of_image_patches', None)
        if count is None:
            return None
        width, height = size
        try:
            return int(count(height, width, {})) // self.template().merge_size ** 2
        except ValueError as exc:
            raise _refused(where, size, self.base_model, exc) from None

    def _process(self, image: WireImage, where: str) -> dict[str, Any]:
        """Decode one image and run the model's image processor on it (`VisionTemplate.process_images`)."""
        decoded = _decode(image, where)
        try:
            return self.template().process_images([decoded])
        except ValueError as exc:  # InvalidInputError included
            raise _refused(where, decoded.size, self.base_model, exc) from None


def _refused(where: str, size: Size, base_model: str, exc: Exception) -> ApiError:
    return bad_request(
        f'{where}: a {size[0]}x{size[1]} image cannot be used with the image processor of {base_model!r}: {exc}'
    )


def _check_expected(image: WireImage, n: int, size: Size, where: str, base_model: str) -> None:
    if image.expected_tokens is not None and image.expected_tokens != n:
        raise bad_request(
            f'{where} has expected_tokens={image.expected_tokens}, but this server computes {n} '
            f'tokens for that {size[0]}x{size[1]} image with the image processor of {base_model!r}'
        )


def _header_size(image: WireImage, where: str) -> Size:
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
        raise bad_request(
            f'{where}: the bytes are {actual.upper() or "not an image"}, but the format was given as {image.format!r}.'
        )
    return size


def _decode(image: WireImage, where: str) -> Any:
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
