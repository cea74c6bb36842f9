"""Every message that crosses a process boundary: ring records and ZeroMQ control messages.

One module, msgspec Structs only (array-like, tagged), one typed decoder per channel; no
pickle anywhere (DESIGN.md §Processes). Bulk data (KV pools, Dense Assist activations) never
travels in a message: it lives in the shared-memory layouts of ``dualpace.runtime.layouts``.

Requests are introduced to a worker once (``NewRequest``); batch descriptors then carry only
what changed: the step's input tokens, the blocks appended since the worker last saw the
request, and migrations.
"""

from __future__ import annotations

from typing import Union

import msgspec

from dualpace.resolved import ResolvedConfig
from dualpace.sampling.logprobs import TokenLogprobs
from dualpace.sampling.penalties import Penalties


class _Msg(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    """Base of every tagged message: array-encoded, defaults omitted, not GC-tracked."""


# --- engine -> worker (data-plane ring) ----------------------------------------------------
class SamplingSpec(msgspec.Struct, array_like=True, gc=False):
    temperature: float
    top_p: float
    top_k: int
    seed: int
    logprobs: int = -1  # k: the sampled token's logprob and the top k; -1: none
    prompt_logprobs: int = -1  # k for the prompt tokens' logprobs; -1: none
    penalties: Penalties | None = None  # sampling/penalties.py; None: none asked for


class NewRequest(_Msg, tag=1):
    req_id: int
    sampling: SamplingSpec


class Fork(msgspec.Struct, array_like=True, gc=False):
    """A sibling of a parallel-sampling group and its blocks (as many as the prompt needs)."""

    req_id: int
    blocks: list[int]


# A decode's input token that the engine does not know yet: the token this worker sampled
# for the request in its previous step (async scheduling, engine/lookahead.py).
PREVIOUS_TOKEN = -1


class SeqStep(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """One request's rows in a step.

    token_ids: this step's input tokens (a prompt chunk, or the last sampled token; a
    decode submitted ahead of its predecessor's result has ``[PREVIOUS_TOKEN]``);
    start_pos: position of token_ids[0]; new_blocks: blocks appended to the request's table
    in the executing pool since the worker last saw it (the whole table when ``reset``: the
    request (re)enters this worker's pool after a migration); sample: whether the step samples a
    token (false for a non-final prefill chunk); out_index: index of the token sampled
    (the sampler's per-request step); host_blocks (GPU worker, Prefill-to-CPU only): the
    request's reserved host blocks, filled layer by layer through the staging area;
    forks (the step that completes a prompt with n > 1 samples): siblings whose blocks in
    the same pool (GPU blocks, or host blocks beside ``host_blocks``) take a copy of the
    prompt's KV once this step has written it.
    """

    req_id: int
    token_ids: list[int]
    start_pos: int
    new_blocks: list[int] = []
    reset: bool = False
    sample: bool = True
    out_index: int = 0
    host_blocks: list[int] = []
    next_token: int = -2  # prompt logprobs: -2 none; else the token after this chunk (-1: none)
    outputs: list[int] = []  # penalized requests: the outputs from outputs_from on
    outputs_from: int = 0
    forks: list[Fork] = []


class Migration(msgspec.Struct, array_like=True, gc=False):
    """Copy the first ``num_tokens`` tokens' KV from ``src_blocks`` to ``dst_blocks``."""

    req_id: int
    src_blocks: list[int]
    dst_blocks: list[int]
    num_tokens: int


class GpuBatch(_Msg, tag=2):
    """A GPU-main step: migrations first (they complete before the forward), then rows."""

    step_id: int
    seqs: list[SeqStep] = []
    swap_out: list[Migration] = []
    swap_in: list[Migration] = []


class CpuBatch(_Msg, tag=3):
    """route: force a post-attention route for this batch ("" = by the thresholds, Eq. 5);
    the gated (NEO-style) baseline sends "neo-pipeline": attention on the CPU, every dense
    stage on the GPU, seqs[:split] and seqs[split:] pipelined as NEO's two sub-batches."""

    step_id: int
    seqs: list[SeqStep] = []
    route: str = ""
    split: int = 0


class Release(_Msg, tag=4):
    """Forget per-request worker state (block tables, sampling). Blocks are the engine's."""

    req_ids: list[int]


class ProfileAssist(_Msg, tag=5):
    """Profiler (paper Appendix B): every GPU rank runs Dense Assist ``op`` on the inputs
    already in the Assist Buffer, ``warmup`` times, then ``repeats`` x ``iters`` times with
    each repeat timed to completion; answered with ProfileDone. The calls take layers
    ``layer``, ``layer + 1``, ... ``layer + layers − 1`` in turn (modulo the model's), as a
    serving step reads every layer's weights rather than one layer's from a cache."""

    step_id: int
    op: int
    rows: int
    layer: int = 0
    layers: int = 1
    warmup: int = 5
    repeats: int = 3
    iters: int = 100


# --- worker -> engine (data-plane ring) ----------------------------------------------------
class StepDone(_Msg, tag=10):
    """tokens[i] is the token sampled for seqs[i] of the step (-1 where it sampled none);
    logprobs[i] its logprobs where the request asked for them (empty when none did);
    ready: requests whose KV transfer (swap, Prefill-to-CPU) completed in this step."""

    step_id: int
    tokens: list[int] = []
    logprobs: list[TokenLogprobs | None] = []
    prompt_logprobs: list[list[TokenLogprobs]] = []  # per seq: its chunk's (empty: not asked)
    ready: list[int] = []
    route: str = ""
    assist_calls: int = 0
    attn_us: int = 0  # CPU worker: time in the paged-attention stages (Eq. 1's T_ca)


class StepFailed(_Msg, tag=11):
    step_id: int
    message: str


class ProfileDone(_Msg, tag=12):
    """repeat_us[j]: this rank's time for repeat j's ``iters`` invocations (Eq. 10's
    τ^end − τ^start), synchronized with the device."""

    step_id: int
    repeat_us: list[int] = []


EngineToWorker = Union[NewRequest, GpuBatch, CpuBatch, Release, ProfileAssist]  # noqa: UP007
WorkerToEngine = Union[StepDone, StepFailed, ProfileDone]  # noqa: UP007


# --- control plane (ZeroMQ) ----------------------------------------------------------------
class Hello(_Msg, tag=20):
    kind: str  # "gpu" | "cpu"
    rank: int
    pid: int
    kv_blocks: int = 0  # a GPU worker: the blocks of its KV pool (sized by it on CUDA)


class Ping(_Msg, tag=21):
    nonce: int


class Pong(_Msg, tag=22):
    nonce: int
    kind: str
    rank: int


class StatsRequest(_Msg, tag=23):
    """Ask a worker for its counters (answered with Stats)."""


class Stats(_Msg, tag=24):
    kind: str
    rank: int
    steps: int
    assist_served: int
    assist_calls: int
    routes: dict[str, int] = {}
    assist_busy_us: int = 0
    assist_at_boundary: int = 0  # GPU: assists served between two main stage tasks
    step_pauses: int = 0  # GPU: one-call decode steps stopped at a layer boundary for assists
    attention_calls: dict[str, int] = {}  # attention calls per backend function (module)
    graph_steps: int = 0  # GPU: decode steps replayed from captured graphs
    threads: int = 0  # shared cores: the thread count last picked (0: fixed placement)
    team_parks: int = 0  # times a C kernel helper thread went to sleep idle (kernels/team.py)


class Shutdown(_Msg, tag=25):
    """Stop the worker's loops and exit."""


class AssistSamplesRequest(_Msg, tag=26):
    """GPU rank 0: the timings of the Dense Assists served since the last request."""


class AssistSamples(_Msg, tag=27):
    """Per served call [op, rows, cuda_us, launch_us, finalize_us]: G, L and F of
    Appendix B's end-to-end calibration (Eq. 12-13)."""

    kind: str
    rank: int
    samples: list[list[int]] = []


class WorkerSpec(msgspec.Struct, gc=False):
    """Everything a spawned worker needs to attach to its instance (JSON in its environment)."""

    kind: str  # "gpu" | "cpu"
    rank: int  # tensor-parallel rank within its group
    tp_size: int
    parent_pid: int
    config: ResolvedConfig
    cores: list[int]  # this worker's own cores (its share while the other tier is busy)
    control: str  # ZeroMQ endpoint of the supervisor
    runtime_dir: str  # the instance's private directory (tensor-parallel rendezvous file)
    shm: dict[str, str]  # role -> segment name
    ring_in_offset: int
    ring_out_offset: int
    ring_capacity: int
    num_workers: int  # wake words in the wake segment
    wake_index: int  # this worker's wake word
    gpu_wake_index: int  # GPU rank 0's wake word (CPU ranks ring it for assists)
    follower_wake_indices: list[int]  # GPU rank 0: the other GPU ranks' wake words
    eventfd: int  # worker -> engine doorbell
    num_host_regions: int  # = CPU tensor-parallel ranks
    gpu_pid: int = 0  # CPU workers: whose death to notice while waiting on an assist
    all_cores: list[int] = []  # shared cores (config.shared_cores): where it may run


Control = Union[Hello, Ping, Pong, StatsRequest, Stats, Shutdown,  # noqa: UP007
                AssistSamplesRequest, AssistSamples]

_enc = msgspec.msgpack.Encoder()
to_worker_decoder = msgspec.msgpack.Decoder(EngineToWorker)
to_engine_decoder = msgspec.msgpack.Decoder(WorkerToEngine)
control_decoder = msgspec.msgpack.Decoder(Control)


def wire_logprobs(lps: list[TokenLogprobs | None]) -> list[TokenLogprobs | None]:
    """The rows' logprobs as StepDone carries them: [] when no row asked for any."""
    return [] if all(x is None for x in lps) else lps


def encode(msg: msgspec.Struct) -> bytes:
    return _enc.encode(msg)
