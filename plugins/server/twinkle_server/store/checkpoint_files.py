"""Checkpoint paths and atomic writes.

A checkpoint is addressed as `tinker://{run_id}/{weights|sampler_weights|external_weights}/{name}` (the native
client uses the same path with `twinkle://`; `external_weights` holds the PEFT adapter export of
`save_weights_external`, downloaded file by file through signed URLs). On disk it is
`<data_dir>/checkpoints/<tenant>/<run_id>/<kind>/<name>/` holding `adapter_model.safetensors` +
`adapter_config.json` (PEFT format), `optimizer.pt` for training state, and `twinkle_checkpoint.json` (base model,
LoRA config). Writes go to a temporary sibling directory that is
renamed into place with `os.replace`, so a crash never leaves a half-written checkpoint behind a listed name.
"""

from __future__ import annotations

import json
import os
import shutil
import unicodedata
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from twinkle_server.errors import bad_request

SCHEMES = ('tinker://', 'twinkle://')
SEGMENT_KIND = {'weights': 'training', 'sampler_weights': 'sampler', 'external_weights': 'external'}
META = 'twinkle_server.json'


@dataclass(frozen=True)
class CheckpointPath:
    run_id: str
    segment: str  # "weights" | "sampler_weights" | "external_weights"
    name: str
    scheme: str = 'tinker://'

    @property
    def checkpoint_id(self) -> str:
        return f'{self.segment}/{self.name}'

    @property
    def kind(self) -> str:
        return SEGMENT_KIND[self.segment]

    def uri(self, scheme: str | None = None) -> str:
        return f'{scheme or self.scheme}{self.run_id}/{self.segment}/{self.name}'


def parse_path(path: str) -> CheckpointPath:
    """Parse `tinker://run/weights/name` (or `twinkle://...`); raises 400 naming the expected shape."""
    scheme = next((s for s in SCHEMES if path.startswith(s)), None)
    parts = path[len(scheme) :].split('/') if scheme else []
    if scheme is None or len(parts) != 3 or parts[1] not in SEGMENT_KIND or not parts[0] or not parts[2]:
        raise bad_request(
            f'invalid checkpoint path {path!r}: expected tinker://<run_id>/weights/<name>, '
            f'tinker://<run_id>/sampler_weights/<name> or tinker://<run_id>/external_weights/<name>'
        )
    return CheckpointPath(parts[0], parts[1], parts[2], scheme)


MAX_NAME_CHARS = 128
_CONTROL = ('Cc', 'Zl', 'Zp')  # control characters, line and paragraph separators


def validate_name(name: str) -> str:
    """`name` when it can name a checkpoint directory (and be shown in a listing); else a 400 naming the rule."""
    if not name.strip() or any(unicodedata.category(c) in _CONTROL for c in name):
        raise bad_request(
            f'invalid checkpoint name {name[:MAX_NAME_CHARS]!r}: a name must not be blank and must not '
            f'contain control characters (newlines, tabs, NUL, escapes)'
        )
    if '/' in name or '\\' in name or name.startswith('.'):
        raise bad_request(
            f'invalid checkpoint name {name[:MAX_NAME_CHARS]!r}: a name must not contain "/" or "\\" '
            f'and must not start with "."'
        )
    if len(name) > MAX_NAME_CHARS:
        raise bad_request(f'checkpoint name of {len(name)} characters is too long (at most {MAX_NAME_CHARS})')
    return name


class CheckpointFiles:
    """Where checkpoints live on disk, and atomic writes into it."""

    def __init__(self, data_dir: str | Path) -> None:
        self.root = Path(data_dir) / 'checkpoints'
        self.root.mkdir(parents=True, exist_ok=True)
        self.remove_stale()

    def remove_stale(self) -> int:
        """Delete temporary directories an interrupted write left behind (a kill during a save). Returns how
        many. Call only when no write is in progress (start-up)."""
        stale = [p for pattern in ('.tmp-*', '.old-*') for p in self.root.rglob(pattern) if p.is_dir()]
        for p in stale:
            shutil.rmtree(p, ignore_errors=True)
        return len(stale)

    def free_bytes(self) -> int:
        """Space left for checkpoints (what an unprivileged writer may still use)."""
        return shutil.disk_usage(self.root).free

    def directory(self, tenant: str, path: CheckpointPath) -> Path:
        return self.root / tenant / path.run_id / path.segment / path.name

    def write(self, final: Path, fill: Callable[[str], None], meta: dict[str, Any], *, overwrite: bool = True) -> int:
        """Call `fill(tmp_dir)`, add the metadata file, then atomically move it to `final`. Returns its size."""
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.parent / f'.tmp-{final.name}-{uuid.uuid4().hex[:8]}'
        tmp.mkdir()
        try:
            fill(str(tmp))
            (tmp / META).write_text(json.dumps(meta, indent=1))
            _fsync_dir(tmp)
            if final.exists():
                if not overwrite:
                    raise bad_request(f'checkpoint {final.name!r} already exists; pass overwrite=True or a new name')
                trash = final.parent / f'.old-{final.name}-{uuid.uuid4().hex[:8]}'
                os.replace(final, trash)
                os.replace(tmp, final)
                shutil.rmtree(trash, ignore_errors=True)
            else:
                os.replace(tmp, final)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        return sum(f.stat().st_size for f in final.rglob('*') if f.is_file())

    def link_copy(self, source: str | Path, final: Path, meta: dict[str, Any]) -> int:
        """Copy the checkpoint in `source` to `final` (which must not exist) sharing its bytes: every file is
        hard-linked (copied where links are impossible, e.g. across file systems), the metadata file is written
        anew with `meta`. Atomic like `write`; deleting either checkpoint later leaves the other whole. Returns
        the size."""
        source = Path(source)

        def fill(tmp: str) -> None:
            for f in source.rglob('*'):
                rel = f.relative_to(source)
                if not f.is_file() or str(rel) == META:
                    continue
                (Path(tmp) / rel).parent.mkdir(parents=True, exist_ok=True)
                try:
                    os.link(f, Path(tmp) / rel)
                except OSError:
                    shutil.copy2(f, Path(tmp) / rel)

        return self.write(final, fill, meta, overwrite=False)

    @staticmethod
    def files(directory: str | Path) -> dict[str, Path]:
        """The files of a checkpoint a client downloads (relative path -> file), without the server's metadata
        file and hidden files."""
        root = Path(directory)
        out = {}
        for f in sorted(root.rglob('*')):
            rel = f.relative_to(root)
            if f.is_file() and str(rel) != META and not any(part.startswith('.') for part in rel.parts):
                out[rel.as_posix()] = f
        return out

    @staticmethod
    def read_meta(directory: str | Path) -> dict[str, Any]:
        return json.loads((Path(directory) / META).read_text())

    @staticmethod
    def delete(directory: str | Path) -> None:
        shutil.rmtree(directory, ignore_errors=True)


def _fsync_dir(directory: Path) -> None:
    for f in directory.rglob('*'):
        if f.is_file():
            with open(f, 'rb') as fh:
                os.fsync(fh.fileno())
