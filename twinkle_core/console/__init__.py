"""The console: one browser front-end for the training service (`/console`, mounted by twinkle-server) and for
local runs (`twinkle console --logdir DIR`).

Pages are rendered on the server (`pages`), data comes from small JSON endpoints polled by one plain script
(`static/console.js`); curves are drawn with uPlot, vendored and pinned in `static/` with its licence (no CDN, no
build step). Every page carries `SECURITY_HEADERS`: a strict Content-Security-Policy (scripts and styles from the
page's own origin only, no inline script), no framing, no caching. Everything here is standard library only.
"""

from __future__ import annotations

from twinkle_core.console.pages import SECURITY_HEADERS, STATIC_DIR, page, static_file

__all__ = ['SECURITY_HEADERS', 'STATIC_DIR', 'page', 'static_file']
