"""The service's web console, end to end in headless Chromium: two tenants train a few steps with the official
tinker SDK on the shared real server; each signs in and sees exactly its runs, a curve with one point per step, its
checkpoints (downloadable), the playground's sampled text; the operator sees both; XSS run names stay text; another
tenant's URL is 404; a post without the CSRF token is refused; sign-out works. Screenshots go to
test-artifacts/console/."""

from __future__ import annotations

import io
import re
import tarfile

import pytest

MODEL = 'tiny-qwen3'
STEPS = 3
XSS = '<script>alert(1)</script>'
TENANTS = ('console-ann', 'console-ben')


@pytest.fixture(scope='module')
def trained(server, sft_data):
    """tenant -> (key, run id, sampler checkpoint path): each trained STEPS steps, with a state and a sampler
    checkpoint; console-ann's run is named with an XSS payload."""
    import tinker
    from tinker import types

    out = {}
    for tenant in TENANTS:
        key = server.key(tenant)
        sc = tinker.ServiceClient(base_url=server.base_url, api_key=key)
        name = XSS if tenant == 'console-ann' else 'ben run'
        tc = sc.create_lora_training_client(base_model=MODEL, rank=4, seed=0, user_metadata={'name': name}).result()
        for _ in range(STEPS):
            tc.forward_backward(sft_data, 'cross_entropy').result()
            tc.optim_step(types.AdamParams(learning_rate=1e-3)).result()
        tc.save_state('state-1').result()
        sampler = tc.save_weights_for_sampler('sampler-1').result().path
        out[tenant] = (key, tc.model_id, sampler)
    return out


@pytest.fixture(scope='module')
def admin_key(server):
    from twinkle_server.service.auth import create_api_key

    return create_api_key(server.service.store, 'console-ops', admin=True)


def _sign_in(browser, server, key):
    context = browser.new_context(viewport={'width': 1280, 'height': 900}, accept_downloads=True)
    page = context.new_page()
    page.errors = []  # type: ignore[attr-defined]
    page.on('pageerror', lambda exc: page.errors.append(str(exc)))  # type: ignore[attr-defined]
    page.goto(f'{server.base_url}/console')
    page.fill('#api-key', key)
    page.click('#signin')
    page.wait_for_selector('#signout')
    return context, page


def test_sign_in_refuses_a_bad_key_and_keeps_the_key_out_of_pages(browser, server, trained):
    page = browser.new_page()
    page.goto(f'{server.base_url}/console')
    page.fill('#api-key', 'tml-000000000000nope')
    page.click('#signin')
    assert page.text_content('#signin-error') == 'That API key is not valid.'
    page.close()
    server.service.logins.reset()  # the shared server's throttle tests count failed logins from this address
    key = trained['console-ann'][0]
    context, page = _sign_in(browser, server, key)
    cookie = next(c for c in context.cookies() if c['name'] == 'twinkle_console')
    assert cookie['httpOnly'] and cookie['sameSite'] == 'Strict'
    assert key not in page.content() and key not in page.url
    assert page.evaluate('document.cookie') == ''  # HttpOnly: not readable by scripts
    assert page.evaluate('Object.keys(localStorage).length') == 0
    context.close()


def test_tenant_sees_exactly_its_runs_and_curves(browser, server, trained, artifacts_dir):
    from playwright.sync_api import expect

    for tenant in TENANTS:
        key, run_id, _ = trained[tenant]
        other = trained[TENANTS[1 - TENANTS.index(tenant)]][1]
        context, page = _sign_in(browser, server, key)
        page.wait_for_selector(f'#runs tr[data-id="{run_id}"]')
        ids = page.eval_on_selector_all('#runs tbody tr', 'rows => rows.map(r => r.dataset.id)')
        assert ids == [run_id]  # exactly its own run
        assert other not in page.content()
        chart = page.locator('.chart[data-metric="loss:sum"]')
        expect(chart).to_have_attribute('data-points', str(STEPS))
        page.wait_for_selector('.chart[data-metric="loss:sum"] canvas')
        if tenant == 'console-ann':  # the XSS name renders as text (and no dialog opened: pageerror stays empty)
            assert page.locator('#runs').get_by_text(XSS, exact=True).count() == 1
            page.screenshot(path=str(artifacts_dir / 'runs.png'), full_page=True)
        assert page.errors == []  # type: ignore[attr-defined]
        context.close()


