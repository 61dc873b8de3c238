"""Operations: Prometheus `/metrics` and request ids in structured logs (the drain: test_drain.py).

- `/metrics` parses as Prometheus text (a strict little parser here, and prometheus_client's where installed) and
  its counters move after real SDK training and sampling on the shared server.
- `X-Request-ID` round-trips, and the JSON log lines of both the HTTP handler and the engine worker carry it.
"""

from __future__ import annotations

import io
import json
import logging
import math
import re
import sys
import time

import httpx
import pytest
import raw_http
from server_names import MODEL
from tinker import types

from twinkle_server import logs
from twinkle_server.metrics import Family

# ---- a strict parser of the text exposition format 0.0.4 ------------------------------------------------------
_NAME = r'[a-zA-Z_:][a-zA-Z0-9_:]*'
_SAMPLE = re.compile(rf'^({_NAME})(?:\{{(.*)\}})? (\S+)$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"')
Samples = dict[tuple[str, frozenset], float]


def parse_exposition(text: str) -> tuple[Samples, dict[str, str]]:
    """(samples keyed by (name, labels), family types). Asserts every sample belongs to a family declared with
    HELP and TYPE before it, and every label set and value is well formed."""
    samples: Samples = {}
    types_: dict[str, str] = {}
    helped: set[str] = set()
    assert text.endswith('\n')
    for line in text.splitlines():
        if line.startswith('# HELP '):
            helped.add(line.split(' ', 3)[2])
            continue
        if line.startswith('# TYPE '):
            _, _, name, kind = line.split(' ')
            assert kind in ('counter', 'gauge', 'histogram', 'summary', 'untyped') and name in helped, line
            types_[name] = kind
            continue
        m = _SAMPLE.match(line)
        assert m, f'not a sample line: {line!r}'
        name, raw_labels, value = m.groups()
        family = re.sub(r'_(bucket|sum|count)$', '', name) if name not in types_ else name
        assert family in types_, f'{name} has no # TYPE'
        labels = {}
        if raw_labels:
            pos = 0
            for lm in _LABEL.finditer(raw_labels):
                assert lm.start() == pos, f'bad labels in {line!r}'
                labels[lm.group(1)] = lm.group(2).replace('\\n', '\n').replace('\\"', '"').replace('\\\\', '\\')
                pos = lm.end() + 1  # the comma
            assert pos == len(raw_labels) + 1, f'bad labels in {line!r}'
        samples[(name, frozenset(labels.items()))] = float(value.replace('+Inf', 'inf'))
    return samples, types_


