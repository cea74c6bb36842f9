"""A real ``dualpace serve`` process on a random port, on a small demo checkpoint."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import aiohttp
import pytest

from dualpace.demo_model import DemoSpec, make_demo_model

SMALL = DemoSpec(hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                 intermediate_size=256, max_position_embeddings=512)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(self, model: str, *flags: str, env: dict | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dualpace", "serve", "--model", model, "--port",
             str(self.port), "--gpu-device", "cpu", "--gpu-kv-blocks", "64",
             "--cpu-kv-gib", "0.05", "--served-model-name", "tiny",
             # outputs are compared token for token with fp32 transformers and across the
             # tiers: the CPU tier's default on an AMX host is bf16
             "--cpu-dtype", "float32", *flags],
            env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True)
        # Read the server's output all the time: an unread pipe fills (64 KiB) and then
        # blocks the server's event loop on its next log line.
        self.output: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._reader.join(timeout=5)
                raise RuntimeError(f"server exited: {''.join(self.output)}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("server did not become healthy")

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.output.append(line)

    def get_json(self, path: str):
        with urllib.request.urlopen(self.url + path, timeout=10) as r:
            return json.loads(r.read())

    def post_json(self, path: str, body) -> tuple[int, dict]:
        """(status, parsed body) of a JSON POST, error statuses included."""
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def drop_streams(self, body: dict, count: int) -> None:
        """``count`` concurrent streamed completions of ``body``, each hung up on at its
        first token (a client that goes away mid-stream)."""
        async def drop(session):
            async with session.post(self.url + "/v1/completions",
                                    json={**body, "stream": True}) as r:
                async for line in r.content:
                    if line.startswith(b"data: {"):
                        return

        async def main():
            async with aiohttp.ClientSession() as s:
                await asyncio.gather(*(drop(s) for _ in range(count)))

        asyncio.run(main())

    def wait_idle(self, timeout: float) -> tuple[float, dict[str, float]]:
        """Poll /metrics until no KV block is used and no request runs or waits; returns
        (what is still busy, the last metrics)."""
        keys = ('dualpace:kv_blocks_used{tier="gpu"}', 'dualpace:kv_blocks_used{tier="cpu"}',
                'dualpace:num_requests_running{engine="gpu"}',
                'dualpace:num_requests_running{engine="cpu"}', "dualpace:num_requests_waiting")
        deadline = time.monotonic() + timeout
        while True:
            m = self.metrics()
            busy = sum(m.get(k, 0.0) for k in keys)
            if busy == 0 or time.monotonic() > deadline:
                return busy, m
            time.sleep(0.1)

    def metrics(self) -> dict[str, float]:
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as r:
            text = r.read().decode()
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
        return out

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    return str(make_demo_model(tmp_path_factory.mktemp("tiny"), SMALL))


@pytest.fixture(scope="module")
def server(tiny_model):
    s = ServerProcess(tiny_model, "--max-num-seqs", "64")
    yield s
    s.stop()


@pytest.fixture(scope="module", params=["", "0,0"], ids=["full-cpu", "fused-assist"])
def tiers(request, tiny_model):
    """A GPU pool too small for the load (8 blocks, 2 rows, 48-token batches), so the CPU
    tier decodes and samples some requests: Full-CPU, or Fused-Assist (the GPU side of the
    Dense Assist samples the CPU tier's tokens)."""
    extra = ["--assist-thresholds", request.param] if request.param else []
    s = ServerProcess(tiny_model, "--gpu-kv-blocks", "8", "--max-num-seqs", "2",
                      "--max-num-batched-tokens", "48", *extra)
    s.route = "fused-assist" if request.param else "full-cpu"
    yield s
    s.stop()
