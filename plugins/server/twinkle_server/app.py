"""The FastAPI application: Tinker-compatible routes under /api/v1, native routes under /twinkle/v1."""
from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from twinkle_server.config import ServerConfig
from twinkle_server.engine import Engine, load_engine
from twinkle_server.errors import ApiError
from twinkle_server.service import Service

logger = logging.getLogger(__name__)


def create_app(config: ServerConfig, engines: dict[str, Engine] | None = None, device: str | None = None) -> FastAPI:
    """Build the app. Engines load at start-up (or pass ready `engines`, e.g. to share one across tests)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loaded = engines if engines is not None else {
            name: load_engine(name, path, device=device) for name, path in config.models.items()}
        app.state.service = Service(config, loaded, asyncio.get_running_loop())
        reaper = asyncio.create_task(_reap(app.state.service))
        logger.info('twinkle server ready: models %s, data in %s', sorted(loaded), config.data_dir)
        try:
            yield
        finally:
            reaper.cancel()
            app.state.service.close()

    app = FastAPI(title='twinkle server', lifespan=lifespan)
    _install_error_handlers(app)
    _install_body_limit(app, config.max_body_bytes)
    from twinkle_server.native import routes as native
    from twinkle_server.tinker import (routes_checkpoints, routes_futures, routes_sampling, routes_service,
                                       routes_training)
    for module in (routes_service, routes_training, routes_checkpoints, routes_sampling, routes_futures, native):
        app.include_router(module.router)
    return app


async def _reap(service: Service) -> None:
    while True:
        await asyncio.sleep(60)
        try:
            service.reap_sessions()
            service.store.prune_futures(older_than_s=24 * 3600)
        except Exception:  # noqa: BLE001
            logger.exception('session reaper failed')


def _install_error_handlers(app: FastAPI) -> None:
    no_retry = {'x-should-retry': 'false'}

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        headers = no_retry if exc.status < 500 and exc.status not in (408, 409, 429) else None
        return JSONResponse(exc.body(), status_code=exc.status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        msg = '; '.join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        return JSONResponse(ApiError(400, f'invalid request: {msg}').body(), status_code=400, headers=no_retry)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        logger.exception('unhandled error on %s', request.url.path)
        return JSONResponse(ApiError(500, f'internal error: {type(exc).__name__}: {exc}').body(), status_code=500)


def _install_body_limit(app: FastAPI, limit: int) -> None:
    @app.middleware('http')
    async def body_limit(request: Request, call_next: Any) -> Any:
        length = request.headers.get('content-length')
        if length is not None and length.isdigit() and int(length) > limit:
            err = ApiError(413, f'request body of {int(length)} bytes exceeds the server limit of {limit} bytes; '
                                f'send smaller batches (the tinker SDK splits forward_backward into chunks)')
            return JSONResponse(err.body(), status_code=413, headers={'x-should-retry': 'false'})
        return await call_next(request)
