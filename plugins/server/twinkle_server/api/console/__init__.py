"""The web console of the training service, at `/console` on the service's own port.

A tenant signs in with its API key (`session`: an HttpOnly, SameSite=Strict cookie; CSRF tokens on every
state-changing request) and sees exactly what the API would show it (`views`): its training runs with live metric
curves, checkpoints (download, delete), sampler checkpoints, pending requests, and a playground that samples from a
checkpoint. An operator key (`twinkle server keys create --admin`) also opens the server-wide view (`operator`).
The pages and the one script are shared with `twinkle console --logdir` (`twinkle_core.console`)."""

from __future__ import annotations

from fastapi import APIRouter

from twinkle_server.api.console import routes_api, routes_pages

__all__ = ['router']

router = APIRouter(include_in_schema=False)
router.include_router(routes_pages.router)
router.include_router(routes_api.router)
