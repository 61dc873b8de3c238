"""The console's HTML pages on the training service: sign-in and sign-out, the tenant's runs, one run, the
checkpoint playground, the operator view, and the vendored static assets. Pages are shells (`twinkle_core.console`)
the shared script fills from `routes_api`; every user-controlled string in them goes through `esc`."""

from __future__ import annotations

from urllib.parse import parse_qs, quote

from fastapi import APIRouter, Request, Response
from fastapi.responses import HTMLResponse, RedirectResponse

from twinkle_core.console.pages import SECURITY_HEADERS, curves_panel, esc, page, runs_table, static_file
from twinkle_server.api.console import session
from twinkle_server.api.console.session import BASE, CSRF_FIELD, ConsoleUser
from twinkle_server.api.console.views import owned_run
from twinkle_server.errors import ApiError, not_found

__all__ = ['router']

router = APIRouter(include_in_schema=False)
RUN_COLUMNS = (
    ('name', 'Run'),
    ('base_model', 'Base model'),
    ('lora_rank', 'LoRA rank'),
    ('created', 'Created'),
    ('last_step', 'Last step'),
    ('status', 'Status'),
)
CHECKPOINT_COLUMNS = (('name', 'Name'), ('kind', 'Kind'), ('step', 'Step'), ('size', 'Size'), ('created', 'Created'))


