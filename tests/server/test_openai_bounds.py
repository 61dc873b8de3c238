"""Bounds of the `/v1` routes (issue 46, defects 8 and 10), through the official `openai` client against the
session's real server (uvicorn on 127.0.0.1, tiny Qwen3 fixture: context 2048 tokens, `max_body_bytes` 2 MiB).

- A request that cannot fit the context is refused before any rendering or tokenisation: a body over the `/v1` cap
  (2048 x 256 B + 256 KiB = 768 KiB here) is never parsed; too many messages, tools or characters are a 400 naming
  the count and the cap — each in well under a second and without the server's memory growing.
- A request whose client has gone is cancelled: queued, it is dropped before it runs (its tokens are never
  sampled), so another tenant's short chat is not held behind it; running, its rows stop at the sampler's next
  decode step (so the batch, and whoever waits for it, is not held by them) and its result is discarded.
"""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest
from server_names import MODEL, openai_client

from twinkle_server.api.openai.bounds import BODY_BASE_BYTES, BODY_BYTES_PER_CONTEXT_TOKEN

HELLO = [{'role': 'user', 'content': 'Say hello.'}]
CONTEXT = 2048  # the tiny fixture's max_position_embeddings
BODY_CAP = CONTEXT * BODY_BYTES_PER_CONTEXT_TOKEN + BODY_BASE_BYTES


def _peak_rss_growth_mib(fn) -> tuple[object, float]:
    """`fn()`'s result and how far this process's peak RSS rose during it (the server runs in this process).
    Writing 5 to clear_refs resets the peak (VmHWM) to the current RSS."""
    Path('/proc/self/clear_refs').write_text('5')
    before = _status_kib('VmHWM')
    try:
        out = fn()
    except Exception as exc:  # noqa: BLE001 - the caller checks the error
        out = exc
    return out, (_status_kib('VmHWM') - before) / 1024


def _status_kib(field: str) -> int:
    text = Path('/proc/self/status').read_text()
    return int(re.search(rf'^{field}:\s+(\d+) kB', text, re.M).group(1))


# ---- defect 8: bounded inputs -----------------------------------------------------------------------------------
def test_a_body_over_the_v1_cap_is_refused_unparsed_in_milliseconds(client):
    """45,000 user messages of 8 characters (1.7 MiB, under the server's 2 MiB body limit): the old server parsed,
    rendered and tokenized them (seconds, hundreds of MiB) before its 400; now the body is refused unread.
    The messages go in `extra_body`, as a client that builds its own JSON sends them: the client's typed
    `messages` transform alone takes ~15 s for 45,000 messages here, whatever the server does."""
    messages = [{'role': 'user', 'content': 'abcdefgh'} for _ in range(45_000)]
    err, grown = _peak_rss_growth_mib(
        lambda: client.chat.completions.create(model=MODEL, messages=[], extra_body={'messages': messages})
    )
    assert isinstance(err, openai.BadRequestError), err
    assert err.code == 'request_too_large'
    assert f'at most {BODY_CAP} bytes' in err.message
    assert err.response.elapsed.total_seconds() < 1.0  # sending the body included
    assert grown < 64, f'peak RSS grew {grown:.0f} MiB'


def test_a_chunked_body_over_the_cap_is_refused_as_it_streams(server, alice):
    """No Content-Length: the body is counted as it arrives, read to its end and discarded."""
    chunk = b' ' * 65536

    def body():
        yield b'{"model": "' + MODEL.encode() + b'", "messages": [{"role": "user", "content": "hi"}]'
        for _ in range(BODY_CAP // len(chunk) + 1):
            yield chunk
        yield b'}'

    r = httpx.post(
        f'{server.base_url}/v1/chat/completions',
        content=body(),
        headers={'Authorization': f'Bearer {alice}', 'Content-Type': 'application/json'},
        timeout=30,
    )
    assert r.status_code == 400 and r.json()['error']['code'] == 'request_too_large', r.text


def test_more_messages_than_the_context_are_refused_before_rendering(client):
    messages = [{'role': 'user', 'content': 'x'} for _ in range(CONTEXT + 1)]
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1)
    assert info.value.code == 'context_length_exceeded' and info.value.param == 'messages'
    assert f'messages has {CONTEXT + 1} entries' in info.value.message
    assert f'at most {CONTEXT} messages' in info.value.message
    # at the cap the count passes, and the rendered prompt is what does not fit
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=messages[:CONTEXT], max_tokens=1)
    assert 'the prompt has' in info.value.message


