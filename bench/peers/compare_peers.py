"""DualPace beside its peers on one checkpoint and one workload: llama.cpp's llama-server and
the transformers floor, in one run, one table.

    bash bench/peers/build_llama_server.sh          # once, ~15 minutes (never in CI)
    python bench/peers/compare_peers.py --json

Every server gets the same fp32 checkpoint (bench/peers/peer_model.py: random Llama, hidden
512, 8 layers, vocab 32000, sentencepiece tokenizer; converted to GGUF for llama.cpp by its
own convert_hf_to_gguf.py), both cores of the machine, and the same bench/loadgen.py jobs
(the Azure conversation trace's first rows, clipped, as token-id prompts, ignore_eos):

- ``single``: one request at a time -> single-stream tokens/s and TPOT;
- ``concurrent``: --concurrency requests in flight (llama-server gets that many slots,
  continuous batching) -> aggregate tokens/s, TTFT, P99 ITL.

The two phases replay different trace rows (``phase_jobs``): llama-server keeps each slot's
last prompt and skips the prefill of a prompt it has seen (its prompt cache, on by default),
so concurrent jobs that repeated the single-stream ones cost it one token of prefill each,
an advantage that DualPace, without a prefix cache, never gets (seen in its log: "selected
slot by LCP similarity, f_sim_best = 1.000", then "prompt eval time = ... / 1 tokens").

``--rounds N`` (default 3): every server is started once and the peers take turns, phase by
phase, N times (each round its own trace rows; the order of the peers rotates), so that
they meet the same state of a shared host. Each phase's figures are the medians over the
rounds and ``*_vs_this`` the median of the per-round ratios: on this project's 2-core VM
one server's single-stream speed moved by 25-40% between runs minutes apart, so peers
measured one after the other compared the box's states, not the servers.

DualPace runs twice: ``dualpace`` with the default core split (with --gpu-device cpu on two
cores the "GPU" worker gets core 0 and the CPU worker core 1) and ``dualpace-allcores``,
whose "GPU" worker computes on every core, sharing the last with the CPU worker.

Before loading it checks that the peers see the same thing: DualPace's tokenizer.json, the
sentencepiece model and llama-server's /tokenize give identical ids for the same texts, and
greedy completions of text prompts are compared token stream for token stream (as text).
A peer that cannot run (llama-server not built) is reported with the reason, never dropped.
The last line with --json is {"peers": {"dualpace": {..}, "llama.cpp": {..},
"transformers": {..}}, "checks": {..}, ..}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import loadgen  # noqa: E402
import peer_model  # noqa: E402
from common import REPO, emit, free_port, frozen_server_env, wait_healthy  # noqa: E402

PEERS = ("dualpace", "dualpace-allcores", "llama.cpp", "transformers")
TRACE = REPO.parent / "shared" / "traces" / "AzureLLMInferenceTrace_conv.csv"
BUILD = HERE / ".build"
GREEDY_PROMPTS = ["def fibonacci(n):", "The quick brown fox", "import os\nimport sys\n",
                  "class Server:\n    def __init__(self"]


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


# --- the checkpoint and its GGUF -------------------------------------------------------------


def peer_checkpoint(path: str | None) -> Path:
    if path:
        return Path(path)
    from dualpace.demo_model import default_demo_dir

    out = default_demo_dir().parent / "peer-llama-58m-spm"
    if not (out / "model.safetensors").is_file():
        peer_model.make_peer_model(out)
    return out


def gguf_of(model: Path, llama_cpp: Path) -> Path:
    """The checkpoint as an f32 GGUF, converted once by the llama.cpp tree that reads it."""
    out = model / "model-f32.gguf"
    if not out.is_file():
        tmp = out.with_suffix(".tmp")
        env = dict(os.environ, PYTHONPATH=str(llama_cpp / "gguf-py"))
        subprocess.run([sys.executable, str(llama_cpp / "convert_hf_to_gguf.py"), str(model),
                        "--outtype", "f32", "--outfile", str(tmp)], check=True, env=env,
                       stdout=subprocess.DEVNULL)
        tmp.replace(out)
    return out


# --- starting each peer ----------------------------------------------------------------------


def start(peer: str, model: Path, args) -> tuple[subprocess.Popen, str]:
    port = free_port()
    if peer.startswith("dualpace"):
        cmd = [sys.executable, "-m", "dualpace", "serve", "--model", str(model), "--port",
               str(port), "--gpu-device", "cpu", "--max-num-seqs", str(args.max_num_seqs),
               "--log-level", "warning", *args.dualpace_args.split()]
        if peer == "dualpace-allcores":
            # The "GPU" worker computes on its cores here: give it all of them, the CPU tier
            # the last one (shared; it sleeps on its doorbell while it has no requests).
            cores = sorted(os.sched_getaffinity(0))
            cmd += ["--gpu-cores", ",".join(map(str, cores)), "--cpu-cores", str(cores[-1])]
    elif peer == "llama.cpp":
        ctx = args.concurrency * (args.clip_input + args.clip_output + 16)
        cmd = [str(args.llama_server), "-m", str(gguf_of(model, BUILD / "llama.cpp")),
               "--host", "127.0.0.1", "--port", str(port), "--threads", str(os.cpu_count()),
               "--parallel", str(args.concurrency), "--ctx-size", str(ctx),
               "--cont-batching", "--n-gpu-layers", "0"]
    else:
        cmd = [sys.executable, str(HERE / "hf_server.py"), "--model", str(model), "--port",
               str(port), "--threads", str(os.cpu_count())]
    log = open(Path(args.out) / f"{peer}.log", "w")  # noqa: SIM115 - lives as long as proc
    env = frozen_server_env() if peer.startswith("dualpace") else None
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, timeout=300)
    except RuntimeError:
        proc.kill()
        raise
    return proc, url


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# --- what every peer is asked ----------------------------------------------------------------


def greedy_texts(url: str) -> list[str]:
    return [_post(url + "/v1/completions", {
        "prompt": p, "max_tokens": 24, "temperature": 0.0, "ignore_eos": True,
    })["choices"][0]["text"] for p in GREEDY_PROMPTS]


def llama_tokenize(url: str, text: str) -> list[int]:
    return _post(url + "/tokenize", {"content": text, "add_special": False})["tokens"]


def load(url: str, jobs, concurrency: int) -> dict:
    lg = argparse.Namespace(base_url=url, model=None, api_key=None, burstiness=1.0, seed=0,
                            replay_timestamps=False, timestamp_scale=1.0,
                            max_concurrency=concurrency, request_timeout=3600,
                            save_detailed=False, no_progress=True)
    r = asyncio.run(loadgen.run_rate(lg, jobs, float("inf")))
    keys = ("completed", "failed", "duration", "total_output_tokens", "output_throughput",
            "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "median_itl_ms", "p99_itl_ms",
            "mean_normalized_latency_s")
    return {k: round(r[k], 4) if isinstance(r[k], float) else r[k] for k in keys}


def phase_jobs(args, vocab: int, rounds: int = 1) -> list[tuple[list, list]]:
    """Per round, (concurrent jobs, single-stream jobs): the next --num-requests trace rows,
    then the next --single-requests, so that no prompt repeats, in another phase or another
    round (see the module docstring: llama-server's prompt cache)."""
    n = args.num_requests + args.single_requests
    if os.path.exists(args.trace):
        rows = loadgen.load_trace(args.trace, n * rounds, args.clip_input, args.clip_output,
                                  vocab, 0)
    else:
        rows = loadgen.random_jobs(n * rounds, args.clip_input // 2, args.clip_output // 2,
                                   0.9, vocab, 0)
    if len(rows) < n * rounds:
        raise SystemExit(f"compare_peers: {args.trace} has {len(rows)} rows, {rounds} rounds "
                         f"of {n} jobs need {n * rounds}")
    blocks = [rows[i * n:(i + 1) * n] for i in range(rounds)]
    return [(b[:args.num_requests], b[args.num_requests:]) for b in blocks]


def check_peer(peer: str, url: str, model: Path, checks: dict) -> list[str]:
    """llama-server's tokenization against ours (into ``checks``); the greedy texts."""
    if peer == "llama.cpp":
        from dualpace.tokenizer.tokenizer import Tokenizer

        ours = Tokenizer(model)
        mismatches = [t for t in peer_model.AGREEMENT_TEXTS
                      if ours.encode(t, add_special_tokens=False) != llama_tokenize(url, t)]
        checks["tokenization_identical_llama_cpp"] = not mismatches
        checks["tokenization_mismatches"] = mismatches
    return greedy_texts(url)


PHASES = (("single", 1), ("concurrent", None))


def run_rounds(urls: dict[str, str], rounds_jobs, concurrency: int) -> dict[str, dict]:
    """Every phase of every round on every peer, the peers taking turns (their order rotated
    each round); returns peer -> phase -> the list of per-round results."""
    out = {p: {phase: [] for phase, _ in PHASES} for p in urls}
    names = list(urls)
    for r, (jobs, single_jobs) in enumerate(rounds_jobs):
        order = names[r % len(names):] + names[:r % len(names)]
        for phase, conc in PHASES:
            for peer in order:
                res = load(urls[peer], single_jobs if conc == 1 else jobs, conc or concurrency)
                out[peer][phase].append(res)
                print(f"round {r + 1} {peer}: {phase} {res['output_throughput']:.1f} tok/s",
                      file=sys.stderr)
    return out


def summarize(per_round: dict[str, dict]) -> dict[str, dict]:
    """Each phase's figures as the median over the rounds (counts: their sum), the per-round
    results beside, and
    for each peer not ours, ``<ours>_vs_this``: the median of the per-round ratios of output
    throughput (the rounds saw the same jobs and, as near as can be, the same box)."""
    out = {}
    for peer, phases in per_round.items():
        out[peer] = {}
        for phase, runs in phases.items():
            med = {k: (round(statistics.median(r[k] for r in runs), 4)
                       if isinstance(runs[0][k], float) else sum(r[k] for r in runs))
                   for k in runs[0]}
            out[peer][phase] = {**med, "rounds": runs}
    ours = [p for p in per_round if p.startswith("dualpace")]
    for peer, phases in per_round.items():
        if peer in ours:
            continue
        for phase, runs in phases.items():
            for name in ours:
                ratios = [m["output_throughput"] / t["output_throughput"]
                          for m, t in zip(per_round[name][phase], runs)
                          if t["output_throughput"]]
                if ratios:  # e.g. "dualpace-allcores_vs_this": 0.91
                    out[peer][phase][f"{name}_vs_this"] = round(statistics.median(ratios), 2)
    return out


def table(results: dict, concurrency: int) -> str:
    head = (f"{'peer':<19}{'1-stream tok/s':>15}{'TPOT ms':>9}{f'{concurrency}-conc tok/s':>15}"
            f"{'TTFT p50 ms':>12}{'ITL p99 ms':>11}{'failed':>7}")
    rows = [head, "-" * len(head)]
    for peer, r in results.items():
        if "skipped" in r:
            rows.append(f"{peer:<19}skipped: {r['skipped']}")
            continue
        s, c = r["single"], r["concurrent"]
        rows.append(f"{peer:<19}{s['output_throughput']:>15.1f}{s['median_tpot_ms']:>9.2f}"
                    f"{c['output_throughput']:>15.1f}{c['median_ttft_ms']:>12.1f}"
                    f"{c['p99_itl_ms']:>11.1f}{s['failed'] + c['failed']:>7}")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--model", default=None,
                    help="checkpoint with tokenizer.model (default: peer_model.py's)")
    ap.add_argument("--peers", default=",".join(PEERS))
    ap.add_argument("--llama-server", default=str(BUILD / "llama-server"))
    ap.add_argument("--trace", default=str(TRACE))
    ap.add_argument("--num-requests", type=int, default=32)
    ap.add_argument("--single-requests", type=int, default=6)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3,
                    help="phases taken in turn by the peers this many times (medians)")
    ap.add_argument("--clip-input", type=int, default=256)
    ap.add_argument("--clip-output", type=int, default=128)
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--dualpace-args", default="",
                    help="extra `dualpace serve` flags, e.g. '--gpu-cores 0-1 --cpu-cores 1'")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "peers"))
    args = ap.parse_args()
    args.llama_server = Path(args.llama_server)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    model = peer_checkpoint(args.model)
    peer_model.check_tokenizers_agree(model)  # sentencepiece == tokenizer.json, or stop here
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    rounds_jobs = phase_jobs(args, vocab, args.rounds)
    checks: dict = {"tokenization_identical_sentencepiece_hf": True}
    results: dict = {}
    procs: list[subprocess.Popen] = []
    urls: dict[str, str] = {}
    texts: dict[str, list[str]] = {}
    try:
        for peer in args.peers.split(","):
            if peer not in PEERS:
                ap.error(f"unknown peer {peer!r}; choose from {', '.join(PEERS)}")
            if peer == "llama.cpp" and not args.llama_server.is_file():
                results[peer] = {"skipped": f"{args.llama_server} not built: run "
                                            "bash bench/peers/build_llama_server.sh"}
                continue
            proc, urls[peer] = start(peer, model, args)
            procs.append(proc)
            texts[peer] = check_peer(peer, urls[peer], model, checks)
        per_round = run_rounds(urls, rounds_jobs, args.concurrency)
    finally:
        for proc in procs:
            stop(proc)
    for peer, r in summarize(per_round).items():
        results[peer] = {**r, "greedy_texts": texts[peer]}
    ran = {p: r for p, r in results.items() if "greedy_texts" in r}
    ours = {p: r for p, r in ran.items() if p.startswith("dualpace")}
    if ours:
        ref_name, ref = next(iter(ours.items()))
        for p, r in ran.items():
            if p != ref_name:
                checks[f"greedy_identical_{p}"] = sum(
                    a == b for a, b in zip(ref["greedy_texts"], r["greedy_texts"]))
        checks["greedy_reference"] = ref_name
        checks["greedy_prompts"] = len(GREEDY_PROMPTS)
    print(table(results, args.concurrency), file=sys.stderr)
    result = {"bench": "compare_peers", "model": str(model),
              "num_requests": args.num_requests, "rounds": args.rounds,
              "concurrency": args.concurrency, "clip": [args.clip_input, args.clip_output],
              "cores": os.cpu_count(), "checks": checks, "peers": results}
    (Path(args.out) / "peers.json").write_text(json.dumps(result, indent=2))
    (Path(args.out) / "peers.txt").write_text(table(results, args.concurrency) + "\n")
    emit(result, args.json)


if __name__ == "__main__":
    main()
