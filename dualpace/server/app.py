"""The OpenAI-compatible HTTP front end (aiohttp), with SSE streaming as vLLM serves it.

Routes: POST /v1/completions, POST /v1/chat/completions, GET /v1/models, /health, /metrics,
/version, /dashboard (a live page over /metrics). Every error is OpenAI-shaped; a client
that goes away aborts its requests at once (handler cancellation, or a failed write while
streaming) so their KV is freed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time

import msgspec
from aiohttp import web

from dualpace import __version__
from dualpace.engine.llm_engine import EngineDead
from dualpace.engine.serving import EngineUnavailable, ServingEngine
from dualpace.server.choices import ChatChoices, CompletionChoices, Piece
from dualpace.server.dashboard import dashboard
from dualpace.server.errors import APIError, bad_request
from dualpace.server.logprobs_format import TokenText
from dualpace.server.requests import (
    chat_prompt,
    check_model,
    completion_prompts,
    flag,
    sampling_params,
    stream_flags,
)
from dualpace.server.tokenize import detokenize, tokenize
from dualpace.server.unsupported import reject_unsupported

log = logging.getLogger("dualpace.server")
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
               "Connection": "keep-alive"}


def _sse(obj) -> bytes:
    return b"data: " + msgspec.json.encode(obj) + b"\n\n"


class Server:
    def __init__(self, serving: ServingEngine, model_name: str, api_key: str | None = None,
                 max_queued_requests: int = 0, max_body_bytes: int = 4 << 20):
        self.serving = serving
        self.model_name = model_name
        self.api_key = api_key or None
        self.max_queued = max_queued_requests
        self.in_flight = 0
        self.draining = False
        self.created = int(time.time())
        self.max_body = max_body_bytes
        self.vocab_size = serving.model_config.vocab_size
        self.app = web.Application(middlewares=[self._errors, self._auth],
                                   client_max_size=max_body_bytes)
        self.app.router.add_post("/v1/completions", self.completions)
        self.app.router.add_post("/v1/chat/completions", self.chat)
        self.app.router.add_post("/tokenize", self.tokenize)
        self.app.router.add_post("/detokenize", self.detokenize)
        self.app.router.add_get("/v1/models", self.models)
        self.app.router.add_get("/health", self.health)
        self.app.router.add_get("/metrics", self.metrics)
        self.app.router.add_get("/version", self.version)
        self.app.router.add_get("/dashboard", dashboard)

    # --- middlewares -------------------------------------------------------------------------
    @web.middleware
    async def _errors(self, request: web.Request, handler):
        try:
            return await handler(request)
        except APIError as e:
            return e.response()
        except web.HTTPRequestEntityTooLarge:
            return APIError(413, f"request body too large (limit {self.max_body} bytes)"
                            ).response()
        except web.HTTPMethodNotAllowed as e:
            return APIError(405, f"method {request.method} not allowed for {request.path}",
                            headers={"Allow": ",".join(sorted(e.allowed_methods))}).response()
        except web.HTTPNotFound:
            return APIError(404, f"no route {request.path}").response()
        except web.HTTPException as e:
            return APIError(e.status, e.reason or "error").response()
        except (asyncio.CancelledError, ConnectionResetError):
            raise
        except Exception:  # a bug: still an OpenAI-shaped answer, and logged
            log.exception("unhandled error for %s %s", request.method, request.path)
            return APIError(500, "internal error").response()

    @web.middleware
    async def _auth(self, request: web.Request, handler):
        if self.api_key and request.path.startswith("/v1/"):
            got = request.headers.get("Authorization", "")
            if not secrets.compare_digest(got, f"Bearer {self.api_key}"):
                raise APIError(401, "invalid or missing API key")
        return await handler(request)

    # --- helpers -------------------------------------------------------------------------------
    async def _body(self, request: web.Request) -> dict:
        raw = await request.read()
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise bad_request("request body is not valid JSON") from None
        if not isinstance(body, dict):
            raise bad_request("request body must be a JSON object")
        return body

    def _admit(self, n: int) -> None:
        retry = {"Retry-After": "1"}
        if self.draining:
            raise APIError(503, "server is shutting down", headers=retry)
        if self.serving.engine is None or self.serving.engine.dead:
            raise APIError(503, "engine is not available", headers=retry)
        if self.max_queued and self.in_flight + n > self.max_queued:
            raise APIError(503, f"too many requests in flight (limit {self.max_queued})",
                           headers=retry)

    def _start(self, prompts: list[list[int]], params) -> list:
        """``params.n`` streams per prompt, in choice order (prompt-major)."""
        streams = []
        try:
            for p in prompts:
                streams += self.serving.add_samples(p, params)
        except ValueError as e:
            for s in streams:
                self.serving.abort(s.rid)
            field = str(e).split(":", 1)[0]
            raise bad_request(str(e), field if field in ("prompt", "n") else None) from None
        except (EngineDead, EngineUnavailable) as e:
            for s in streams:
                self.serving.abort(s.rid)
            raise APIError(503, str(e), headers={"Retry-After": "1"}) from None
        self.in_flight += len(streams)
        return streams

    def _done(self, stream, t0: float, first: float | None, kind: str) -> None:
        self.in_flight -= 1
        ttft = f"{(first - t0) * 1e3:.1f}ms" if first else "-"
        log.info("%s req=%d prompt_tokens=%d output_tokens=%d ttft=%s finish=%s", kind,
                 stream.rid, stream.num_prompt_tokens, stream.num_output_tokens, ttft,
                 "abort" if not stream.done else stream.last_reason)

    # --- /v1/completions -----------------------------------------------------------------------
    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        model = check_model(body, self.model_name)
        reject_unsupported(body, chat=False)
        prompts, texts = completion_prompts(body, self.serving.tokenizer)
        params = sampling_params(body, 16, vocab_size=self.vocab_size)
        flags = stream_flags(body)
        build = CompletionChoices(
            prompts, texts, params, self._token_text(body), echo=flag(body, "echo", False),
            token_ids=flag(body, "return_token_ids", False),
            want_prompt_lps=body.get("prompt_logprobs") is not None).build
        self._admit(len(prompts) * params.n)
        streams = self._start(prompts, params)
        meta = {"id": f"cmpl-{secrets.token_hex(12)}", "created": int(time.time()),
                "model": model}
        if flags.stream:
            return await self._stream(request, streams, meta, "text_completion", build, flags,
                                      chat=False)
        pieces = await self._collect(streams, "completion")
        return web.json_response({**meta, "object": "text_completion",
                                  "choices": [build(i, p, True) for i, p in enumerate(pieces)],
                                  "usage": self._usage(streams)})

    # --- /v1/chat/completions ------------------------------------------------------------------
    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        model = check_model(body, self.model_name)
        reject_unsupported(body, chat=True)
        prompt = chat_prompt(body, self.serving.tokenizer)
        params = sampling_params(body, None, ("max_tokens", "max_completion_tokens"),
                                 vocab_size=self.vocab_size)
        flags = stream_flags(body)
        choices = ChatChoices(prompt, params, self._token_text(body),
                              token_ids=flag(body, "return_token_ids", False),
                              want_prompt_lps=body.get("prompt_logprobs") is not None)
        self._admit(params.n)
        streams = self._start([prompt], params)
        meta = {"id": f"chatcmpl-{secrets.token_hex(12)}", "created": int(time.time()),
                "model": model}
        if flags.stream:
            return await self._stream(request, streams, meta, "chat.completion.chunk",
                                      choices.chunk, flags, chat=True,
                                      first_extra=lambda p: choices.extra(p, whole=False))
        pieces = await self._collect(streams, "chat")
        return web.json_response({**meta, "object": "chat.completion",
                                  "choices": [choices.message(i, p)
                                              for i, p in enumerate(pieces)],
                                  "usage": self._usage(streams),
                                  **choices.extra(pieces[0], whole=True)})

    # --- shared response paths -----------------------------------------------------------------
    def _token_text(self, body: dict) -> TokenText:
        return TokenText(self.serving.tokenizer, flag(body, "return_tokens_as_token_ids", False))

    @staticmethod
    def _usage(streams) -> dict:
        """OpenAI's usage; there is no prefix cache, so no prompt token is ever cached. A
        prompt counts once however many samples it has (vLLM's count: one prefill)."""
        p = sum(s.num_prompt_tokens for s in streams if s.sample_index == 0)
        c = sum(s.num_output_tokens for s in streams)
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c,
                "prompt_tokens_details": {"cached_tokens": 0}}

    async def _collect(self, streams, kind: str) -> list[Piece]:
        t0 = time.monotonic()

        async def one(s):
            piece, first, error = Piece(), None, None
            try:
                async for d in s:
                    if first is None and d.token_ids:
                        first = time.monotonic()
                    piece.add(d)
                    if d.finished:
                        error = d.error
                        s.last_reason = d.finish_reason
            finally:
                if not s.done:
                    self.serving.abort(s.rid)
                self._done(s, t0, first, kind)
            if error:
                raise APIError(503, f"request failed: {error}", headers={"Retry-After": "1"})
            return piece

        return list(await asyncio.gather(*(one(s) for s in streams)))

    async def _stream(self, request, streams, meta, obj: str, build, flags, chat: bool,
                      first_extra=None) -> web.StreamResponse:
        """SSE chunks: ``build(i, piece, first)`` per engine delta (each carries a token, text
        or the choice's end). A token whose text the detokenizer still holds back (part
        of a character) gets a chunk with empty text, as vLLM streams it, so a client sees
        when every token was generated (a benchmark's TTFT and inter-token gaps are per
        token, not per visible character). ``first_extra(piece)`` goes beside the choices
        of the first chunk; with continuous usage every chunk carries the usage so far."""
        resp = web.StreamResponse(headers=SSE_HEADERS)
        t0 = time.monotonic()
        firsts: dict[int, float] = {}
        shown: set[int] = set()
        continuous = flags.include_usage and flags.continuous_usage
        queue: asyncio.Queue = asyncio.Queue()

        async def pump(i, s):
            try:
                async for d in s:
                    await queue.put((i, s, d))
            finally:
                await queue.put((i, s, None))

        async def merged():
            """Every stream's deltas as they come (one stream: read directly, without a
            pump task and a queue between: two loop turns a token fewer)."""
            if len(streams) == 1:
                async for d in streams[0]:
                    yield 0, streams[0], d
                return
            open_streams = len(streams)
            while open_streams:
                i, s, d = await queue.get()
                if d is None:
                    open_streams -= 1
                    continue
                yield i, s, d

        pumps = ([asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
                 if len(streams) > 1 else [])
        try:
            await resp.prepare(request)
            async for i, s, d in merged():
                if d.error:
                    await resp.write(_sse({"error": APIError(503, d.error).body()["error"]}))
                    continue
                if d.token_ids and s.rid not in firsts:
                    firsts[s.rid] = time.monotonic()
                if d.finished:
                    s.last_reason = d.finish_reason
                # Every delta is shown: the engine sends none without a token, text or end.
                piece = Piece()
                piece.add(d)
                chunk = {**meta, "object": obj, "choices": [build(i, piece, i not in shown)]}
                if first_extra is not None and not shown:
                    chunk.update(first_extra(piece))
                shown.add(i)
                if continuous:
                    chunk["usage"] = self._usage(streams)
                await resp.write(_sse(chunk))
            if flags.include_usage:
                await resp.write(_sse({**meta, "object": obj, "choices": [],
                                       "usage": self._usage(streams)}))
            await resp.write(b"data: [DONE]\n\n")
        except (ConnectionResetError, asyncio.CancelledError):
            raise
        finally:
            for p in pumps:
                p.cancel()
            for s in streams:
                if not s.done:
                    self.serving.abort(s.rid)
                self._done(s, t0, firsts.get(s.rid), "chat" if chat else "completion")
        return resp

    # --- /tokenize, /detokenize ---------------------------------------------------------------
    async def tokenize(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        check_model(body, self.model_name)
        return web.json_response(tokenize(body, self.serving.tokenizer,
                                          self.serving.max_model_len))

    async def detokenize(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        check_model(body, self.model_name)
        return web.json_response(detokenize(body, self.serving.tokenizer, self.vocab_size))

    # --- GET routes ---------------------------------------------------------------------------
    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{
            "id": self.model_name, "object": "model", "created": self.created,
            "owned_by": "dualpace", "root": self.serving.config.model, "parent": None,
            "max_model_len": self.serving.max_model_len, "permission": []}]})

    async def health(self, request: web.Request) -> web.Response:
        eng = self.serving.engine
        if self.draining:
            return web.json_response({"status": "draining"}, status=503)
        if eng is None or eng.dead or not self.serving.runtime.available.is_set():
            return web.json_response({"status": "unavailable",
                                      "reason": eng.dead if eng else "starting"}, status=503)
        return web.json_response({"status": "ok"})

    async def metrics(self, request: web.Request) -> web.Response:
        """Prometheus text. A read closes the per-scrape windows (the longest-stall gauge);
        ``?peek=1`` reads without closing them (the dashboard, beside Prometheus)."""
        eng = self.serving.engine
        peek = request.query.get("peek", "") in ("1", "true")
        text = eng.metrics.render(close_windows=not peek) if eng else ""
        return web.Response(text=text, content_type="text/plain", charset="utf-8",
                            headers={"X-Content-Type-Options": "nosniff"})

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": __version__})
