"""``GET /dashboard`` in a real browser (Debian's chromium driven by selenium), behind
``--api-key``, while traffic uses both tiers: the page's numbers equal ``/metrics``, its
CPU-tier series is non-zero, its stall p99 is Prometheus's histogram_quantile, and the key
never leaves the page's memory. Skips, saying why, where chromium cannot run."""

from __future__ import annotations

import itertools
import json
import re
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from dualpace.engine.metrics import histogram_quantile

from .conftest import ServerProcess

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from browser import BrowserUnavailable, enter_api_key, headless_chromium

KEY = "dash-key-123"


def _metrics_text(url: str, peek: bool) -> str:
    with urllib.request.urlopen(url + "/metrics" + ("?peek=1" if peek else ""), timeout=10) as r:
        return r.read().decode()


def _parse(text: str) -> dict[str, float]:
    return {k: float(v) for k, v in (line.rsplit(" ", 1) for line in text.splitlines()
                                     if line and not line.startswith("#"))}


@pytest.fixture(scope="module")
def dash_server(tiny_model):
    # 8 GPU blocks of 16 tokens: most of the 8 concurrent requests go to the host tier.
    s = ServerProcess(tiny_model, "--gpu-kv-blocks", "8", "--api-key", KEY)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def browser():
    try:
        driver = headless_chromium()
    except BrowserUnavailable as e:  # say why, never count it as a pass
        pytest.skip(str(e))
    yield driver
    driver.quit()


def _wait(pred, what: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _traffic(url: str, n: int = 8) -> list[dict]:
    outs: list[dict] = [{}] * n

    def one(i):
        body = json.dumps({"prompt": [7 + i] * 60, "max_tokens": 48, "ignore_eos": True,
                           "temperature": 0}).encode()
        req = urllib.request.Request(url + "/v1/completions", body, {
            "Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
        with urllib.request.urlopen(req, timeout=300) as r:
            outs[i] = json.loads(r.read())

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outs


def test_dashboard_page_is_self_contained(dash_server):
    with urllib.request.urlopen(dash_server.url + "/dashboard", timeout=10) as r:
        html = r.read().decode()
        csp = r.headers["Content-Security-Policy"]
        assert r.headers["Content-Type"].startswith("text/html")
    # No CDN, nothing fetched from elsewhere: the only URLs are this server's paths.
    assert not re.search(r"""(src|href)\s*=\s*["'](https?:)?//""", html)
    assert "fetch(" in html and "http://" not in html and "https://" not in html
    assert "default-src 'none'" in csp and "connect-src 'self'" in csp
    assert "'unsafe-inline'" not in csp and "sha256-" in csp


def test_dashboard_in_chromium_matches_metrics(dash_server, browser, tmp_path):
    url = dash_server.url
    browser.get(url + "/dashboard?interval=0.5&window=120")
    form = browser.find_element("id", "keyform")
    _wait(form.is_displayed, "the API-key form (the server answered 401)")
    enter_api_key(browser, KEY)
    _wait(lambda: "tiny" in browser.find_element("id", "model").text, "the model name")
    assert not form.is_displayed()
    assert KEY not in browser.current_url
    assert browser.execute_script(
        "return localStorage.length + sessionStorage.length + document.cookie.length") == 0

    outs = _traffic(url)
    assert all(o["choices"][0]["finish_reason"] == "length" for o in outs)
    m = _parse(_metrics_text(url, peek=True))
    cpu_tokens = m['dualpace:generation_tokens_total{engine="cpu"}']
    assert cpu_tokens > 0, "the traffic never reached the CPU tier"

    # Within one polling period of that scrape (the server is idle now), the page says the same.
    polls = int(browser.execute_script("return document.body.dataset.polls"))
    _wait(lambda: int(browser.execute_script("return document.body.dataset.polls")) > polls + 1,
          "two more polls")
    shown = {el.get_attribute("data-metric"): el.text
             for el in browser.find_elements("css selector", "[data-metric]")}
    assert len(shown) >= 15
    for k, text in shown.items():
        assert float(text) == m.get(k, 0.0), f"{k}: page {text}, /metrics {m.get(k, 0.0)}"

    # Figure 1's CPU panel: the CPU tokens/s series is non-zero and integrates to the count.
    charts = browser.execute_script("return window.dualpace.charts")
    rates = next(c for c in charts if c["title"] == "Tokens/s per engine")
    cpu = rates["points"][rates["names"].index("CPU")]
    assert max(v for _, v in cpu if v is not None) > 0
    integral = sum(v * (t - t0) for (t0, _), (t, v) in itertools.pairwise(cpu) if v is not None)
    assert integral == pytest.approx(cpu_tokens, rel=1e-6)

    # The recent stall p99 is histogram_quantile over the whole run (the page's first sample
    # predates the traffic); bench/common's is checked on hand-computed histograms.
    want = histogram_quantile(0.99, "dualpace:cpu_tier_stall_seconds", m)
    assert want is not None
    got = browser.find_element("id", "stallp99").text
    assert float(got.removesuffix(" s")) == pytest.approx(want, rel=2e-3, abs=1e-3)

    # The page's quantile on hand-computed histograms.
    def quantile(qv: float, buckets: str):
        return browser.execute_script(f"return window.dualpace.quantile({qv}, {buckets})")

    assert quantile(0.5, "[[1, 0], [2, 10], [Infinity, 10]]") == 1.5  # 1 + (5 - 0) / 10
    assert quantile(0.99, "[[0.01, 50], [0.1, 99], [1, 100]]") == pytest.approx(0.1)
    assert quantile(0.99, "[[0.5, 10], [Infinity, 20]]") == 0.5  # rank in +Inf
    assert quantile(0.99, "[[0.5, 0], [Infinity, 0]]") is None

    shot = tmp_path / "dashboard.png"
    browser.save_screenshot(str(shot))
    assert shot.stat().st_size > 10_000
    print(f"dashboard screenshot: {shot}")


def test_peek_keeps_the_stall_window_and_a_scrape_closes_it(dash_server):
    """After traffic on the CPU tier the window holds its stalls: peeks see the same value,
    a plain scrape reports it and starts a new window."""
    _traffic(dash_server.url, n=4)
    name = "dualpace:cpu_tier_longest_stall_seconds"
    first = _parse(_metrics_text(dash_server.url, peek=True))[name]
    assert first > 0
    assert _parse(_metrics_text(dash_server.url, peek=True))[name] == first
    assert _parse(_metrics_text(dash_server.url, peek=False))[name] >= first
    # The tier is idle now: the new window has no stall in it.
    assert _parse(_metrics_text(dash_server.url, peek=False))[name] == 0.0
