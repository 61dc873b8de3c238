"""Publish a component folder (``twinkle.toml`` + modules) to a hub repo; the inverse of `download.snapshot`.

Uses the hubs' own upload APIs (``HfApi.upload_folder``, modelscope ``HubApi.upload_folder``; credentials come
from their usual login/token settings). With ``TWINKLE_HUB_ROOT`` set the folder is copied into that local root
instead (tests, mirrors). Returns what to pin in registry/. `upload_folder` is the upload step alone (any folder,
optionally into a subfolder of the repo, a private repo, an explicit token), e.g. for the server's checkpoint push.

What is uploaded is exactly what the pin covers (`integrity.hashed_files`): the files are staged into a temporary
folder first, so hidden files and Python bytecode (``__pycache__``, ``*.pyc``) of the author's working copy are
neither uploaded nor hashed, and the sha256 printed here is the one the loader verifies.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from twinkle_core.errors import HubError
from twinkle_core.hub import download
from twinkle_core.hub.integrity import folder_sha256, hashed_files
from twinkle_core.hub.manifest import read_manifest
from twinkle_core.hub.ref import HubRef

# Also passed to the hub clients, though the staged folder never holds such files (defence in depth).
IGNORE = ['.*', '**/.*', '__pycache__/*', '**/__pycache__/*', '*.pyc', '*.pyo']


@dataclass(frozen=True)
class Published:
    """Where a folder went: `location` (URL or local path), the `revision` to pin and the folder's `sha256`."""

    ref: HubRef
    location: str
    revision: str
    sha256: str

    def registry_toml(self, names: list[tuple[str, str]], files: dict[str, str] | None = None) -> str:
        """``[[component]]`` tables for registry/ pinning this publication (`names`: (name, kind) pairs), with
        the file-hash map `files` (kernels are pinned file by file) when given."""
        listed = ''.join(f'"{rel}" = "{digest}"\n' for rel, digest in sorted((files or {}).items()))
        return '\n'.join(
            f'[[component]]\nname = "{n}"\nkind = "{k}"\nhub = "{self.ref.repo_url}"\n'
            f'revision = "{self.revision}"\nsha256 = "{self.sha256}"\n'
            + (f'[component.files]\n{listed}' if files else '')
            for n, k in names
        )


def publish(folder: str | Path, repo: str, *, revision: str | None = None, message: str | None = None) -> Published:
    """Upload `folder` to `repo` (``ms://org/repo`` / ``hf://org/repo``) at `revision` (default branch)."""
    folder = Path(folder)
    manifest = read_manifest(folder)  # refuse to publish what could not be loaded
    ref = HubRef.parse(repo)
    if ref.name:
        raise HubError(f'publish takes a repo ({ref.repo_url}), not a component name (":{ref.name}").')
    if revision:
        ref = ref.with_revision(revision)
    sha = folder_sha256(folder)
    message = message or f'twinkle hub publish: {", ".join(c.name for c in manifest.components)}'
    kernels_only = all(c.kind == 'kernel' for c in manifest.components)
    with tempfile.TemporaryDirectory(prefix='twinkle-publish-') as tmp:
        staged = Path(tmp) / 'component'
        _copy_hashed(folder, staged, sha)
        location, pinned = upload_folder(
            staged, ref, message=message, repo_type='kernel' if kernels_only and ref.scheme == 'hf' else None
        )
    return Published(ref, location, pinned, sha)


