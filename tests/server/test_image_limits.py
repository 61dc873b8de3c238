"""Limits on the images sent to a vision-language model, through the unmodified tinker SDK and over raw HTTP.

Every property of an image that the server or the model's image processor cannot take (an aspect ratio over the
processor's limit, too many pixels, a decode larger than the request's or the server's budget) is a 4xx read from
the image header before any pixel is decoded: never a 5xx (the SDK would retry it for minutes, and the model's next
seq_id would wait for it). Decoding memory is bounded per image (`max_image_pixels`), per request
(`max_image_bytes_per_request`) and per server (`image_decode_budget_bytes`: images beyond it wait, then 429).
"""

from __future__ import annotations

import io
import threading
import time
from dataclasses import dataclass

import httpx
import psutil
import pytest
import tinker
from PIL import Image
from raw_http import PROTO, assert_refused, fwdbwd_body, new_model, result
from tinker import types
from vl_fixtures import VL, client, serve_vl, vl_server  # noqa: F401 (fixtures used by name)

SDK_TIMEOUT_S = 60  # a 5xx is retried by the SDK for minutes: a result not in time is the failure
VISION_START, VISION_END = 1185, 1186
TIGHT = 'tight'  # a tenant of the small-budget server with small image limits
BUDGET = 40 * 1024 * 1024  # image_decode_budget_bytes of the small-budget server: two 1000x1000 images, not three


def png(size: tuple[int, int], mode: str = 'RGB') -> bytes:
    """A blank `size` PNG (mode '1' keeps huge test images cheap to build; the server decodes them to RGB)."""
    buffer = io.BytesIO()
    Image.new(mode, size).save(buffer, format='PNG')
    return buffer.getvalue()


def image_datum(data: bytes, tokens: int) -> types.Datum:
    """The cookbook shape: text ending with <|vision_start|>, the image (`tokens` positions), text; trained on the
    last two positions only."""
    chunks = [
        types.EncodedTextChunk(tokens=[5, 6, VISION_START]),
        types.ImageChunk(data=data, format='png', expected_tokens=tokens),
        types.EncodedTextChunk(tokens=[VISION_END, 7, 8]),
    ]
    n = 3 + tokens + 3
    inputs = {'target_tokens': [0] * (n - 3) + [7, 8, 9], 'weights': [0.0] * (n - 2) + [1.0] * 2}
    return types.Datum(model_input=types.ModelInput(chunks=chunks), loss_fn_inputs=inputs)


@pytest.fixture(scope='module')
def tokens(tiny_vl_model_dir):
    """Image tokens of a (width, height) image, by the fixture's own image processor."""
    from twinkle_core.template.vision import VisionTemplate

    template = VisionTemplate(str(tiny_vl_model_dir))
    return lambda size: template.image_processor.get_number_of_image_patches(size[1], size[0], {}) // 4


def http_client(running, key: str) -> httpx.Client:
    return httpx.Client(base_url=running.base_url + '/api/v1', headers={'X-API-Key': key}, timeout=60.0)


@pytest.fixture(scope='module')
def http(vl_server):
    running, key = vl_server
    with http_client(running, key) as c:
        yield c


@dataclass
class Small:
    """The small-budget server: clients of tenant carol (default limits) and of tenant `TIGHT`."""

    running: object
    client: tinker.ServiceClient
    http: httpx.Client
    tight: httpx.Client

    @property
    def budget(self):
        return self.running.service.image_budget


@pytest.fixture(scope='module')
def small(tmp_path_factory, tiny_vl_model_dir):
    from twinkle_server import TenantLimits
    from twinkle_server.service.auth import create_api_key

    default = TenantLimits().merged({'max_adapters': 64})
    tight = default.merged({'max_image_pixels': 10_000, 'max_image_bytes_per_request': 240_000})
    running = serve_vl(
        tmp_path_factory.mktemp('vl-small'),
        tiny_vl_model_dir,
        default_limits=default,
        tenant_limits={TIGHT: tight},
        image_decode_budget_bytes=BUDGET,
    )
    store = running.service.store
    key = create_api_key(store, 'carol')
    with http_client(running, key) as c, http_client(running, create_api_key(store, TIGHT)) as t:
        yield Small(running, tinker.ServiceClient(base_url=running.base_url, api_key=key), c, t)
    running.stop()


