"""The ``dualpace`` command line."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

from dualpace.config import FLAG_HELP, EngineConfig


def _add_engine_flags(p: argparse.ArgumentParser) -> None:
    """One flag per EngineConfig field (``--gpu-kv-blocks`` <-> ``gpu_kv_blocks``)."""
    p.add_argument("--model", default=None,
                   help="Hugging Face checkpoint directory (default: the demo model)")
    for f in dataclasses.fields(EngineConfig):
        if f.name == "model":
            continue
        flag, text = "--" + f.name.replace("_", "-"), FLAG_HELP.get(f.name, "")
        if str(f.type) == "bool":
            p.add_argument(flag, action="store_true", default=f.default, help=text)
            continue
        kind = {"int": int, "float": float}.get(str(f.type), str)
        p.add_argument(flag, type=kind, default=f.default,
                       help=f"{text} (default: {f.default!r})")


def _engine_options(args: argparse.Namespace) -> dict:
    return {f.name: getattr(args, f.name) for f in dataclasses.fields(EngineConfig)
            if f.name != "model"}


def _model_dir(args: argparse.Namespace) -> str:
    if args.model:
        return args.model
    from dualpace.demo_model import ensure_demo_model

    return str(ensure_demo_model())


def cmd_make_demo_model(args: argparse.Namespace) -> int:
    from dualpace.demo_model import make_demo_model

    out = make_demo_model(Path(args.dir))
    print(f"demo model written to {out} (random weights: its text is meaningless)")
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    from dualpace import LLM, SamplingParams

    llm = LLM(_model_dir(args), **_engine_options(args))
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature,
                            seed=args.seed)
    t0 = time.perf_counter()
    outs = llm.generate(args.prompt or ["Hello, DualPace!"], params)
    dt = time.perf_counter() - t0
    n = sum(len(o.token_ids) for o in outs)
    for o in outs:
        print(f"[{o.request_id}] finish={o.finish_reason} tokens={len(o.token_ids)}")
        print(repr(o.text))
    print(f"{n} tokens in {dt:.2f}s ({n / dt:.1f} tokens/s)", file=sys.stderr)
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    import asyncio
    import logging
    import os

    from dualpace.server.serve import serve

    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    model = _model_dir(args)
    config = EngineConfig.from_options(model, **_engine_options(args))
    api_key = args.api_key or os.environ.get("DUALPACE_API_KEY") or None
    name = args.served_model_name or (os.path.basename(model.rstrip("/")) if args.model
                                      else "dualpace-demo")
    return asyncio.run(serve(config, args.host, args.port, name, api_key,
                             args.max_queued_requests, args.drain_timeout, args.step_log))


def cmd_profile(args: argparse.Namespace) -> int:
    import logging

    from dualpace.profiler.run import main as run_profile

    logging.basicConfig(level="WARNING")
    config = EngineConfig.from_options(_model_dir(args), **_engine_options(args))
    prof = run_profile(config, args.out, quick=args.quick)
    print(f"profile written to {args.out}/profile.json (charts: {args.out}/profile.png)")
    print(f"assist_thresholds={prof['assist_thresholds']} "
          f"max_num_batched_tokens={prof['max_num_batched_tokens']} "
          f"cpu_batch_limit={prof['cpu_batch_limit']} cpu_dtype={prof['cpu_dtype']}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dualpace", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("make-demo-model", help="write the random-weight demo checkpoint")
    p.add_argument("dir")
    p.set_defaults(func=cmd_make_demo_model)
    p = sub.add_parser("serve", help="OpenAI-compatible HTTP server (SSE streaming)")
    _add_engine_flags(p)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", default=None,
                   help="model id clients use (default: the model directory's name)")
    p.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' on /v1/* (also DUALPACE_API_KEY)")
    p.add_argument("--max-queued-requests", type=int, default=0,
                   help="requests in flight before new ones get 503 (0: no limit)")
    p.add_argument("--drain-timeout", type=float, default=30.0,
                   help="seconds SIGTERM waits for in-flight requests")
    p.add_argument("--log-level", default="info")
    p.add_argument("--step-log", default=None,
                   help="append one JSON line per executed step (work and seconds) to this "
                        "file: the measurements `dualpace simulate --profile` fits")
    p.set_defaults(func=cmd_serve)
    p = sub.add_parser("profile", help="offline profile: routing thresholds and limits (§4.3)")
    _add_engine_flags(p)
    p.add_argument("--out", default="dualpace-profile", help="output directory")
    p.add_argument("--quick", action="store_true", help="few sizes and repeats (a first look)")
    p.set_defaults(func=cmd_profile)
    from dualpace.sim.cli import add_parser as add_simulate

    add_simulate(sub, _add_engine_flags)
    p = sub.add_parser("generate", help="offline generation for the given prompts")
    _add_engine_flags(p)
    p.add_argument("--prompt", action="append", help="a prompt (repeatable)")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None)
    p.set_defaults(func=cmd_generate)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, TypeError, OSError) as e:
        print(f"dualpace: error: {e}", file=sys.stderr)
        return 2