def _get(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def _scrape(base_url: str) -> tuple[Samples, dict[str, str]]:
    r = httpx.get(f'{base_url}/metrics', timeout=30)  # no API key: /metrics is open (docs/server.md)
    assert r.status_code == 200 and r.headers['content-type'].startswith('text/plain; version=0.0.4'), r.text
    try:
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError:
        pass
    else:
        assert {f.name for f in text_string_to_metric_families(r.text)} >= {'twinkle_queue_depth', 'twinkle_tokens'}
    return parse_exposition(r.text)


def test_label_values_and_help_are_escaped():
    text = Family('x_total', 'counter', 'a \\ help\nline').add({'route': 'q"b\\c\nd'}, 2).text()
    assert text == ('# HELP x_total a \\\\ help\\nline\n# TYPE x_total counter\nx_total{route="q\\"b\\\\c\\nd"} 2\n')
    samples, _ = parse_exposition(text)
    assert _get(samples, 'x_total', route='q"b\\c\nd') == 2


def test_metrics_move_with_sdk_training_and_sampling(server, service_client, sft_data):
    before, kinds = _scrape(server.base_url)
    assert kinds['twinkle_queue_depth'] == 'gauge' and kinds['twinkle_http_requests_total'] == 'counter'
    assert {(k, v) for (n, labels) in before if n == 'twinkle_queue_depth' for k, v in labels if k == 'kind'} == {
        ('kind', 'train'),
        ('kind', 'sample'),
        ('kind', 'call'),
    }

    tc = service_client.create_lora_training_client(base_model=MODEL, rank=4, seed=21).result()
    for _ in range(2):
        tc.forward_backward(sft_data, 'cross_entropy').result()
        tc.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    sampler = tc.save_weights_and_get_sampling_client().result()
    sampler.sample(types.ModelInput.from_ints([1, 2, 3]), 2, types.SamplingParams(max_tokens=3, seed=1)).result()

    after, kinds = _scrape(server.base_url)
    assert kinds['twinkle_engine_call_seconds'] == 'histogram' and kinds['twinkle_tokens_total'] == 'counter'
    delta = lambda name, **labels: _get(after, name, **labels) - _get(before, name, **labels)  # noqa: E731
    assert delta('twinkle_engine_call_seconds_count', model=MODEL, op='forward_backward') >= 2
    assert delta('twinkle_engine_call_seconds_count', model=MODEL, op='optim_step') == 2
    assert delta('twinkle_engine_call_seconds_count', model=MODEL, op='save_state') >= 1
    assert delta('twinkle_engine_call_seconds_sum', model=MODEL, op='forward_backward') > 0
    assert delta('twinkle_work_items_total', model=MODEL, op='forward_backward', outcome='done') == 2
    train_tokens = sum(d.model_input.length for d in sft_data)
    assert delta('twinkle_tokens_total', model=MODEL, op='forward_backward') >= 2 * train_tokens
    assert delta('twinkle_tokens_total', model=MODEL, op='sample_prompt') == 3
    assert 1 <= delta('twinkle_tokens_total', model=MODEL, op='sample') <= 6
    assert delta('twinkle_live_adapters', model=MODEL) == 1
    assert delta('twinkle_http_requests_total', method='POST', route='/api/v1/forward_backward', status='200') >= 2
    assert delta('twinkle_http_requests_total', method='POST', route='/api/v1/asample', status='200') == 1
    assert _get(after, 'twinkle_queue_depth', model=MODEL, kind='train') == 0
    assert _get(after, 'twinkle_draining') == 0 and _get(after, 'process_resident_memory_bytes') > 1e6
    # a histogram is cumulative and its +Inf bucket is its count
    buckets = sorted(
        (float(dict(labels)['le']), v)
        for (n, labels), v in after.items()
        if n == 'twinkle_engine_call_seconds_bucket' and ('op', 'forward_backward') in labels
    )
    assert [v for _, v in buckets] == sorted(v for _, v in buckets) and buckets[-1][0] == math.inf
    assert buckets[-1][1] == _get(after, 'twinkle_engine_call_seconds_count', model=MODEL, op='forward_backward')
    # unknown paths share one label value, whatever clients send
    httpx.get(f'{server.base_url}/no/such/{time.time()}')
    after, _ = _scrape(server.base_url)
    assert _get(after, 'twinkle_http_requests_total', method='GET', route='unmatched', status='404') >= 1


@pytest.fixture
def json_log() -> io.StringIO:
    """Every log record at INFO and above, as the server's JSON lines."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(logs.ContextFilter())
    handler.setFormatter(logs.JsonFormatter())
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    yield stream
    root.removeHandler(handler)
    root.setLevel(level)


def test_request_id_round_trips_into_handler_and_worker_logs(server, alice, json_log):
    with httpx.Client(base_url=f'{server.base_url}/api/v1', headers={'X-API-Key': alice}, timeout=60) as http:
        sid = http.post('/create_session', json={'tags': [], 'user_metadata': None, 'sdk_version': 'raw'}).json()[
            'session_id'
        ]
        r = http.post(
            '/create_model',
            json={'session_id': sid, 'model_seq_id': 0, 'base_model': MODEL, 'lora_config': {'rank': 2, 'seed': 0}},
            headers={'X-Request-ID': 'ops-create-7'},
        )
        assert r.status_code == 200 and r.headers['x-request-id'] == 'ops-create-7', r.text
        raw_http.result(http, r.json()['request_id'])
        for bad in ('has space', 'x' * 65, '../etc'):  # not a sane token: a fresh id instead
            answer = http.get('/healthz', headers={'X-Request-ID': bad}).headers['x-request-id']
            assert re.fullmatch(r'[0-9a-f]{32}', answer), answer
        assert http.get('/healthz').headers['x-request-id'] != http.get('/healthz').headers['x-request-id']

    lines = [json.loads(line) for line in json_log.getvalue().splitlines()]
    assert all(set(line) >= {'ts', 'level', 'logger', 'msg', 'request_id', 'tenant', 'model'} for line in lines)
    mine = [line for line in lines if line['request_id'] == 'ops-create-7']
    access = [line for line in mine if line['logger'] == 'twinkle_server.access']
    assert access and access[0]['tenant'] == 'alice' and access[0]['model'] == MODEL, mine
    assert 'POST /api/v1/create_model 200' in access[0]['msg']
    worker = [line for line in mine if line['thread'].startswith('twinkle-worker')]
    assert worker and worker[0]['logger'] == 'twinkle_server.engine.scheduler' and worker[0]['tenant'] == 'alice', mine
    assert worker[0]['model'] == MODEL and 'engine create_model' in worker[0]['msg']


def test_json_and_text_formatters_carry_exceptions():
    try:
        raise ValueError('boom')
    except ValueError:
        record = logging.LogRecord('x', logging.ERROR, __file__, 1, 'failed %s', ('here',), sys.exc_info())
    with logs.bound(logs.RequestContext('rid-1', 'alice', 'm')):
        logs.ContextFilter().filter(record)
    line = json.loads(logs.JsonFormatter().format(record))
    assert line['msg'] == 'failed here' and line['request_id'] == 'rid-1' and 'ValueError: boom' in line['exc']
    text = logs.TextFormatter().format(record)
    assert text.splitlines()[0].endswith('failed here [request_id=rid-1 tenant=alice model=m]')
    assert 'ValueError: boom' in text
