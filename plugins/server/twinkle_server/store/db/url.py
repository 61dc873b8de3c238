"""Database URLs: which backend a URL names, and how to show it without its password."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from twinkle_server.store.db.base import DatabaseError

POSTGRES_SCHEMES = ('postgresql', 'postgres', 'postgresql+psycopg')
FORMS = 'sqlite:///PATH.db (sqlite:////ABSOLUTE/PATH.db) or postgresql://USER[:PASSWORD]@HOST[:PORT]/DBNAME'


def mask_url(url: str) -> str:
    """`url` with its password (in the authority or a `password=` query parameter) replaced by ***."""
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if parts.password is not None:
            userinfo, _, hostport = netloc.rpartition('@')
            netloc = f'{userinfo.split(":", 1)[0]}:***@{hostport}'
        query = parts.query
        if query:
            pairs = parse_qsl(query, keep_blank_values=True)
            query = urlencode([(k, '***' if k.lower() == 'password' else v) for k, v in pairs], safe='*')
        return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    except ValueError:  # unparsable: show no more than the scheme
        return url.split('://', 1)[0] + '://***' if '://' in url else '***'


def parse_url(url: str | None) -> tuple[str, str]:
    """('sqlite', path or '' for the default file) or ('postgresql', libpq URL). Raises `DatabaseError`.

    SQLite URLs follow SQLAlchemy: what follows ``sqlite:///`` is the path, so ``sqlite:///data/meta.db`` is relative
    (to the working directory) and ``sqlite:////srv/meta.db`` absolute; ``sqlite:///:memory:`` is a private
    in-memory database (gone when the server stops)."""
    if not url:
        return 'sqlite', ''
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a non-numeric port
    except ValueError as exc:
        raise DatabaseError(f'invalid database URL {mask_url(url)}: {exc}; expected {FORMS}') from None
    if parts.scheme == 'sqlite':
        path = url[len('sqlite:///') :] if url.startswith('sqlite:///') else ''
        if not path:
            raise DatabaseError(
                f'invalid database URL {mask_url(url)}: a SQLite URL names a file, '
                f'sqlite:///RELATIVE/PATH.db or sqlite:////ABSOLUTE/PATH.db (or sqlite:///:memory:)'
            )
        return 'sqlite', path
    if parts.scheme in POSTGRES_SCHEMES:
        if not parts.path.strip('/'):
            raise DatabaseError(
                f'invalid database URL {mask_url(url)}: name the database, postgresql://USER@HOST[:PORT]/DBNAME'
            )
        return 'postgresql', urlunsplit(('postgresql',) + tuple(parts)[1:])
    raise DatabaseError(f'unsupported database URL {mask_url(url)}: expected {FORMS}')
