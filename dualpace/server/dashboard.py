"""``GET /dashboard``: one self-contained page (``dashboard.html``: plain JS on <canvas>, no
CDN, no build step) that polls ``/metrics`` and draws the two tiers at work — Figure 1's
tokens per engine and cumulative CPU-resident tokens, KV blocks per tier, requests per
engine, Dense Assist calls per route, migrations per kind, the recent CPU-tier stall p99.

The page is served with a Content-Security-Policy that admits exactly its own inline script
and style (by SHA-256) and connections to this origin only: nothing else can run in it.
"""

from __future__ import annotations

import base64
import hashlib
import re
from functools import cache
from importlib import resources

from aiohttp import web


def _sha256_sources(html: str, tag: str) -> str:
    bodies = re.findall(rf"<{tag}>(.*?)</{tag}>", html, flags=re.S)
    if not bodies:
        raise RuntimeError(f"dashboard.html has no <{tag}> element")
    return " ".join("'sha256-" + base64.b64encode(hashlib.sha256(b.encode()).digest()).decode()
                    + "'" for b in bodies)


@cache
def page() -> tuple[bytes, str]:
    """The page's bytes and its Content-Security-Policy."""
    html = resources.files("dualpace.server").joinpath("dashboard.html").read_text("utf-8")
    csp = ("default-src 'none'; "
           f"script-src {_sha256_sources(html, 'script')}; "
           f"style-src {_sha256_sources(html, 'style')}; "
           "connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; "
           "frame-ancestors 'none'")
    return html.encode(), csp


async def dashboard(request: web.Request) -> web.Response:
    body, csp = page()
    return web.Response(body=body, content_type="text/html", charset="utf-8", headers={
        "Content-Security-Policy": csp, "X-Content-Type-Options": "nosniff",
        "Cache-Control": "no-cache"})