def upload_folder(
    folder: str | Path,
    ref: HubRef,
    *,
    message: str,
    path_in_repo: str = '',
    private: bool | None = None,
    token: str | None = None,
    repo_type: str | None = None,
) -> tuple[str, str]:
    """Upload every file of `folder` to `ref`'s repo at its revision (default branch when None), under
    `path_in_repo` ('' = the repo root). The repo is created when missing, private when `private` (None: the
    hub's default); an existing repo keeps its visibility. `token` None: the hub client's own login settings.
    Returns (location, revision to pin: the commit where the hub reports one).

    With ``TWINKLE_HUB_ROOT`` the files replace ``<root>/<scheme>/<org>/<repo>/<revision>/<path_in_repo>`` and a
    repo created there records its visibility in ``<root>/<scheme>/<org>/<repo>/.twinkle-repo.json``.
    `repo_type` 'kernel': a Hugging Face kernel repo."""
    folder = Path(folder)
    if path_in_repo and (path_in_repo.startswith('/') or '..' in Path(path_in_repo).parts):
        raise HubError(f'path_in_repo {path_in_repo!r} must be a relative path inside the repo')
    root = download.hub_root()
    if root is not None:
        return _upload_local(folder, root, ref, path_in_repo, private), ref.effective_revision
    try:
        if ref.scheme == 'hf':
            return _upload_hf(folder, ref, message, path_in_repo, private, token, repo_type)
        return _upload_ms(folder, ref, message, path_in_repo, private, token)
    except ImportError as exc:
        raise HubError(f'Uploading needs the hub client ({exc}). Run: pip install "twinkle-core[hub]"') from exc


LOCAL_REPO_SETTINGS = '.twinkle-repo.json'


def _upload_local(folder: Path, root: Path, ref: HubRef, path_in_repo: str, private: bool | None) -> str:
    settings = download.local_repo_dir(root, ref).parent / LOCAL_REPO_SETTINGS
    if not settings.exists():
        settings.parent.mkdir(parents=True, exist_ok=True)
        settings.write_text(json.dumps({'private': bool(private)}))
    dest = download.local_repo_dir(root, ref) / path_in_repo if path_in_repo else download.local_repo_dir(root, ref)
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(folder, dest)
    return str(dest)


def _copy_hashed(folder: Path, dest: Path, sha: str) -> None:
    """Copy exactly the files that `folder_sha256(folder)` covers into `dest` (symlinks followed); check that
    the copy still hashes to `sha`."""
    dest.mkdir(parents=True, exist_ok=True)
    for rel in hashed_files(folder):
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(folder / rel, dest / rel)
    if folder_sha256(dest) != sha:
        raise HubError(
            f'{folder} changed while it was being published (its sha256 is no longer {sha}); publish it again.'
        )


def _upload_hf(
    folder: Path,
    ref: HubRef,
    message: str,
    path_in_repo: str,
    private: bool | None,
    token: str | None,
    repo_type: str | None,
) -> tuple[str, str]:
    from huggingface_hub import HfApi

    api = HfApi(token=token) if token else HfApi()
    api.create_repo(ref.repo_id, exist_ok=True, repo_type=repo_type, **_given(private=private))
    if ref.revision:
        api.create_branch(ref.repo_id, branch=ref.revision, exist_ok=True, repo_type=repo_type)
    info = api.upload_folder(
        repo_id=ref.repo_id,
        folder_path=str(folder),
        revision=ref.revision,
        commit_message=message,
        ignore_patterns=IGNORE,
        repo_type=repo_type,
        path_in_repo=path_in_repo or None,
    )
    # Pin the immutable commit, not the branch name.
    return str(getattr(info, 'commit_url', info)), getattr(info, 'oid', None) or ref.effective_revision


def _upload_ms(
    folder: Path, ref: HubRef, message: str, path_in_repo: str, private: bool | None, token: str | None
) -> tuple[str, str]:
    from modelscope.hub.api import HubApi

    api = HubApi()
    visibility = None if private is None else ('private' if private else 'public')
    api.create_repo(ref.repo_id, exist_ok=True, **_given(visibility=visibility, token=token))
    api.upload_folder(
        repo_id=ref.repo_id,
        folder_path=str(folder),
        commit_message=message,
        revision=ref.effective_revision,
        ignore_patterns=IGNORE,
        **_given(path_in_repo=path_in_repo or None, token=token),
    )
    return f'https://modelscope.cn/models/{ref.repo_id}', ref.effective_revision


def _given(**kwargs: object) -> dict[str, object]:
    """The keyword arguments that are set (so the clients' own defaults apply to the others)."""
    return {k: v for k, v in kwargs.items() if v is not None}
