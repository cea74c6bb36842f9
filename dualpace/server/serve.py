"""``dualpace serve``: the engine, its workers and the HTTP front end in one process.

SIGTERM/SIGINT only set a flag. Draining then stops accepting (new requests get 503), lets
in-flight requests finish up to --drain-timeout, stops the workers, releases all shared
memory and exits 0. systemd: READY=1 once the model is loaded, WATCHDOG=1 at half of
WATCHDOG_USEC from a task that skips the ping when the engine loops are stuck, STOPPING=1 on
drain. If the workers fail past the restart bound, the server exits non-zero so systemd
restarts the service.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time

from aiohttp import web

from dualpace.config import EngineConfig
from dualpace.engine.serving import ServingEngine
from dualpace.server.app import Server
from dualpace.server.systemd import Notifier

log = logging.getLogger("dualpace.server")


async def _engine_alive(serving: ServingEngine, timeout: float = 5.0) -> bool:
    """The engine loops answer: a control round trip to a worker through the same loop."""
    if serving.engine is None or serving.engine.dead:
        return False
    if not serving.runtime.available.is_set():
        return True  # restarting: alive, just busy
    try:
        await asyncio.wait_for(serving.runtime.ping("gpu", 0), timeout)
    except (TimeoutError, asyncio.TimeoutError, KeyError):
        return False
    return True


async def _watchdog(notifier: Notifier, serving: ServingEngine) -> None:
    """WATCHDOG=1 every half period while the engine answers. An answer counts while
    systemd's period since the last ping has not run out (a loaded machine answers late; a
    stuck engine not at all), and the change to and from "not responding" is logged once,
    not every period (a stuck engine must not flood the journal)."""
    loop = asyncio.get_running_loop()
    half = notifier.watchdog_interval
    last, responding = loop.time(), True
    while True:
        await asyncio.sleep(max(0.0, last + half - loop.time()))
        budget = max(last + 2 * half - loop.time(), half)
        if await _engine_alive(serving, timeout=budget):
            notifier.watchdog()
            last = loop.time()
            if not responding:
                log.warning("engine responding again: watchdog pings resumed")
                responding = True
        else:
            if responding:
                log.error("engine not responding within the watchdog period (%.1f s): "
                          "withholding the watchdog ping", 2 * half)
                responding = False
            last = loop.time() - half  # retry after half a period


async def serve(config: EngineConfig, host: str, port: int, model_name: str,
                api_key: str | None, max_queued_requests: int, drain_timeout: float,
                step_log: str | None = None) -> int:
    notifier = Notifier()
    notifier.status("loading model")
    serving = ServingEngine(config, step_log)
    try:
        await serving.start()
    except BaseException:
        await serving.runtime.stop()
        raise
    server = Server(serving, model_name, api_key, max_queued_requests)
    runner = web.AppRunner(server.app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    rc = serving.config
    log.warning("GPU worker on %s (%s, %d KV blocks of %d tokens, %s attention); CPU tier "
                "%s, %d host KV blocks, kernels %s", rc.gpu_device, rc.gpu_dtype,
                rc.gpu_kv_blocks, rc.block_size, rc.attention_backend, rc.cpu_dtype,
                rc.host_kv_blocks, rc.cpu_isa or "torch")
    log.info("serving %s on http://%s:%d (policy %s)", model_name, host, port, config.policy)
    notifier.ready(f"serving {model_name} on {host}:{port}")
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    tasks = []
    if notifier.watchdog_interval:
        tasks.append(asyncio.create_task(_watchdog(notifier, serving)))
    dead = asyncio.create_task(serving.runtime.dead.wait())
    stopped = asyncio.create_task(stop.wait())
    await asyncio.wait([dead, stopped], return_when=asyncio.FIRST_COMPLETED)
    code = 0
    if dead.done():
        log.error("workers failed past the restart bound: %s", serving.runtime.failure)
        code = 1
    else:
        server.draining = True
        notifier.stopping(f"draining {server.in_flight} request(s)")
        deadline = time.monotonic() + drain_timeout
        while server.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if server.in_flight:
            # Abort them in the engine: their handlers then finish (a final "abort" chunk
            # for streams); the runner's cleanup would otherwise wait for them to complete.
            log.warning("drain timeout: aborting %d request(s)", server.in_flight)
            serving.abort_all()
            deadline = time.monotonic() + 5
            while server.in_flight and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
    for t in [*tasks, dead, stopped]:
        t.cancel()
    await runner.cleanup()
    await serving.stop()
    return code
