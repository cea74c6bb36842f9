"""The ``dualpace`` command line."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def _add_engine_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None,
                   help="Hugging Face checkpoint directory (default: the demo model)")
    p.add_argument("--gpu-device", default="auto", help="auto | cpu | cuda[:N]")
    p.add_argument("--dtype", default="auto", help="auto | float32 | bfloat16 | float16")
    p.add_argument("--block-size", type=int, default=16, help="KV block size in tokens")
    p.add_argument("--gpu-kv-blocks", type=int, default=0,
                   help="KV blocks in the GPU-side pool (0: sized automatically)")
    p.add_argument("--max-model-len", type=int, default=0,
                   help="longest prompt + output (0: the checkpoint's limit)")
    p.add_argument("--max-num-seqs", type=int, default=64, help="most requests running at once")


def _engine_options(args: argparse.Namespace) -> dict:
    return {
        "gpu_device": args.gpu_device, "dtype": args.dtype, "block_size": args.block_size,
        "gpu_kv_blocks": args.gpu_kv_blocks, "max_model_len": args.max_model_len,
        "max_num_seqs": args.max_num_seqs,
    }


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dualpace", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("make-demo-model", help="write the random-weight demo checkpoint")
    p.add_argument("dir")
    p.set_defaults(func=cmd_make_demo_model)
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