@pytest.fixture
def decodes(monkeypatch):
    """Counts the images the server decodes (its decoder is patched where the server calls it: the server runs in
    this process)."""
    from twinkle_server.service import images as server_images

    calls = []
    original = server_images.decode_image_bytes

    def counting(data, **kwargs):
        calls.append(len(data))
        return original(data, **kwargs)

    monkeypatch.setattr(server_images, 'decode_image_bytes', counting)
    return calls


class PeakRss:
    """The largest growth of this process's resident memory while the block runs (sampled every 5 ms)."""

    def __enter__(self) -> PeakRss:
        self._process = psutil.Process()
        self.base = self.peak = self._process.memory_info().rss
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def _watch(self) -> None:
        while not self._done.wait(0.005):
            self.peak = max(self.peak, self._process.memory_info().rss)

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join()

    @property
    def growth_mb(self) -> float:
        return (self.peak - self.base) / 2**20


def forward_sample(http: httpx.Client, model_id: str, seq_id: int, datums: list[types.Datum]) -> httpx.Response:
    return http.post(
        '/forward_backward', content=fwdbwd_body(model_id, seq_id, datums, forward_only=True), headers=PROTO
    )


def asample(http: httpx.Client, datum: types.Datum) -> httpx.Response:
    return http.post(
        '/asample',
        json={
            'base_model': VL,
            'num_samples': 1,
            'sampling_params': {'max_tokens': 2},
            'prompt': datum.model_input.model_dump(mode='json'),
        },
    )


def finished(http: httpx.Client, response: httpx.Response, timeout_s: float = 30.0) -> bytes:
    """The protobuf result of an accepted forward(_backward); fails when it is refused, fails or is late."""
    assert response.status_code == 200, response.text
    out = result(http, response.json()['request_id'], timeout_s=timeout_s)
    assert isinstance(out, bytes), out
    return out


# ---- properties the image processor refuses (defect: a 1x40000 PNG was a 500) --------------------------------------
def test_a_tall_image_is_a_400_through_the_sdk_and_the_client_goes_on(client, tokens):
    tc = client.create_lora_training_client(base_model=VL, rank=2).result()
    tall = image_datum(png((1, 40000)), 4)
    with pytest.raises(tinker.BadRequestError, match='aspect ratio must be smaller than 200'):
        tc.forward_backward([tall], 'cross_entropy').result(timeout=SDK_TIMEOUT_S)
    normal = image_datum(png((112, 112)), tokens((112, 112)))
    assert tc.forward_backward([normal], 'cross_entropy').result(timeout=SDK_TIMEOUT_S).metrics['loss:sum'] > 0
    sampler = client.create_sampling_client(base_model=VL).result()
    with pytest.raises(tinker.BadRequestError, match='aspect ratio must be smaller than 200'):
        sampler.sample(tall.model_input, 1, types.SamplingParams(max_tokens=2)).result(timeout=SDK_TIMEOUT_S)


def test_a_tall_image_over_http_is_a_400_before_decoding_and_frees_its_seq_id(http, tokens, decodes):
    _, model = new_model(http, VL)
    tall = image_datum(png((1, 40000)), 4)
    r = http.post('/forward_backward', content=fwdbwd_body(model, 1, [tall]), headers=PROTO)
    assert_refused(r, 400, 'absolute aspect ratio must be smaller than 200, got 40000')
    assert_refused(asample(http, tall), 400, 'aspect ratio must be smaller than 200')
    assert decodes == []
    start = time.monotonic()  # the next seq_id runs at once (it waited seq_gap_timeout_s=120 s behind a 500)
    normal = image_datum(png((112, 112)), tokens((112, 112)))
    finished(http, http.post('/forward_backward', content=fwdbwd_body(model, 2, [normal]), headers=PROTO))
    assert time.monotonic() - start < 30


