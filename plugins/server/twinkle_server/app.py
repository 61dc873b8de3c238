"""The FastAPI application: Tinker-compatible routes under /api/v1, native routes under /twinkle/v1, the
OpenAI-compatible routes under /v1 (`api/openai/`), Prometheus metrics at /metrics, the web console at /console
(`console/`).

Middleware, outermost first: request ids and access log (`logs.py`), HTTP request counts (`metrics.py`), the drain
gate (`service/drain.py`), body limit and seq_id release (`api/guard.py`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from typing import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from twinkle_server import logs, metrics
from twinkle_server.api.console import router as console_router
from twinkle_server.api.drain_gate import DrainGate
from twinkle_server.api.guard import RequestGuard
from twinkle_server.api.native import datasets as native_datasets
from twinkle_server.api.native import routes as native
from twinkle_server.api.openai.errors import as_openai_error, unrouted
from twinkle_server.api.openai.rollouts import router as rollouts_router
from twinkle_server.api.openai.router import router as openai_router
from twinkle_server.api.tinker import (
    routes_checkpoints,
    routes_futures,
    routes_sampling,
    routes_service,
    routes_sessions_extra,
    routes_training,
)
from twinkle_server.config import ServerConfig
from twinkle_server.engine.deployment import build_model_hosts
from twinkle_server.engine.model_host import ModelHost
from twinkle_server.errors import ApiError, as_api_error, is_disk_full
from twinkle_server.service.core import Service
from twinkle_server.store import Store

logger = logging.getLogger(__name__)


def create_app(config: ServerConfig, hosts: dict[str, ModelHost] | None = None, device: str | None = None) -> FastAPI:
    """Build the app. Model hosts load at start-up (or pass ready `hosts`, e.g. to share one across tests)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # the metadata database first: an unreachable one fails the start before any model loads
        store = Store.open(
            config.database_url, config.data_dir, owner=f'{socket.gethostname()}:{config.port}', write_behind=True
        )
        try:
            loaded = hosts if hosts is not None else build_model_hosts(config, device)
            app.state.service = Service(config, loaded, asyncio.get_running_loop(), store=store)
            app.state.metrics = app.state.service.metrics  # `/metrics` and the HTTP counts need only this
        except BaseException:
            store.close()
            raise
        reaper = asyncio.create_task(_reap(app.state.service))
        logger.info('twinkle server ready: models %s, data in %s', sorted(loaded), config.data_dir)
        try:
            yield
        finally:
            reaper.cancel()
            app.state.service.close()

    app = FastAPI(title='twinkle server', lifespan=lifespan)
    _install_error_handlers(app)
    app.add_middleware(RequestGuard)  # each add_middleware wraps the ones before: the last added is outermost
    app.add_middleware(DrainGate)
    app.add_middleware(metrics.HttpMetricsMiddleware)
    app.add_middleware(logs.RequestIdMiddleware)
    app.include_router(metrics.router)
    for module in (
        routes_service,
        routes_sessions_extra,
        routes_training,
        routes_checkpoints,
        routes_sampling,
        routes_futures,
        native,
        native_datasets,
    ):
        app.include_router(module.router)
    app.include_router(openai_router)
    app.include_router(rollouts_router)
    app.include_router(console_router)
    return app


async def _reap(service: Service) -> None:
    while True:
        await asyncio.sleep(60)
        try:
            service.reap_sessions()
            service.rollouts.reap()
            service.store.prune_futures(older_than_s=24 * 3600)
        except Exception:  # noqa: BLE001
            logger.exception('session reaper failed')


def _install_error_handlers(app: FastAPI) -> None:
    """Every error, ours or the framework's (unknown route, wrong method), answers the same JSON shape."""

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        if request.url.path.startswith('/v1/'):  # under the OpenAI-compatible routes: OpenAI's error shape
            exc = as_openai_error(exc)
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers())

    @app.exception_handler(OSError)
    async def disk_full(request: Request, exc: OSError) -> JSONResponse:
        """A full disk is 507 (retryable), answered here so the keep-alive connection stays open (the catch-all
        below answers and then re-raises, which makes the server close it)."""
        if not is_disk_full(exc):
            raise exc
        err = as_api_error(exc)
        return JSONResponse(err.body(), status_code=err.status, headers=err.headers())

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:
            err = ApiError(
                404,
                f'no route {request.method} {request.url.path}; the Tinker API is under /api/v1, '
                f'the native API under /twinkle/v1',
            )
        elif exc.status_code == 405:
            err = ApiError(405, f'{request.method} is not allowed on {request.url.path}')
        else:
            err = ApiError(exc.status_code, str(exc.detail))
        if request.url.path.startswith('/v1/'):  # under the OpenAI-compatible routes: OpenAI's error shape
            err = unrouted(request.method, request.url.path, exc.status_code, str(exc.detail))
        return JSONResponse(err.body(), status_code=err.status, headers={**err.headers(), **(exc.headers or {})})

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        msg = '; '.join(f'{".".join(str(p) for p in e["loc"])}: {e["msg"]}' for e in exc.errors())
        err = ApiError(400, f'invalid request: {msg}')
        return JSONResponse(err.body(), status_code=400, headers=err.headers())

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        logger.exception('unhandled error on %s', request.url.path)
        ctx = logs.current()  # this handler runs outside the request-id middleware, which left its context set
        return JSONResponse(
            ApiError(500, f'internal error: {type(exc).__name__}: {exc}').body(),
            status_code=500,
            headers={'x-request-id': ctx.request_id} if ctx and ctx.request_id else None,
        )
