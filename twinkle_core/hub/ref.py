"""Hub references: ``ms://org/repo[@revision][:Name]`` and ``hf://org/repo[@revision][:Name]``.

`HubRef.parse` is strict: a malformed reference raises `HubError` saying which part is wrong and showing the
expected form, so a typo never turns into a confusing download error.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from twinkle_core.errors import HubError

SCHEMES: dict[str, str] = {'ms': 'ModelScope', 'hf': 'Hugging Face'}
DEFAULT_REVISION: dict[str, str] = {'ms': 'master', 'hf': 'main'}
FORM = '<ms|hf>://org/repo[@revision][:Name]'

_SEGMENT = re.compile(r'^[A-Za-z0-9][A-Za-z0-9._-]*$')
_REVISION = re.compile(r'^[A-Za-z0-9][A-Za-z0-9._/-]*$')
_NAME = re.compile(r'^[A-Za-z_][A-Za-z0-9_.-]*$')


@dataclass(frozen=True)
class HubRef:
    """A parsed hub reference. `revision` None means the hub's default branch; `name` None means "the only
    component of the asked kind in the repo's manifest"."""

    scheme: str
    org: str
    repo: str
    revision: str | None = None
    name: str | None = None

    @classmethod
    def parse(cls, text: str) -> HubRef:
        if not isinstance(text, str):
            raise HubError(f'A hub reference must be a string like {FORM!r}, got {text!r}.')
        scheme, sep, rest = text.partition('://')
        if not sep or scheme not in SCHEMES:
            raise HubError(f'Hub reference {text!r} must start with ms:// or hf:// (form: {FORM}).')
        path, _, name = rest.partition(':')
        path, at, revision = path.partition('@')
        if not is_repo_id(path):
            raise HubError(
                f'Hub reference {text!r}: {path!r} is not "org/repo" (letters, digits, ".", "_", "-"; form: {FORM}).'
            )
        if at and (not _REVISION.match(revision) or '..' in revision.split('/') or revision.endswith('/')):
            raise HubError(f'Hub reference {text!r}: revision {revision!r} is empty or malformed (form: {FORM}).')
        if ':' in rest and not _NAME.match(name):
            raise HubError(
                f'Hub reference {text!r}: component name {name!r} is empty or not an identifier (form: {FORM}).'
            )
        org, repo = path.split('/')
        return cls(scheme, org, repo, revision or None, name or None)

    @property
    def repo_id(self) -> str:
        """``org/repo`` as the hub clients expect it."""
        return f'{self.org}/{self.repo}'

    @property
    def repo_url(self) -> str:
        """``scheme://org/repo`` (no revision, no name): how registry/ names a hub repo."""
        return f'{self.scheme}://{self.repo_id}'

    @property
    def effective_revision(self) -> str:
        return self.revision or DEFAULT_REVISION[self.scheme]

    def with_revision(self, revision: str | None) -> HubRef:
        return HubRef(self.scheme, self.org, self.repo, revision, self.name)

    def __str__(self) -> str:
        out = self.repo_url
        if self.revision:
            out += f'@{self.revision}'
        if self.name:
            out += f':{self.name}'
        return out


def is_repo_id(text: object) -> bool:
    """True for a bare hub id ``org/repo``: two segments of letters, digits, ".", "_", "-", each starting with a
    letter or digit (so never ``.`` or ``..``)."""
    parts = text.split('/') if isinstance(text, str) else ()
    return len(parts) == 2 and all(_SEGMENT.fullmatch(p) for p in parts)


def is_hub_ref(text: object) -> bool:
    """True for strings that use a hub scheme (they may still be malformed)."""
    return isinstance(text, str) and text.split('://', 1)[0] in SCHEMES and '://' in text