def test_run_page_checkpoints_download_and_delete(browser, server, trained, artifacts_dir):
    from playwright.sync_api import expect

    key, run_id, _ = trained['console-ben']
    context, page = _sign_in(browser, server, key)
    page.click(f'#runs tr[data-id="{run_id}"] a.run-link')
    page.wait_for_selector('#checkpoints tbody tr[data-id="weights/state-1"]')
    expect(page.locator('.fact-last_step')).to_have_text(str(STEPS))
    row = page.locator('#checkpoints tr[data-id="weights/state-1"]')
    expect(row.locator('.col-step')).to_have_text(str(STEPS))
    assert page.locator('#samplers tr[data-id="sampler_weights/sampler-1"]').count() == 1
    expect(page.locator('.chart[data-metric="loss:sum"]')).to_have_attribute('data-points', str(STEPS))
    page.screenshot(path=str(artifacts_dir / 'run.png'), full_page=True)
    with page.expect_download() as info:
        row.locator('a.download').click()
    data = open(info.value.path(), 'rb').read()
    with tarfile.open(fileobj=io.BytesIO(data), mode='r:gz') as tar:
        assert any(n.endswith('.safetensors') for n in tar.getnames())
    # delete: refused without the CSRF token, done with it after the confirmation
    refused = page.request.post(f'{server.base_url}/console/api/runs/{run_id}/checkpoints/weights/state-1/delete')
    assert refused.status == 403
    page.once('dialog', lambda d: d.accept())
    row.locator('button.delete').click()
    expect(page.locator('#checkpoints tr[data-id="weights/state-1"]')).to_have_count(0)
    context.close()


def test_cross_tenant_urls_are_404(browser, server, trained):
    key = trained['console-ann'][0]
    _, ben_run, _ = trained['console-ben']
    context, page = _sign_in(browser, server, key)
    for url in (
        f'/console/runs/{ben_run}',
        f'/console/api/runs/{ben_run}',
        f'/console/api/runs/{ben_run}/metrics',
        f'/console/runs/{ben_run}/checkpoints/sampler_weights/sampler-1/download',
    ):
        assert page.request.get(f'{server.base_url}{url}').status == 404, url
    assert page.request.get(f'{server.base_url}/console/operator').status == 403  # not an operator
    context.close()


def test_playground_samples_from_a_checkpoint(browser, server, trained, artifacts_dir):
    key, _, sampler = trained['console-ann']
    context, page = _sign_in(browser, server, key)
    page.goto(f'{server.base_url}/console/playground')
    page.wait_for_selector(f'#checkpoint option[value="{sampler}"]', state='attached')
    page.select_option('#checkpoint', sampler)
    page.fill('#prompt', 'User: Who are you?\nAssistant:')
    page.fill('input[name="max_tokens"]', '8')
    page.click('#sample')
    page.wait_for_selector('#tokens tbody tr:not(.empty)')
    assert page.locator('#tokens tbody tr').count() >= 1
    assert re.match(r'^Sampled \d+ tokens', page.text_content('#status'))
    assert page.text_content('#completion') is not None
    page.screenshot(path=str(artifacts_dir / 'playground.png'), full_page=True)
    assert page.errors == []  # type: ignore[attr-defined]
    context.close()


def test_operator_sees_every_tenant(browser, server, trained, admin_key, artifacts_dir):
    context, page = _sign_in(browser, server, admin_key)
    page.click('header nav a:text("Operator")')
    page.wait_for_selector('#models tbody tr[data-id="tiny-qwen3"]')
    for tenant in TENANTS:
        page.wait_for_selector(f'#adapters tbody tr[data-id="{tenant} {MODEL}"]')
    assert page.locator('#gauges tbody tr').count() > 3
    page.screenshot(path=str(artifacts_dir / 'operator.png'), full_page=True)
    context.close()


def test_sign_out_and_csrf_on_forms(browser, server, trained):
    key = trained['console-ben'][0]
    context, page = _sign_in(browser, server, key)
    # the sign-out form without its token is refused and leaves the session signed in
    answer = page.request.post(f'{server.base_url}/console/logout', form={'csrf_token': 'forged'})
    assert answer.status == 403
    page.goto(f'{server.base_url}/console')
    page.wait_for_selector('#signout')
    page.click('#signout')
    page.wait_for_selector('#signin')
    assert not [c for c in context.cookies() if c['name'] == 'twinkle_console']
    assert page.request.get(f'{server.base_url}/console/api/runs').status == 401
    context.close()


def test_pages_send_a_strict_csp(server):
    import httpx

    r = httpx.get(f'{server.base_url}/console')
    csp = r.headers['content-security-policy']
    assert "script-src 'self'" in csp and 'unsafe-inline' not in csp and "frame-ancestors 'none'" in csp
    assert '<script>' not in r.text.replace('<script defer src=', '')  # no inline script
