"""Entry point of a spawned worker process: ``python -m dualpace.runtime.worker_main``.

Order matters: die with the parent first, pin to the assigned cores (and NUMA node), load
the model, attach the shared segments, then say Hello over ZeroMQ so the supervisor's
start-up handshake completes only when the worker can take work. A control thread answers
Ping/Stats/Shutdown; the main thread runs the data-plane loop.
"""

from __future__ import annotations

import datetime
import logging
import os
import signal
import sys
import threading

import msgspec
import torch
import zmq

from dualpace.kernels import cpu as cpu_kernels
from dualpace.kernels import team
from dualpace.kernels.futex import FutexWord
from dualpace.kv.block_pool import blocks_for_tokens
from dualpace.kv.cache import KVCache
from dualpace.model.attention_check import checked_backend
from dualpace.model.config import load_model_config
from dualpace.model.stages import StagedModel, attention_functions
from dualpace.model.weights import Shard, load_weights
from dualpace.resolved import GRAPH_BACKENDS
from dualpace.runtime import protocol as P
from dualpace.runtime.assist import AssistChannel, pid_alive
from dualpace.runtime.copies import DEFERRED_ENV, copy_engine, register_host
from dualpace.runtime.cpu_worker import CpuWorker, HostKV
from dualpace.runtime.decode_graphs import (
    GRAPH_CHECK_TOL,
    DecodeGraphs,
    PaddedDecodeInputs,
    capture_sizes,
)
from dualpace.runtime.gpu_memory import size_gpu_kv
from dualpace.runtime.gpu_worker import GpuWorker, StagingKV
from dualpace.runtime.layouts import (
    DTYPES,
    NUM_ASSIST_CHANNELS,
    HostKVLayout,
    RingLayout,
    TPControlLayout,
    WakeLayout,
    head_ranges,
)
from dualpace.runtime.placement import die_with_parent, pin_current_process
from dualpace.runtime.ring import Ring
from dualpace.runtime.shm import Segment
from dualpace.runtime.thread_share import ThreadShare, occupancy_words
from dualpace.runtime.tp_control import DecisionLog

SPEC_ENV = "DUALPACE_WORKER_SPEC"
IDLE_SPIN = 4000  # pause iterations (~0.1 ms) before an idle worker sleeps (assist latency)
log = logging.getLogger("dualpace.worker")


def _whole(seg: Segment) -> torch.Tensor:
    """A whole segment as bytes: page-locked in one registration (per-layer views would
    share pages at their edges, and a page can be registered once)."""
    return seg.tensor(0, (seg.size,), torch.uint8)


