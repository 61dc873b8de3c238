"""`twinkle hub publish FOLDER --repo REF`, `twinkle hub pull REF`, `twinkle hub hash FOLDER`.

None of these runs hub code: `pull` downloads and describes, `hash` computes the registry/ pin, `publish`
validates the manifest, uploads and prints the registry/ lines that pin what was uploaded.
"""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser('hub', help='publish, pull and hash hub components')
    sub = parser.add_subparsers(dest='hub_command', metavar='{publish,pull,hash}', required=True)
    pub = sub.add_parser('publish', help='upload a component folder (twinkle.toml + modules) to a hub repo')
    pub.add_argument('folder')
    pub.add_argument('--repo', required=True, help='ms://org/repo or hf://org/repo')
    pub.add_argument('--revision', help='branch to publish to (default: the hub default branch)')
    pub.add_argument('--message', help='commit message')
    pub.set_defaults(func=publish_command)
    pull = sub.add_parser('pull', help='download a hub component repo (no code runs) and describe it')
    pull.add_argument('ref', help='ms://org/repo[@revision] or hf://...')
    pull.add_argument('--kernel', action='store_true', help='a Hugging Face kernel repo (repo type "kernel")')
    pull.set_defaults(func=pull_command)
    hsh = sub.add_parser(
        'hash', help='the sha256 pin of a component folder; with --repo, the registry/ or lock-file entry'
    )
    hsh.add_argument('folder')
    hsh.add_argument('--repo', help='also print registry/ [[component]] tables for this hub repo')
    hsh.add_argument('--revision', help='the revision to pin (with --repo)')
    hsh.add_argument(
        '--files', action='store_true', help='pin file by file too (a [component.files] map; always for kernels)'
    )
    hsh.set_defaults(func=hash_command)


def publish_command(args: argparse.Namespace) -> int:
    from twinkle_core.hub.publish import publish

    done = publish(args.folder, args.repo, revision=args.revision, message=args.message)
    print(f'published {args.folder} -> {done.location}')
    print(f'revision: {done.revision}\nsha256: {done.sha256}\n\n# registry/ entries pinning it:')
    print(_pin_tables(done, args.folder, files=False))
    return 0


def _pin_tables(published: Any, folder: str, files: bool) -> str:
    """registry/ tables for `folder`'s components; with the file-hash map when asked or when it holds kernels
    (kernels are pinned file by file)."""
    from twinkle_core.hub.integrity import file_hashes
    from twinkle_core.hub.manifest import read_manifest

    components = read_manifest(folder).components
    with_files = files or any(c.kind == 'kernel' for c in components)
    return published.registry_toml([(c.name, c.kind) for c in components], file_hashes(folder) if with_files else None)


def pull_command(args: argparse.Namespace) -> int:
    from twinkle_core.errors import IntegrityError
    from twinkle_core.hub import download
    from twinkle_core.hub.integrity import verified_sha256
    from twinkle_core.hub.loader import find_pin, verify_pin
    from twinkle_core.hub.manifest import read_manifest
    from twinkle_core.hub.ref import HubRef

    ref = HubRef.parse(args.ref)
    pin = find_pin(ref)
    if pin is not None and ref.revision is None:
        ref = ref.with_revision(pin.revision)
    folder = download.snapshot(ref, repo_type='kernel' if args.kernel else 'model')
    sha = verified_sha256(folder, ref.repo_url)  # refuses bytecode in the folder, as loading would
    print(f'{ref.repo_url}@{ref.effective_revision} -> {folder}\nsha256: {sha}')
    if pin is None:
        print('pinned: no (loading it needs trust_remote_code=True or TWINKLE_TRUST_REMOTE_CODE=1)')
    else:
        try:
            verify_pin(folder, pin, ref.repo_url)
            print('pinned: yes, its files match the pin')
        except IntegrityError as exc:
            print(f'pinned: MISMATCH: {exc}')
    for c in read_manifest(folder).components:
        print(f'  {c.kind:<12} {c.name:<28} {c.entry}  v{c.version}  requires: {", ".join(c.requires) or "-"}')
    return 0


def hash_command(args: argparse.Namespace) -> int:
    from twinkle_core.hub.integrity import folder_sha256
    from twinkle_core.hub.publish import Published
    from twinkle_core.hub.ref import HubRef

    sha = folder_sha256(args.folder)
    if not args.repo:
        print(sha)
        return 0
    ref = HubRef.parse(args.repo)
    revision = args.revision or ref.effective_revision
    # valid TOML as a whole: paste it into registry/ or save it as a lock file ($TWINKLE_LOCK_FILE)
    print(f'# {args.folder}: sha256 {sha}')
    print(_pin_tables(Published(ref, args.folder, revision, sha), args.folder, files=args.files))
    return 0
