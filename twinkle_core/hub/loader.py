"""Load a component from a hub reference: parse -> trust check -> download -> verify -> import.

Trust rule (docs/architecture.md §7): hub code runs only when its repo revision is pinned in registry/
(revision + sha256) or the caller trusts it explicitly (``trust_remote_code=True``, or
``TWINKLE_TRUST_REMOTE_CODE=1`` when the argument is left as None). A pinned revision is always verified: files
whose sha256 differs are refused, even when trusted. Without a revision in the reference, the revision pinned in
registry/ is used when there is one.
A folder holding Python bytecode (``__pycache__``, ``*.pyc``: not covered by the sha256, and Python could run it
instead of the source) is refused, pinned or not; hub code is imported from its sources without writing any
(`twinkle_core.hub.importer`), so loading never changes what the next verification sees.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from twinkle_core import plugins, registry_index
from twinkle_core.errors import HubError, IntegrityError, UntrustedRemoteCodeError
from twinkle_core.hub import download
from twinkle_core.hub.importer import import_entry, package_name
from twinkle_core.hub.integrity import check_file_hashes, verified_sha256
from twinkle_core.hub.manifest import check_requirements, read_manifest
from twinkle_core.hub.ref import HubRef
from twinkle_core.kinds import KIND_HUB_LOADERS

_cache: dict[tuple[str, str, str], Any] = {}  # (package, entry, kind) -> loaded object


def trust_from_env() -> bool:
    return os.environ.get('TWINKLE_TRUST_REMOTE_CODE', '').strip().lower() in ('1', 'true', 'yes', 'on')


def find_pin(ref: HubRef) -> Any | None:
    """The registry/ entry pinning `ref`'s repo at `ref`'s revision (or its only pinned revision when `ref` has
    none), or None. An entry is a pin when it has a revision and a sha256 and/or a file-hash map."""
    pins = [e for e in registry_index.entries() if e.hub == ref.repo_url and e.is_pin]
    if ref.revision is not None:
        pins = [e for e in pins if e.revision == ref.revision]
    revisions = {(e.revision, e.sha256, tuple(sorted((e.files or {}).items()))) for e in pins}
    if len(revisions) > 1:
        listed = ', '.join(sorted(str(r) for r, *_ in revisions))
        raise HubError(
            f'registry/ pins {ref.repo_url} at several revisions ({listed}); say which one with '
            f'"@revision" in the reference.'
        )
    return pins[0] if pins else None


def load_hub_component(kind: str, ref: str | HubRef, *, trust_remote_code: bool | None = None) -> Any:
    """Return the class or callable of kind `kind` that `ref` (``ms://org/repo[@rev][:Name]``) names.

    Raises `UntrustedRemoteCodeError` (not pinned, not trusted), `IntegrityError` (sha256 differs from the pin,
    or the folder holds bytecode) or `HubError` (bad reference, download failure, bad manifest, missing requirement).
    """
    ref = ref if isinstance(ref, HubRef) else HubRef.parse(ref)
    pin = find_pin(ref)
    if pin is not None and ref.revision is None:
        ref = ref.with_revision(pin.revision)
    trusted = trust_remote_code if trust_remote_code is not None else trust_from_env()
    if pin is None and not trusted:
        raise UntrustedRemoteCodeError(
            f'Refusing to run hub code from {ref}: it is not pinned in registry/ or a lock file and not trusted. '
            f'Review the code (`twinkle hub pull {ref.repo_url}@{ref.effective_revision}'
            f'{" --kernel" if kind == "kernel" else ""}`), then either pin it -- `twinkle hub hash <folder> --repo '
            f'{ref.repo_url} --revision {ref.effective_revision}` prints the entry for registry/ or for a lock file '
            f'named by $TWINKLE_LOCK_FILE -- or pass trust_remote_code=True (or set TWINKLE_TRUST_REMOTE_CODE=1).'
        )
    folder = download.snapshot(ref, repo_type='kernel' if kind == 'kernel' else 'model')
    sha = verify_pin(folder, pin, str(ref)) if pin is not None else verified_sha256(folder, str(ref))
    if kind in KIND_HUB_LOADERS:  # e.g. a kernel repo in the `kernels` library's layout, imported by that library
        return plugins.import_target(KIND_HUB_LOADERS[kind])(ref, folder, sha)
    return _import_component(kind, ref, folder, sha)


def verify_pin(folder: Path, pin: Any, where: str) -> str:
    """Check `folder` against `pin` (its file-hash map, then its folder sha256); return the folder's sha256.
    Raises `IntegrityError` naming what differs; nothing of `folder` is imported before this passes."""
    if pin.files:
        check_file_hashes(folder, pin.files, where)
    sha = verified_sha256(folder, where)
    if pin.sha256 and sha != pin.sha256:
        raise IntegrityError(
            f'{where}: files at {folder} have sha256 {sha}, but registry/ pins {pin.sha256} for revision '
            f'{pin.revision}. The download was altered or the pin is stale; re-download (delete that folder) '
            f'or update the pin after reviewing the code.'
        )
    return sha


def _import_component(kind: str, ref: HubRef, folder: Path, sha: str) -> Any:
    where = str(ref)
    spec = read_manifest(folder).select(kind, ref.name, where)
    check_requirements(spec, where)
    package = package_name(ref.scheme, ref.org, ref.repo, ref.effective_revision, sha)
    key = (package, spec.entry, kind)
    if key not in _cache:
        _cache[key] = import_entry(package, folder, spec.entry, where)
    return _cache[key]