class WorkerProcess:
    def __init__(self, spec: P.WorkerSpec):
        self.spec = spec
        self.config = spec.config
        if self.config.cpu_isa:
            cpu_kernels.set_default_isa(self.config.cpu_isa)
        self.stop = False
        self.kv_blocks = 0
        seg = {role: Segment.attach(name) for role, name in spec.shm.items()}
        self.segments = seg
        wake_layout = WakeLayout(num_workers=spec.num_workers)

        def wake(i: int) -> FutexWord:
            return FutexWord(seg["wake"].buf, wake_layout.offset(i))

        self.wake = wake(spec.wake_index)
        ring_layout = RingLayout(capacity=spec.ring_capacity)
        self.ring_in = Ring(seg["rings"].buf, spec.ring_in_offset, ring_layout)
        self.ring_out = Ring(seg["rings"].buf, spec.ring_out_offset, ring_layout)
        host = self.config.host_kv
        regions = [host.views(seg["host_kv"], c * host.size)
                   for c in range(spec.num_host_regions)]
        assist = self.config.assist
        channels = [AssistChannel(seg["assist"], assist, i * assist.size,
                                  wake(spec.gpu_wake_index))
                    for i in range(NUM_ASSIST_CHANNELS)]
        decisions = None
        if spec.kind == "gpu" and spec.tp_size > 1:
            decisions = DecisionLog(seg["tpctl"].buf, 0, TPControlLayout(),
                                    [wake(i) for i in spec.follower_wake_indices])
        self.worker = self._build(host, regions, channels, decisions)
        model = self.worker.model
        log.info("%s worker rank %d: native decode stages %s", spec.kind, spec.rank,
                 "on" if model.native is not None else f"off ({model.why_native})")
        self.threads = None
        if spec.all_cores:  # shared cores: threads follow the other tier's occupancy
            mine, peer = occupancy_words(seg["occupancy"].buf, spec.kind)
            self.threads = ThreadShare(len(spec.cores), len(spec.all_cores), mine, peer)
            self.worker.model.layer_hook = self.threads.check
            self.worker.model.native_threads = self.threads.native_args()
            if cpu_kernels.available():
                # the C kernels' idle threads keep their core warm only while the other
                # tier is not in a step (dualpace/kernels/team.py)
                team.set_gate(peer.address)

    def _all_reduce(self, device: torch.device):
        """The tensor-parallel group's sum (torch.distributed: NCCL on CUDA, else Gloo)."""
        spec = self.spec
        if spec.tp_size == 1:
            return None
        import torch.distributed as dist

        cuda = device.type == "cuda"
        # NCCL binds each rank's communicator to its own device (set_device ran in _build):
        # without device_id every rank would first touch cuda:0.
        dist.init_process_group(
            "nccl" if cuda else "gloo",
            init_method=f"file://{spec.runtime_dir}/tp-{spec.kind}.store",
            rank=spec.rank, world_size=spec.tp_size,
            timeout=datetime.timedelta(seconds=self.config.startup_timeout),
            **({"device_id": device} if cuda else {}))

        def all_reduce(t: torch.Tensor) -> torch.Tensor:
            dist.all_reduce(t)
            return t

        return all_reduce

    def _build(self, host: HostKVLayout, regions, channels, decisions):
        cfg, spec, seg = self.config, self.spec, self.segments
        full = load_model_config(cfg.model)
        local = full.shard(spec.tp_size)
        shard = Shard(spec.rank, spec.tp_size)
        max_len = cfg.max_model_len
        p, f = cfg.thresholds
        if spec.kind == "gpu":
            device = torch.device(cfg.gpu_device)
            if device.type == "cuda" and spec.tp_size > 1:
                device = torch.device("cuda", spec.rank)
            if device.type == "cuda":
                # The current device: events, streams, mem_get_info and NCCL use it.
                device = torch.device("cuda", device.index or 0)
                torch.cuda.set_device(device)
            dtype = DTYPES[cfg.gpu_dtype]
            model = StagedModel(local, load_weights(cfg.model, full, dtype, device, shard),
                                max_len, all_reduce=self._all_reduce(device),
                                attention_backend=cfg.attention_backend,
                                block_size=cfg.block_size)
            graphs_ok = cfg.cuda_graphs
            if device.type == "cuda" and cfg.attention_backend != "torch":
                backend = checked_backend(cfg.attention_backend, device, dtype, log,
                                          cfg.block_size)
                if backend != cfg.attention_backend:  # serve with what passed
                    model.decode_attention, model.prefill_attention = attention_functions(
                        backend, device, local, cfg.block_size)
                    graphs_ok = graphs_ok and backend in GRAPH_BACKENDS
            staging = StagingKV(local.num_layers, cfg.staging_blocks, local.num_kv_heads,
                                cfg.block_size, local.head_dim, dtype, device)
            blocks = cfg.gpu_kv_blocks
            if not blocks:  # CUDA: what the weights and a profiling forward leave
                block_bytes = (2 * local.num_layers * local.num_kv_heads * cfg.block_size
                               * local.head_dim * dtype.itemsize)
                blocks = size_gpu_kv(model, staging, cfg.max_num_batched_tokens,
                                     cfg.max_num_seqs, max_len, cfg.gpu_memory_utilization,
                                     block_bytes)
            self.kv_blocks = blocks
            # Decode graphs pad batches with rows that touch one scratch block past the pool.
            scratch = 1 if cfg.cuda_graphs else 0
            kv = KVCache(local.num_layers, blocks + scratch, local.num_kv_heads,
                         cfg.block_size, local.head_dim, dtype, device)
            heads = head_ranges(full.num_kv_heads, spec.tp_size, spec.num_host_regions,
                                spec.rank)
            # Stage boundaries serve assists when a route can call one (§4.2), and always
            # under a forced route (the gated baseline's dense stages run between them):
            # the policy decides, as it does for the engine.
            if device.type == "cuda":  # DMA-able: the host KV pool and the Assist Buffers
                register_host([_whole(seg["host_kv"]), _whole(seg["assist"])])
            # DUALPACE_DEFERRED_COPIES=1 (tests, CPU only): copies land only when waited on.
            copies = copy_engine(device, deferred=os.environ.get(DEFERRED_ENV) == "1")
            graphs = None
            if graphs_ok:
                inputs = PaddedDecodeInputs(cfg.max_num_seqs,
                                            blocks_for_tokens(max_len, cfg.block_size),
                                            blocks, cfg.block_size, device)
                # Per stage when a Dense Assist may arrive mid-forward (§4.2), else whole.
                graphs = DecodeGraphs(model, kv, inputs, capture_sizes(cfg.max_num_seqs),
                                      per_stage=cfg.serves_boundaries())
                try:
                    graphs.capture()
                    reason = graphs.check(GRAPH_CHECK_TOL[dtype])
                except Exception:  # serve eagerly rather than not at all
                    log.exception("decode CUDA graph capture failed: serving eagerly "
                                  "(--enforce-eager skips the attempt)")
                    graphs = None
                else:
                    if reason is not None:  # wrong tokens are worse than slow ones
                        log.error("decode CUDA graphs failed their start-up check (%s): "
                                  "serving eagerly", reason)
                        graphs = None
            return GpuWorker(model, kv, staging, regions, heads, channels,
                             cfg.serves_boundaries(),
                             spec.rank, spec.tp_size, decisions, copies, graphs)
        dtype = DTYPES[host.dtype]
        model = StagedModel(local, load_weights(cfg.model, full, dtype, "cpu", shard), max_len,
                            all_reduce=self._all_reduce(torch.device("cpu")))
        k, v = regions[spec.rank]
        return CpuWorker(model, HostKV(k, v, cfg.block_size), channels, (p, f),
                         pid_alive(spec.gpu_pid), spec.rank, spec.tp_size,
                         forced_route=cfg.policy_object.forced_route)

    # --- data plane -------------------------------------------------------------------------
    def handle(self, raw: bytes) -> None:
        msg = P.to_worker_decoder.decode(raw)
        if isinstance(msg, P.NewRequest):
            self.worker.requests.add(msg)
        elif isinstance(msg, P.Release):
            self.worker.requests.release(msg)
        else:
            try:
                if isinstance(msg, P.ProfileAssist):
                    if not isinstance(self.worker, GpuWorker):
                        raise ValueError("ProfileAssist goes to GPU workers")
                    out = self.worker.profile_assist(msg)
                elif self.threads is not None:
                    self.threads.begin()
                    try:
                        out = self.worker.run(msg)
                    finally:
                        self.threads.end()
                else:
                    out = self.worker.run(msg)
            except Exception as e:  # a failed step is reported, the worker lives on
                log.exception("step %s failed", msg.step_id)
                out = P.StepFailed(step_id=msg.step_id, message=f"{type(e).__name__}: {e}")
            self.ring_out.write(P.encode(out))
            os.eventfd_write(self.spec.eventfd, 1)

    def loop(self) -> None:
        serve_assists = getattr(self.worker, "serve_assists", None)
        while not self.stop:
            seq = self.wake.load()
            worked = False
            for raw in self.ring_in.read_all():
                self.handle(raw)
                worked = True
            if serve_assists is not None and serve_assists():
                worked = True
            if not worked:
                self.wake.wait_while_equal(seq, timeout=0.5, spin=IDLE_SPIN)

    # --- control plane ----------------------------------------------------------------------
    def control_thread(self, sock: zmq.Socket) -> None:
        w = self.worker
        while not self.stop:
            if not sock.poll(200):
                continue
            msg = P.control_decoder.decode(sock.recv())
            if isinstance(msg, P.Ping):
                reply = P.Pong(nonce=msg.nonce, kind=self.spec.kind, rank=self.spec.rank)
            elif isinstance(msg, P.StatsRequest):
                reply = P.Stats(kind=self.spec.kind, rank=self.spec.rank, steps=w.steps,
                                assist_served=getattr(w, "assist_served", 0),
                                assist_calls=getattr(w, "assist_calls", 0),
                                routes=dict(getattr(w, "routes", {})),
                                assist_busy_us=getattr(w, "assist_busy_us", 0),
                                assist_at_boundary=getattr(w, "boundary_served", 0),
                                step_pauses=getattr(w, "step_pauses", 0),
                                graph_steps=getattr(w, "graph_steps", 0),
                                threads=self.threads.current if self.threads else 0,
                                team_parks=team.parks() if cpu_kernels.available() else 0,
                                attention_calls=dict(w.model.attention_calls))
            elif isinstance(msg, P.AssistSamplesRequest):
                samples = getattr(w, "assist_samples", None)
                drained = []
                while samples:
                    drained.append(samples.popleft())
                reply = P.AssistSamples(kind=self.spec.kind, rank=self.spec.rank,
                                        samples=drained)
            elif isinstance(msg, P.Shutdown):
                self.stop = True
                self.wake.add(1)
                self.wake.wake()
                continue
            else:
                continue
            sock.send(P.encode(reply))


def main() -> int:
    spec = msgspec.json.decode(os.environ[SPEC_ENV].encode(), type=P.WorkerSpec)
    die_with_parent(spec.parent_pid)
    # SIGTERM/SIGINT belong to the supervisor: a worker stops on Shutdown or parent death.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=os.environ.get("DUALPACE_LOG_LEVEL", "WARNING"),
                        format=f"%(asctime)s {spec.kind}-worker[{spec.rank}] %(message)s")
    placement = pin_current_process(spec.all_cores or spec.cores)
    torch.set_num_threads(len(spec.cores))
    log.info("%s", placement)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(spec.control)
    proc = WorkerProcess(spec)
    sock.send(P.encode(P.Hello(kind=spec.kind, rank=spec.rank, pid=os.getpid(),
                               kv_blocks=proc.kv_blocks)))
    thread = threading.Thread(target=proc.control_thread, args=(sock,), daemon=True)
    thread.start()
    proc.loop()
    if proc.threads is not None and cpu_kernels.available():
        team.set_gate(None)  # before the occupancy segment goes: no thread reads it then
    thread.join(timeout=1.0)
    sock.close()
    ctx.term()
    return 0


if __name__ == "__main__":
    sys.exit(main())
