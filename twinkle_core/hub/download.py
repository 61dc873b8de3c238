"""Fetch a hub repo snapshot to a local folder through the hub's own client (cached by that client).

- ``ms://`` -> ``modelscope`` ``snapshot_download`` (via ``modelscope_hub``, the client modelscope>=1.38
  delegates to, when present: it does not import torch; cache: ``$MODELSCOPE_CACHE``, layout
  ``models/<org>--<repo>/snapshots/<revision>/``);
- ``hf://`` -> ``huggingface_hub.snapshot_download`` (cache: ``$HF_HUB_CACHE``/``$HF_HOME``, layout
  ``models--<org>--<repo>/{refs,snapshots,blobs}``).

Offline: ``TWINKLE_HUB_OFFLINE=1`` (both hubs) or ``HF_HUB_OFFLINE=1`` (Hugging Face) make the clients answer
from their cache only (``local_files_only=True``). Cache locations and offline flags are read at call time, so
they may change within a process (huggingface_hub itself freezes them at import).

``TWINKLE_HUB_ROOT=<dir>`` replaces both hubs by a local folder ``<dir>/<scheme>/<org>/<repo>/<revision>/``
(what `twinkle hub publish` writes there); meant for tests and air-gapped mirrors.
"""

from __future__ import annotations

import os
from pathlib import Path

from twinkle_core.errors import HubError
from twinkle_core.hub.ref import SCHEMES, HubRef


def hub_root() -> Path | None:
    """The local stand-in for both hubs (``$TWINKLE_HUB_ROOT``), or None."""
    env = os.environ.get('TWINKLE_HUB_ROOT')
    return Path(env) if env else None


def local_repo_dir(root: Path, ref: HubRef) -> Path:
    """Where `ref` lives under a local hub root."""
    return root / ref.scheme / ref.org / ref.repo / ref.effective_revision


def is_offline(scheme: str) -> bool:
    flags = ['TWINKLE_HUB_OFFLINE'] + (['HF_HUB_OFFLINE'] if scheme == 'hf' else [])
    return any(os.environ.get(f, '').strip().lower() in ('1', 'true', 'yes', 'on') for f in flags)


def snapshot(ref: HubRef, repo_type: str = 'model') -> Path:
    """Download (or find in cache) the files of `ref`'s repo at its revision; return the local folder.
    `repo_type` 'kernel': a Hugging Face kernel repo (cache folder ``kernels--org--repo``); ModelScope keeps
    kernels in model repos.

    Raises `HubError` with the client's reason and what to try next.
    """
    root = hub_root()
    if root is not None:
        folder = local_repo_dir(root, ref)
        if not folder.is_dir():
            raise HubError(
                f'{ref.repo_url}@{ref.effective_revision} is not in the local hub TWINKLE_HUB_ROOT={root} '
                f'(looked for {folder}). Publish it with `twinkle hub publish` or unset TWINKLE_HUB_ROOT.'
            )
        return folder
    offline = is_offline(ref.scheme)
    try:
        path = _download_ms(ref, offline) if ref.scheme == 'ms' else _download_hf(ref, offline, repo_type)
    except ImportError as exc:
        raise HubError(
            f'{SCHEMES[ref.scheme]} downloads need an extra package ({exc}). Run: pip install "twinkle-core[hub]"'
        ) from exc
    except HubError:
        raise
    except Exception as exc:  # noqa: BLE001 - every client error becomes one actionable HubError
        hint = (
            'it is not in the local cache and offline mode is on'
            if offline
            else 'check the repo id, the revision and your network/token'
        )
        raise HubError(
            f'Could not fetch {ref.repo_url}@{ref.effective_revision} from {SCHEMES[ref.scheme]}: '
            f'{hint}. ({type(exc).__name__}: {exc})'
        ) from exc
    return Path(path)


def _download_hf(ref: HubRef, offline: bool, repo_type: str) -> str:
    from huggingface_hub import snapshot_download

    cache_dir = os.environ.get('HF_HUB_CACHE') or (
        os.path.join(os.environ['HF_HOME'], 'hub') if os.environ.get('HF_HOME') else None
    )
    return snapshot_download(
        ref.repo_id,
        revision=ref.effective_revision,
        cache_dir=cache_dir,
        local_files_only=offline,
        repo_type=None if repo_type == 'model' else repo_type,
    )


def _download_ms(ref: HubRef, offline: bool) -> str:
    try:  # modelscope>=1.38 delegates to modelscope-hub; calling it directly skips modelscope's torch import
        from modelscope_hub.compat.snapshot_download import snapshot_download
    except ImportError:
        from modelscope.hub.snapshot_download import snapshot_download  # type: ignore[no-redef]  # the older home
    return snapshot_download(
        ref.repo_id,
        revision=ref.effective_revision,
        cache_dir=os.environ.get('MODELSCOPE_CACHE') or None,
        local_files_only=offline,
    )