def test_text_past_the_character_cap_is_refused_before_tokenizing(client, tokenizer):
    """The cap: the context x the longest vocabulary entry (14 characters for the tiny fixture's tokenizer)."""
    per_token = max(len(t) for t in tokenizer.get_vocab())
    cap = CONTEXT * per_token
    long = [{'role': 'user', 'content': 'a' * (cap + 1)}]
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=long, max_tokens=1)
    assert info.value.code == 'context_length_exceeded'
    assert f'more than {cap} characters' in info.value.message
    # content parts and tool schemas count too
    parts = [
        {'role': 'user', 'content': [{'type': 'text', 'text': 'a' * (cap // 2)}] * 2 + [{'type': 'text', 'text': 'b'}]}
    ]
    with pytest.raises(openai.BadRequestError, match=f'more than {cap} characters'):
        client.chat.completions.create(model=MODEL, messages=parts, max_tokens=1)
    tool = {'type': 'function', 'function': {'name': 'f', 'description': 'd' * cap, 'parameters': {'type': 'object'}}}
    with pytest.raises(openai.BadRequestError, match=f'more than {cap} characters'):
        client.chat.completions.create(model=MODEL, messages=HELLO, tools=[tool], max_tokens=1)
    # the legacy route: a text prompt, and token ids that fill the context
    with pytest.raises(openai.BadRequestError, match=f'at most {cap} can fit'):
        client.completions.create(model=MODEL, prompt='a' * (cap + 1), max_tokens=1)
    with pytest.raises(openai.BadRequestError, match=f'the prompt has {CONTEXT} tokens'):
        client.completions.create(model=MODEL, prompt=[5] * CONTEXT, max_tokens=1)


def test_more_than_128_tools_are_refused(client):
    tools = [{'type': 'function', 'function': {'name': f'f{i}', 'parameters': {'type': 'object'}}} for i in range(129)]
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=HELLO, tools=tools, max_tokens=1)
    assert info.value.param == 'tools' and 'tools has 129 entries; at most 128' in info.value.message


def test_a_prompt_count_over_max_num_samples_is_refused_before_tokenizing(client):
    with pytest.raises(openai.BadRequestError, match='exceed the server limit max_num_samples=64'):
        client.completions.create(model=MODEL, prompt=['a' * 1000] * 65, max_tokens=1)


# ---- defect 10: a departed client's request is cancelled -----------------------------------------------------
def _sampled_tokens(server) -> int:
    text = httpx.get(f'{server.base_url}/metrics', timeout=10).text
    found = re.search(rf'^twinkle_tokens_total\{{model="{MODEL}",op="sample"\}} (\d+)', text, re.M)
    return int(found.group(1)) if found else 0


def _chat(c: openai.OpenAI, **kw):
    return c.chat.completions.create(model=MODEL, messages=HELLO, temperature=1.0, seed=7, **kw)


def test_queued_requests_of_departed_clients_are_dropped(server, alice, bob_client):
    """The model's worker is busy (another tenant's work, held by a gate); two of alice's big chats (n=8,
    max_tokens=120) queue behind it and their clients give up after 0.5 s. They are dropped before they run: none of
    their tokens is sampled, and bob's short chat, queued behind them, finishes within 5x its solo time (+0.5 s) of
    the worker becoming free. The old server sampled both (16 rows x 120 tokens) first."""
    worker = server.service.workers[MODEL]
    _wait_for(worker.idle, 60.0)
    _chat(bob_client, max_tokens=4)  # warm
    solo = min(_timed(lambda: _chat(bob_client, max_tokens=4)) for _ in range(2))
    stats = {k: _stat(worker, k) for k in ('cancelled_queued_samples', 'cancelled_running_samples')}
    sampled = _sampled_tokens(server)
    gate = _hold(worker)
    outcomes: list[BaseException | None] = []
    leavers = [threading.Thread(target=_depart, args=(server, alice, 0.5, 120, outcomes)) for _ in range(2)]
    for t in leavers:
        t.start()
    for t in leavers:
        t.join()
    assert all(isinstance(e, openai.APITimeoutError) for e in outcomes), outcomes
    answers: list = []
    short = threading.Thread(target=lambda: answers.append(_chat(bob_client, max_tokens=4)))
    try:  # each departure is noticed while its request waits in the queue (the old server never noticed)
        dropped = _settle(lambda: _stat(worker, 'cancelled_queued_samples') - stats['cancelled_queued_samples'] == 2)
        short.start()
        _wait_for(lambda: worker.queue_depths()['sample'] == (1 if dropped else 3))  # bob's chat (+ the departed)
    finally:
        released = time.perf_counter()
        gate.set()
    short.join()
    waited = time.perf_counter() - released
    assert answers and answers[0].choices[0].finish_reason == 'length'
    assert _sampled_tokens(server) - sampled <= 4, 'the departed requests were sampled'
    assert waited < 5 * solo + 0.5, (waited, solo)
    assert dropped and _stat(worker, 'cancelled_running_samples') == stats['cancelled_running_samples']


def test_a_running_request_of_a_departed_client_is_cancelled(server, alice, monkeypatch):
    """A request in the host call when its client leaves (the call held by a gate before it samples): its future
    is answered at once and the result discarded; counted as a running cancellation."""
    worker = server.service.workers[MODEL]
    _wait_for(worker.idle, 60.0)
    before = _stat(worker, 'cancelled_running_samples')
    gate, real = threading.Event(), worker.host.sample

    def held(jobs, **kw):
        gate.wait(30)
        return real(jobs, **kw)

    monkeypatch.setattr(worker.host, 'sample', held)
    outcomes: list[BaseException | None] = []
    leaver = threading.Thread(target=_depart, args=(server, alice, 0.5, 4, outcomes))
    leaver.start()
    try:
        _wait_for(lambda: worker.running() == 1)
        leaver.join()
        _wait_for(lambda: _stat(worker, 'cancelled_running_samples') == before + 1)
    finally:
        gate.set()
    assert isinstance(outcomes[0], openai.APITimeoutError), outcomes
    _wait_for(worker.idle, 60.0)  # leave the worker idle for the next test


LONG = 2000  # max_tokens of the departing chat: its 8 rows could decode 16,000 tokens (the prompt + this fit 2048)


def test_a_running_request_of_a_departed_client_stops_decoding(server, alice, bob_client):
    """alice's chat (n=8, max_tokens=2000) is being decoded when her client gives up after 0.5 s: the server
    notices, and the sampler stops its rows at its next decode step. Fewer than a quarter of its 16,000 tokens are
    sampled (measured: 450-700 with one CPU thread, 8 on a loaded machine), and bob's short chat, sent once she has
    left, finishes within 5x its solo time (+1 s). The old server decoded her rows to their end (EOS or max_tokens:
    9,406 tokens) while bob's chat waited (13.4 s against 0.02 s solo, one CPU thread)."""
    worker = server.service.workers[MODEL]
    _wait_for(worker.idle, 60.0)
    _chat(bob_client, max_tokens=4)  # warm
    solo = min(_timed(lambda: _chat(bob_client, max_tokens=4)) for _ in range(2))
    before = _stat(worker, 'cancelled_running_samples')
    sampled = _sampled_tokens(server)
    outcomes: list[BaseException | None] = []
    leaver = threading.Thread(target=_depart, args=(server, alice, 0.5, LONG, outcomes))
    leaver.start()
    _wait_for(lambda: worker.running() == 1)  # in the sampler's batch
    leaver.join()
    assert isinstance(outcomes[0], openai.APITimeoutError), outcomes
    _wait_for(lambda: _stat(worker, 'cancelled_running_samples') == before + 1)  # noticed while it ran
    waited = _timed(lambda: _chat(bob_client, max_tokens=4))
    _wait_for(worker.idle, 15.0)
    departed = _sampled_tokens(server) - sampled - 4  # bob's chat sampled (at most) 4 of them
    assert departed < 8 * LONG / 4, f'{departed} tokens of a departed request were sampled'
    assert waited < 5 * solo + 1.0, (waited, solo)


def _hold(worker) -> threading.Event:
    """Occupy `worker` with another tenant's work until the returned gate is set (the test's stand-in for a long
    training step or sampling batch)."""
    from twinkle_server.engine.scheduler import Work

    gate = threading.Event()
    worker.submit(Work('carol', on_done=lambda _: None, on_error=lambda _: None, call=lambda _: gate.wait(30)))
    _wait_for(lambda: worker.running() == 1)
    return gate


def _depart(server, key: str, timeout_s: float, max_tokens: int, outcomes: list) -> None:
    """A chat (n=8) whose client gives up after `timeout_s`; its outcome (None or the error) goes to `outcomes`."""
    with openai_client(server, key, timeout=timeout_s) as c:
        try:
            _chat(c, n=8, max_tokens=max_tokens)
            outcomes.append(None)
        except Exception as exc:  # noqa: BLE001 - the caller checks it
            outcomes.append(exc)


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _stat(worker, name: str) -> int:
    return worker.stats.get(name, 0)


def _settle(condition, timeout_s: float = 5.0) -> bool:
    """Whether `condition()` holds within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _wait_for(condition, timeout_s: float = 5.0) -> None:
    assert _settle(condition, timeout_s), 'timed out waiting'