@pytest.mark.parametrize(
    'size,accepted',
    [
        ((1, 1), True),
        ((1, 200), True),
        ((200, 1), True),  # within the processor's bounds (it upsizes tiny images)
        ((1, 201), False),
        ((201, 1), False),
        ((3, 1000), False),
    ],
    ids=lambda v: 'x'.join(map(str, v)) if isinstance(v, tuple) else ('accepted' if v else 'refused'),
)
def test_every_image_shape_is_served_or_a_400_read_from_its_header(http, tokens, decodes, size, accepted):
    _, model = new_model(http, VL)
    datum = image_datum(png(size), tokens(size) if accepted else 4)
    r = forward_sample(http, model, 1, [datum])
    if accepted:
        finished(http, r)
        assert len(decodes) == 1
    else:
        assert_refused(r, 400, f'a {size[0]}x{size[1]} image')
        assert 'aspect ratio' in r.json()['error'] and decodes == []


# ---- decoding memory (defect: a 182 KB 7900x7900 PNG decoded to +830 MB, four at once to 3.6 GB) -------------------
def test_images_over_the_request_budget_are_a_413_before_decoding(client, http, tokens, decodes):
    size = (7900, 7900)
    big = image_datum(png(size, mode='1'), tokens(size))
    assert len(big.model_input.chunks[1].data) < 300_000
    tc = client.create_lora_training_client(base_model=VL, rank=2).result()
    _, model = new_model(http, VL)
    with PeakRss() as rss:
        start = time.monotonic()
        with pytest.raises(tinker.APIStatusError, match='max_image_bytes_per_request') as refused:
            tc.forward_backward([big], 'cross_entropy').result(timeout=SDK_TIMEOUT_S)
        assert refused.value.status_code == 413
        body = assert_refused(
            http.post('/forward_backward', content=fwdbwd_body(model, 1, [big]), headers=PROTO),
            413,
            'exceeds the server limit max_image_bytes_per_request=536870912',
        )
        assert '7900x7900' in body['error']
        assert_refused(asample(http, big), 413, 'max_image_bytes_per_request')
        elapsed = time.monotonic() - start
    assert decodes == [] and elapsed < 10 and rss.growth_mb < 100, (decodes, elapsed, rss.growth_mb)


def test_an_image_over_the_pixel_cap_is_a_413_from_its_header(client, http, tokens, decodes):
    size = (8193, 8193)  # one pixel row and column over the 8192 x 8192 decoder ceiling
    big = image_datum(png(size, mode='1'), tokens(size))
    tc = client.create_lora_training_client(base_model=VL, rank=2).result()
    with pytest.raises(tinker.APIStatusError, match='max_image_pixels=67108864') as refused:
        tc.forward([big], 'cross_entropy').result(timeout=SDK_TIMEOUT_S)
    assert refused.value.status_code == 413
    _, model = new_model(http, VL)
    assert_refused(forward_sample(http, model, 1, [big]), 413, '8193x8193 = 67125249 pixels')
    assert decodes == []


def test_tenant_image_limits_are_configurable(small, tokens):
    _, model = new_model(small.tight, VL)
    assert_refused(
        forward_sample(small.tight, model, 1, [image_datum(png((101, 100)), tokens((101, 100)))]),
        413,
        'exceeds the server limit max_image_pixels=10000',
    )
    one = image_datum(png((100, 100)), tokens((100, 100)))
    finished(small.tight, forward_sample(small.tight, model, 2, [one]))
    assert_refused(
        forward_sample(small.tight, model, 3, [one, one]),
        413,
        'decoding the images of this request (320000 bytes: 2 image(s), the largest 100x100, 16 bytes '
        'per pixel) exceeds the server limit max_image_bytes_per_request=240000',
    )


def test_an_image_over_the_whole_server_budget_is_a_413(small, tokens):
    size = (2000, 2000)  # 64 MB to decode, more than the server's 40 MiB
    big = image_datum(png(size), tokens(size))
    tc = small.client.create_lora_training_client(base_model=VL, rank=2).result()
    with pytest.raises(tinker.APIStatusError, match=f'image_decode_budget_bytes={BUDGET}') as refused:
        tc.forward([big], 'cross_entropy').result(timeout=SDK_TIMEOUT_S)
    assert refused.value.status_code == 413
    _, model = new_model(small.http, VL)
    assert_refused(forward_sample(small.http, model, 1, [big]), 413, f'image_decode_budget_bytes={BUDGET}')


