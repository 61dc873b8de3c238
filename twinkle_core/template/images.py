"""Images in conversations: where they are written, how they are decoded, and the limits that guard decoding.

Two ways to put images in a trajectory, both accepted everywhere:

- **content parts** (the OpenAI / Hugging Face chat layout): a message's ``content`` is a list of parts,
  ``{'type': 'text', 'text': ...}`` and ``{'type': 'image', 'image': SOURCE}`` (``image_url`` parts with a
  ``url`` are read the same way);
- **placeholders**: string contents hold ``<image>`` tags and the trajectory has an ``images`` list, one
  SOURCE per tag in reading order (the layout of most multimodal SFT data sets; it keeps a `datasets` column
  schema simple).

A SOURCE is a ``PIL.Image``, encoded bytes (PNG, JPEG, WebP, GIF, BMP), a ``{'bytes': ..., 'path': ...}`` dict
(the `datasets` ``Image`` feature), a local path or ``file://`` URL, or a ``data:image/...;base64,`` URL.
Remote URLs are refused (training never downloads on the fly: put the files in the data set).
"""

from __future__ import annotations

import base64
import io
import os
from typing import Any

from twinkle_core.errors import InvalidInputError

IMAGE_PLACEHOLDER = '<image>'
#: Encoded images larger than this are refused before decoding (bytes).
MAX_IMAGE_BYTES = 32 * 1024 * 1024
#: Decoded images with more pixels than this are refused (a decompression-bomb guard, not a training size:
#: the image processor's ``max_pixels`` decides the size the model sees).
MAX_IMAGE_PIXELS = 64 * 1024 * 1024
FORMATS = ('PNG', 'JPEG', 'WEBP', 'GIF', 'BMP')


def load_image(source: Any, *, where: str = 'image') -> Any:
    """`source` as an RGB ``PIL.Image``; `InvalidInputError` naming `where` when it cannot be one."""
    from PIL import Image

    if isinstance(source, Image.Image):
        return _checked(source, where).convert('RGB')
    if isinstance(source, dict):
        if source.get('bytes') is not None:
            return load_image(source['bytes'], where=where)
        if source.get('path'):
            return load_image(source['path'], where=where)
        if isinstance(source.get('url'), str):
            return load_image(source['url'], where=where)
        raise InvalidInputError(f'{where}: an image dict needs "bytes", "path" or "url", got keys {sorted(source)}.')
    if isinstance(source, (bytes, bytearray, memoryview)):
        return decode_image_bytes(bytes(source), where=where)
    if isinstance(source, (str, os.PathLike)):
        return decode_image_bytes(_read_reference(os.fspath(source), where), where=where)
    raise InvalidInputError(
        f'{where}: cannot read an image from a {type(source).__name__}; give a PIL image, bytes, '
        'a {"bytes", "path"} dict, a local path or a data: URL.'
    )


def decode_image_bytes(data: bytes, *, where: str = 'image', expected_format: str | None = None) -> Any:
    """Decode PNG/JPEG/... bytes into an RGB ``PIL.Image``, enforcing the size limits and, when given, the format."""
    from PIL import Image, UnidentifiedImageError

    if len(data) > MAX_IMAGE_BYTES:
        raise InvalidInputError(f'{where}: {len(data)} bytes is more than the {MAX_IMAGE_BYTES}-byte image limit.')
    try:
        image = Image.open(io.BytesIO(data))
        fmt = image.format
        if fmt not in FORMATS:
            raise InvalidInputError(f'{where}: image format {fmt!r} is not supported; use one of {FORMATS}.')
        if expected_format is not None and fmt != expected_format.upper().replace('JPG', 'JPEG'):
            raise InvalidInputError(f'{where}: the bytes are {fmt}, but the format was given as {expected_format!r}.')
        _checked(image, where)
        image.load()
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        raise InvalidInputError(f'{where}: the bytes are not a decodable image ({exc}).') from exc
    return image.convert('RGB')