def _html(text: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(text, status_code=status, headers=dict(SECURITY_HEADERS))


def _nav(user: ConsoleUser) -> list[tuple[str, str]]:
    links = [(BASE, 'Runs'), (f'{BASE}/playground', 'Playground')]
    return links + ([(f'{BASE}/operator', 'Operator')] if user.admin else [])


def _page(user: ConsoleUser, title: str, body: str, kind: str, data: dict[str, str]) -> HTMLResponse:
    return _html(
        page(
            title,
            body,
            kind=kind,
            base=BASE,
            nav=_nav(user),
            data={'signin': BASE, **data},
            csrf=user.csrf,
            signed_in_as=user.tenant.name + (' (operator)' if user.admin else ''),
        )
    )


def _table(table_id: str, columns: tuple[tuple[str, str], ...], extra: str = '') -> str:
    heads = ''.join(f'<th data-key="{esc(k)}">{esc(h)}</th>' for k, h in columns)
    extra_head = f'<th>{esc(extra)}</th>' if extra else ''
    return f'<table id="{esc(table_id)}"><thead><tr>{heads}{extra_head}</tr></thead><tbody></tbody></table>'


def _signin(request: Request, error: str = '', status: int = 200) -> Response:
    token = session.new_login_token()
    body = (
        f'<form class="stacked" method="post" action="{BASE}/login">'
        '<label>API key <input type="password" name="api_key" id="api-key" autocomplete="off" required></label>'
        f'<input type="hidden" name="{CSRF_FIELD}" value="{esc(token)}">'
        '<button type="submit" id="signin">Sign in</button></form>'
        + (f'<p class="error" id="signin-error">{esc(error)}</p>' if error else '')
        + '<p class="muted">Use a key from <code>twinkle server keys create --tenant NAME</code>. It is kept in an '
        'HttpOnly cookie for this console only.</p>'
    )
    response = _html(page('Sign in', body, kind='signin', base=BASE), status)
    session.set_login_cookie(request, response, token)
    return response


async def _form(request: Request) -> dict[str, str]:
    raw = (await request.body()).decode('utf-8', 'replace')
    return {k: v[0] for k, v in parse_qs(raw, keep_blank_values=True).items()}


@router.get(BASE)
@router.get(f'{BASE}/')
async def home(request: Request) -> Response:
    user = session.signed_in(request)
    if user is None:
        return _signin(request)
    body = (
        '<p class="muted">Your training runs on this service, newest first; tick runs to overlay their curves.</p>'
        f'{runs_table(RUN_COLUMNS)}{curves_panel()}'
    )
    return _page(
        user,
        'Training runs',
        body,
        'runs',
        {'runs-url': f'{BASE}/api/runs', 'metrics-url': f'{BASE}/api/runs/{{run}}/metrics'},
    )


@router.post(f'{BASE}/login')
async def login(request: Request) -> Response:
    form = await _form(request)
    if not session.login_csrf_ok(request, form.get(CSRF_FIELD, '')):
        return _signin(request, 'The sign-in form expired; try again.', 403)
    svc = request.app.state.service
    address = request.client.host if request.client else 'unknown'
    key = form.get('api_key', '').strip()
    try:
        svc.logins.authenticate(svc.store, key, address)
    except ApiError as exc:
        message = 'Too many failed sign-ins; wait a minute.' if exc.status == 429 else 'That API key is not valid.'
        return _signin(request, message, exc.status)
    response = RedirectResponse(BASE, status_code=303, headers=dict(SECURITY_HEADERS))
    session.set_session(request, response, key)
    return response


@router.post(f'{BASE}/logout')
async def logout(request: Request) -> Response:
    user = session.signed_in(request)
    if user is not None:
        session.check_csrf(request, user, (await _form(request)).get(CSRF_FIELD, ''))
    response = RedirectResponse(BASE, status_code=303, headers=dict(SECURITY_HEADERS))
    session.clear_session(response)
    return response


@router.get(BASE + '/runs/{run_id}')
async def run_page(run_id: str, request: Request) -> Response:
    user = session.signed_in(request)
    if user is None:
        return RedirectResponse(BASE, status_code=303)
    owned_run(request.app.state.service, user.tenant.name, run_id)  # 404 for anyone else's
    quoted = f'{BASE}/api/runs/{quote(run_id, safe="")}'
    body = (
        '<dl id="run-facts"></dl>'
        f'{curves_panel()}'
        f'<section><h2>Checkpoints</h2>{_table("checkpoints", (*CHECKPOINT_COLUMNS, ("push", "Hub push")), "Actions")}'
        f'</section><section><h2>Sampler checkpoints</h2>{_table("samplers", CHECKPOINT_COLUMNS)}</section>'
        f'<section><h2>Pending requests</h2>'
        f'{_table("futures", (("request_id", "Request"), ("op", "Operation"), ("created", "Submitted")))}</section>'
        f'<p><a href="{BASE}/playground">Sample from a checkpoint in the playground</a></p>'
    )
    return _page(user, f'Run {run_id}', body, 'run', {'run-url': quoted, 'metrics-url': f'{quoted}/metrics'})


@router.get(f'{BASE}/playground')
async def playground(request: Request) -> Response:
    user = session.signed_in(request)
    if user is None:
        return RedirectResponse(BASE, status_code=303)
    body = (
        '<form id="playground" class="stacked">'
        '<label>Checkpoint <select name="checkpoint" id="checkpoint"></select></label>'
        '<label>Prompt <textarea name="prompt" id="prompt" rows="4" required></textarea></label>'
        '<label>Temperature <input type="number" name="temperature" min="0" max="2" step="0.1" value="0.7"></label>'
        '<label>Max tokens <input type="number" name="max_tokens" min="1" max="1024" value="32"></label>'
        '<button type="submit" id="sample">Sample</button></form>'
        '<h2>Completion</h2><pre id="completion"></pre><h2>Tokens</h2>'
        '<table id="tokens"><thead><tr><th>Token id</th><th>Text</th><th>Log-prob</th></tr></thead>'
        '<tbody></tbody></table>'
    )
    data = {'checkpoints-url': f'{BASE}/api/checkpoints', 'sample-url': f'{BASE}/api/sample'}
    return _page(user, 'Checkpoint playground', body, 'playground', data)


@router.get(f'{BASE}/operator')
async def operator(request: Request) -> Response:
    user = session.signed_in(request)
    if user is None:
        return RedirectResponse(BASE, status_code=303)
    if not user.admin:
        raise ApiError(403, 'the operator view needs an operator key: twinkle server keys create --admin')
    queue = tuple((f'queue_{k}', f'Queued {k}') for k in ('train', 'sample', 'call'))
    body = (
        '<p id="tokens-rate" class="muted"></p>'
        f'<section><h2>Base models</h2>'
        f'{_table("models", (("name", "Model"), *queue, ("running", "Running"), ("adapters", "Live adapters")))}'
        f'</section><section><h2>Live adapters per tenant</h2>'
        f'{_table("adapters", (("tenant", "Tenant"), ("model", "Base model"), ("adapters", "Adapters")))}</section>'
        '<section><h2>Recent errors</h2>'
        f'{_table("errors", (("request_id", "Request id"), ("tenant", "Tenant"), ("op", "Operation"), ("model", "Model"), ("finished", "When"), ("error", "Error")))}'  # noqa: E501
        f'</section><section><h2>Metrics</h2>'
        f'{_table("gauges", (("metric", "Metric"), ("labels", "Labels"), ("value", "Value")))}</section>'
    )
    return _page(user, 'Operator', body, 'operator', {'operator-url': f'{BASE}/api/operator'})


@router.get(BASE + '/static/{name}')
async def static(name: str) -> Response:
    found = static_file(name)
    if found is None:
        raise not_found('console asset', name)
    content, kind = found
    headers = {k: v for k, v in SECURITY_HEADERS.items() if k != 'Cache-Control'}
    return Response(content, media_type=kind, headers={**headers, 'Cache-Control': 'max-age=3600'})