def test_concurrent_images_stay_within_the_server_budget(small, tokens, monkeypatch):
    """Six requests with a 1000x1000 image each (16 MB to decode) at once: at most two decode together (40 MiB),
    the others wait their turn, and all of them train."""
    from twinkle_core.template.vision import VisionTemplate
    from twinkle_server.service import images as server_images

    lock, state = threading.Lock(), {'now': 0, 'most': 0}
    decode, process = server_images.decode_image_bytes, VisionTemplate.process_images

    def slow_decode(data, **kwargs):  # holds each decode long enough for the requests to overlap
        with lock:
            state['now'] += 1
            state['most'] = max(state['most'], state['now'])
        time.sleep(0.3)
        return decode(data, **kwargs)

    def processed(self, images):
        try:
            return process(self, images)
        finally:
            with lock:
                state['now'] -= 1

    monkeypatch.setattr(server_images, 'decode_image_bytes', slow_decode)
    monkeypatch.setattr(VisionTemplate, 'process_images', processed)
    size = (1000, 1000)
    datum = image_datum(png(size), tokens(size))
    models = [new_model(small.http, VL)[1] for _ in range(6)]
    responses: list[httpx.Response] = []
    with PeakRss() as rss:
        threads = [
            threading.Thread(target=lambda m=m: responses.append(forward_sample(small.http, m, 1, [datum])))
            for m in models
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        outputs = [finished(small.http, r) for r in responses]
    assert len(outputs) == 6 and state['most'] == 2, state
    assert small.budget.peak <= BUDGET and small.budget.in_use == 0, (small.budget.peak, small.budget.in_use)
    assert rss.growth_mb < 400, rss.growth_mb


def test_a_full_budget_answers_429_with_retry_after_and_the_sdk_gets_through(small, tokens, monkeypatch):
    monkeypatch.setattr(small.budget, 'wait_s', 0.3)
    size = (112, 112)
    datum = image_datum(png(size), tokens(size))
    _, model = new_model(small.http, VL)
    with small.budget.hold(BUDGET, 'a test'):
        r = forward_sample(small.http, model, 1, [datum])
    assert_refused(r, 429, f'image_decode_budget_bytes={BUDGET}')
    assert int(r.headers['retry-after']) >= 1
    finished(small.http, forward_sample(small.http, model, 1, [datum]))  # the same seq_id again: kept for the retry

    tc = small.client.create_lora_training_client(base_model=VL, rank=2).result()
    release = threading.Event()

    def occupy() -> None:
        with small.budget.hold(BUDGET, 'a test'):
            release.wait(1.5)

    holder = threading.Thread(target=occupy)
    holder.start()
    try:
        time.sleep(0.1)
        assert tc.forward([datum], 'cross_entropy').result(timeout=SDK_TIMEOUT_S).metrics['loss:sum'] > 0
    finally:
        release.set()
        holder.join()


def test_the_image_limits_come_from_the_config_file(tmp_path, tiny_model_dir):
    from twinkle_server.config import load_server_config

    path = tmp_path / 'server.yaml'
    path.write_text(f"""
server: {{image_decode_budget_mb: 256}}
storage: {{data_dir: {tmp_path / 'data'}}}
limits:
  default: {{max_image_pixels: 4000000, max_image_bytes_per_request: 100000000}}
  tenants: {{big: {{max_image_bytes_per_request: null}}}}
models: [{{name: tiny, path: {tiny_model_dir}}}]
""")
    config = load_server_config(path)
    assert config.image_decode_budget_bytes == 256 * 1024 * 1024
    assert (config.limits('x').max_image_pixels, config.limits('x').max_image_bytes_per_request) == (4000000, 100000000)
    assert config.limits('big').max_image_bytes_per_request is None