def _checked(image: Any, where: str) -> Any:
    width, height = image.size
    if width < 1 or height < 1 or width * height > MAX_IMAGE_PIXELS:
        raise InvalidInputError(
            f'{where}: a {width}x{height} image is outside the accepted size (1 to {MAX_IMAGE_PIXELS} pixels).'
        )
    return image


def _read_reference(ref: str, where: str) -> bytes:
    if ref.startswith('data:'):
        header, _, payload = ref.partition(',')
        if ';base64' not in header:
            raise InvalidInputError(f'{where}: only base64 data: URLs are supported.')
        try:
            return base64.b64decode(payload, validate=True)
        except ValueError as exc:
            raise InvalidInputError(f'{where}: the data: URL is not valid base64 ({exc}).') from exc
    if ref.startswith(('http://', 'https://')):
        raise InvalidInputError(
            f'{where}: {ref!r} is a remote URL; images are never downloaded during training. '
            'Store the files with the data set and refer to them by path.'
        )
    path = ref[len('file://') :] if ref.startswith('file://') else ref
    try:
        with open(path, 'rb') as handle:
            return handle.read(MAX_IMAGE_BYTES + 1)
    except OSError as exc:
        raise InvalidInputError(f'{where}: cannot read image file {path!r} ({exc.strerror}).') from exc


# ---- images inside messages --------------------------------------------------------------------------------
def split_images(
    messages: list[dict[str, Any]], images: list[Any] | None = None
) -> tuple[list[dict[str, Any]], list[Any]]:
    """Messages with every image replaced by an ``{'type': 'image'}`` part, and the image sources in order.

    Accepts both layouts described in the module docstring (not mixed within one trajectory). Text-only
    messages keep their string content. Raises when ``<image>`` tags and `images` disagree in number.
    """
    pool = list(images or [])
    uses_tags = bool(pool)
    out: list[dict[str, Any]] = []
    found: list[Any] = []
    for index, message in enumerate(messages):
        content = message.get('content')
        if isinstance(content, list):
            parts = [_normalise_part(part, index, found) for part in content]
            out.append({**message, 'content': parts})
        elif uses_tags and isinstance(content, str) and IMAGE_PLACEHOLDER in content:
            pieces = content.split(IMAGE_PLACEHOLDER)
            parts = []
            for k, text in enumerate(pieces):
                if k:
                    if not pool:
                        raise InvalidInputError(
                            f'message {index} has more {IMAGE_PLACEHOLDER} tags than the '
                            f'trajectory has images ({len(images or [])}).'
                        )
                    found.append(pool.pop(0))
                    parts.append({'type': 'image'})
                if text:
                    parts.append({'type': 'text', 'text': text})
            out.append({**message, 'content': parts})
        else:
            out.append(message)
    if pool:
        raise InvalidInputError(
            f'the trajectory has {len(images or [])} images but only {len(images or []) - len(pool)}'
            f' {IMAGE_PLACEHOLDER} tags in its messages; write one tag where each image goes.'
        )
    return out, found


def _normalise_part(part: Any, message_index: int, found: list[Any]) -> dict[str, Any]:
    if isinstance(part, str):
        return {'type': 'text', 'text': part}
    if not isinstance(part, dict):
        raise InvalidInputError(f'message {message_index}: a content part must be a dict, got {type(part).__name__}.')
    kind = part.get('type') or ('image' if 'image' in part else 'text')
    if kind == 'text':
        return {'type': 'text', 'text': str(part.get('text') or '')}
    if kind in ('image', 'image_url'):
        source = part.get('image') if kind == 'image' else part.get('image_url')
        if source is None:
            raise InvalidInputError(f'message {message_index}: an {kind!r} part has no {kind!r} field.')
        found.append(source)
        return {'type': 'image'}
    raise InvalidInputError(
        f'message {message_index}: content parts of type {kind!r} are not supported (text and image are).'
    )


def text_of(content: Any) -> str:
    """The text of a message content: the string itself, or its text parts joined."""
    if isinstance(content, list):
        return ''.join(p.get('text', '') for p in content if isinstance(p, dict) and p.get('type') == 'text')
    return '' if content is None else str(content)
