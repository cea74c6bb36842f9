"""The naive floor: Hugging Face transformers behind an OpenAI-style /v1/completions.

    python bench/peers/hf_server.py --model DIR --port 8002 [--threads 2]

What "naive" means here: one request at a time, first come first served (no batching, no
paging), a plain forward loop over transformers' KV cache (DynamicCache) on the CPU in fp32.
That is what serving a checkpoint with nothing but transformers gives, the floor every
serving system must beat. The wire format is the subset bench/loadgen.py and
bench/peers/compare_peers.py use: prompt as text or token ids, max_tokens, temperature
(0 = greedy), seed, ignore_eos, stream with stream_options.include_usage, return_token_ids
(vLLM's flag: the completion's token ids beside its text); anything else is a 400.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from aiohttp import web
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM

KNOWN_FIELDS = {"model", "prompt", "max_tokens", "temperature", "ignore_eos", "stream",
                "stream_options", "seed", "return_token_ids"}


class BadRequest(Exception):
    """A request this server cannot serve; the message goes back to the client."""


class Floor:
    def __init__(self, model_dir: str, threads: int):
        torch.set_num_threads(threads)
        self.name = Path(model_dir).name
        self.tok = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        self.model.eval()
        # transformers 5 renamed the cache argument; older releases only know the old name.
        params = inspect.signature(self.model.forward).parameters
        self.cache_arg = "cache" if "cache" in params else "past_key_values"
        cfg = json.loads((Path(model_dir) / "config.json").read_text())
        eos = cfg.get("eos_token_id")
        self.eos = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        self.vocab = cfg["vocab_size"]
        self.max_len = cfg.get("max_position_embeddings", 4096)
        # One thread runs every forward: requests are served strictly one at a time.
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hf-floor")

    def parse(self, body) -> tuple[list[int], int, float, bool, int | None]:
        if not isinstance(body, dict):
            raise BadRequest("body must be a JSON object")
        unknown = set(body) - KNOWN_FIELDS
        if unknown:
            raise BadRequest(f"unsupported fields: {sorted(unknown)}")
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            ids = self.tok.encode(prompt).ids
        elif (isinstance(prompt, list) and prompt
              and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)):
            ids = prompt
            if min(ids) < 0 or max(ids) >= self.vocab:
                raise BadRequest(f"token ids must be in [0, {self.vocab})")
        else:
            raise BadRequest("prompt must be a string or a non-empty list of token ids")
        max_tokens = body.get("max_tokens", 16)
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise BadRequest("max_tokens must be a positive integer")
        if len(ids) + max_tokens > self.max_len:
            raise BadRequest(f"prompt ({len(ids)}) + max_tokens ({max_tokens}) exceeds the "
                             f"context length {self.max_len}")
        temperature = body.get("temperature", 1.0)
        if not isinstance(temperature, (int, float)) or temperature < 0:
            raise BadRequest("temperature must be a number >= 0")
        seed = body.get("seed")
        if seed is not None and not isinstance(seed, int):
            raise BadRequest("seed must be an integer")
        return ids, max_tokens, float(temperature), bool(body.get("ignore_eos", False)), seed

    def generate(self, ids: list[int], max_tokens: int, temperature: float, ignore_eos: bool,
                 seed: int | None, emit, cancelled: threading.Event) -> str:
        """Runs on the pool thread; ``emit(token_id)`` per token. Returns the finish reason."""
        gen = torch.Generator().manual_seed(seed) if seed is not None else None
        with torch.inference_mode():
            out = self.model(input_ids=torch.tensor([ids]), use_cache=True)
            for i in range(max_tokens):
                logits = out.logits[0, -1].float()
                if temperature == 0:
                    token = int(torch.argmax(logits))
                else:
                    probs = torch.softmax(logits / temperature, dim=-1)
                    token = int(torch.multinomial(probs, 1, generator=gen))
                emit(token)
                if cancelled.is_set():
                    return "abort"
                if token in self.eos and not ignore_eos:
                    return "stop"
                if i + 1 < max_tokens:
                    cache = {self.cache_arg: getattr(out, self.cache_arg)}
                    out = self.model(input_ids=torch.tensor([[token]]), use_cache=True, **cache)
        return "length"


def _sse(obj) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": "invalid_request_error",
                                        "code": status}}, status=status)


def make_app(floor: Floor) -> web.Application:
    async def completions(request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
            ids, max_tokens, temperature, ignore_eos, seed = floor.parse(body)
        except json.JSONDecodeError:
            return _error(400, "body is not valid JSON")
        except BadRequest as e:
            return _error(400, str(e))
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[int | None] = asyncio.Queue()
        cancelled = threading.Event()

        def emit(token: int) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, token)

        future = loop.run_in_executor(floor.pool, floor.generate, ids, max_tokens, temperature,
                                      ignore_eos, seed, emit, cancelled)
        future.add_done_callback(lambda _: queue.put_nowait(None))
        rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        stream = bool(body.get("stream", False))
        usage_wanted = bool((body.get("stream_options") or {}).get("include_usage"))
        resp = None
        if stream:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                               "Cache-Control": "no-cache"})
            await resp.prepare(request)
        out: list[int] = []
        sent = ""
        # Decode after a few prompt tokens so the first token keeps its leading space (a
        # sentencepiece decoder strips the first space of whatever it is given).
        context = ids[-4:]
        prefix = floor.tok.decode(context)

        def completion_text() -> str:
            full = floor.tok.decode(context + out)
            return full[len(prefix):] if full.startswith(prefix) else floor.tok.decode(out)

        try:
            while (token := await queue.get()) is not None:
                out.append(token)
                text = completion_text()
                if stream and not text.endswith("\ufffd") and len(text) > len(sent):
                    await resp.write(_sse({"id": rid, "object": "text_completion",
                                           "created": created, "model": floor.name,
                                           "choices": [{"index": 0, "text": text[len(sent):],
                                                        "finish_reason": None}]}))
                    sent = text
            finish = await future
        except (asyncio.CancelledError, ConnectionResetError):
            cancelled.set()  # the client went away: stop generating for it
            raise
        text = completion_text()
        usage = {"prompt_tokens": len(ids), "completion_tokens": len(out),
                 "total_tokens": len(ids) + len(out)}
        if not stream:
            choice = {"index": 0, "text": text, "finish_reason": finish}
            if body.get("return_token_ids"):  # vLLM's name for the same thing
                choice["token_ids"] = out
            return web.json_response({"id": rid, "object": "text_completion",
                                      "created": created, "model": floor.name,
                                      "choices": [choice], "usage": usage})
        await resp.write(_sse({"id": rid, "object": "text_completion", "created": created,
                               "model": floor.name,
                               "choices": [{"index": 0, "text": text[len(sent):],
                                            "finish_reason": finish}]}))
        if usage_wanted:
            await resp.write(_sse({"id": rid, "object": "text_completion", "created": created,
                                   "model": floor.name, "choices": [], "usage": usage}))
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def health(_request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def models(_request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": floor.name, "object": "model", "owned_by": "transformers"}]})

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    return app


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8002)
    ap.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    args = ap.parse_args(argv)
    web.run_app(make_app(Floor(args.model, args.threads)), host=args.host, port=args.port,
                print=None)


if __name__ == "__main__":
    main()
