"""The page shell every console page shares, the security headers it is sent with, and the static assets.

A page is server-rendered HTML whose `<main>` names its kind and its data URLs in ``data-*`` attributes; the one
script (`static/console.js`) reads them and fills the page from JSON, writing text with `textContent` only.
Every string put into HTML here goes through `esc`."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Mapping, Sequence

__all__ = ['CSP', 'SECURITY_HEADERS', 'STATIC_DIR', 'curves_panel', 'esc', 'page', 'runs_table', 'static_file']

STATIC_DIR = Path(__file__).parent / 'static'
#: no inline script or style, nothing from another origin, no framing, forms post only to this origin
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS: Mapping[str, str] = {
    'Content-Security-Policy': CSP,
    'X-Content-Type-Options': 'nosniff',
    'X-Frame-Options': 'DENY',
    'Referrer-Policy': 'no-referrer',
    'Cache-Control': 'no-store',
}
_TYPES = {'.js': 'text/javascript; charset=utf-8', '.css': 'text/css; charset=utf-8', '.LICENSE': 'text/plain'}


def esc(text: object) -> str:
    """`text` as HTML text or attribute value (quotes escaped too)."""
    return html.escape(str(text), quote=True)


def static_file(name: str) -> tuple[bytes, str] | None:
    """(content, content type) of the vendored asset `name`, or None for anything not shipped in `static/`."""
    if '/' in name or '\\' in name or name.startswith('.'):
        return None
    path = STATIC_DIR / name
    kind = _TYPES.get(path.suffix)
    if kind is None or not path.is_file():
        return None
    return path.read_bytes(), kind


def page(
    title: str,
    body: str,
    *,
    kind: str,
    base: str = '/console',
    nav: Sequence[tuple[str, str]] = (),
    data: Mapping[str, str] | None = None,
    csrf: str | None = None,
    signed_in_as: str | None = None,
) -> str:
    """A whole page: `body` (HTML, already escaped) inside `<main data-page=kind ...data>`; `nav`: (href, label)
    links; `csrf`: the token the script sends with every state-changing request (and sign-out's form carries);
    `signed_in_as`: shown with a sign-out button."""
    attrs = ''.join(f' data-{esc(k)}="{esc(v)}"' for k, v in {'page': kind, **(data or {})}.items())
    links = ''.join(f'<a href="{esc(href)}">{esc(label)}</a>' for href, label in nav)
    who = ''
    if signed_in_as is not None and csrf is not None:
        who = (
            f'<form class="signout" method="post" action="{esc(base)}/logout">'
            f'<span class="who">{esc(signed_in_as)}</span>'
            f'<input type="hidden" name="csrf_token" value="{esc(csrf)}">'
            '<button type="submit" id="signout">Sign out</button></form>'
        )
    meta = f'<meta name="csrf-token" content="{esc(csrf)}">' if csrf else ''
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'{meta}<title>{esc(title)} · twinkle console</title>'
        f'<link rel="stylesheet" href="{esc(base)}/static/uPlot.min.css">'
        f'<link rel="stylesheet" href="{esc(base)}/static/console.css">'
        f'<script defer src="{esc(base)}/static/uPlot.iife.min.js"></script>'
        f'<script defer src="{esc(base)}/static/console.js"></script></head><body>'
        f'<header><span class="brand">twinkle console</span><nav>{links}</nav>{who}</header>'
        f'<main{attrs}><h1>{esc(title)}</h1>{body}</main></body></html>'
    )


def curves_panel() -> str:
    """The curve controls and chart area the script fills (`data-metrics-url` of the page says from where)."""
    return (
        '<section class="curves"><h2>Curves</h2><div class="controls">'
        '<label>Smoothing <input type="range" id="smoothing" min="0" max="0.99" step="0.01" value="0">'
        '<output id="smoothing-value">0</output></label>'
        '<label><input type="checkbox" id="logscale"> Log scale</label></div>'
        '<div id="charts"><p class="empty">No metrics yet.</p></div></section>'
    )


def runs_table(columns: Sequence[tuple[str, str]]) -> str:
    """An empty runs table with these (key, heading) columns; the script fills its rows from the runs URL."""
    heads = ''.join(f'<th data-key="{esc(k)}">{esc(h)}</th>' for k, h in columns)
    return (
        '<section><h2>Runs</h2><table id="runs"><thead><tr><th>Plot</th>'
        f'{heads}</tr></thead><tbody></tbody></table></section>'
    )
