"""LLMEngine: the request table, the GPU-engine loop, the CPU-engine loop and the completion
loop, on one asyncio loop (paper §4.1, §5 "Asynchronous runtime"; Appendix A).

Each engine loop repeats: schedule one round -> commit its KV and ownership changes ->
submit one batch -> await the result -> apply it. The two loops share no iteration barrier:
they meet only in the scheduling state (ownership, readiness, the host-KV obligations).

Policies (engine/policy.py): with a CPU clock (``dualpace``) both loops run; without one the
GPU loop runs alone, and with a host tier but no CPU clock (``gated``, NEO-style) it carries
CPU-resident decodes in iterations whose overlap condition (Eq. 1) holds, attention on the
CPU worker and every dense stage on the GPU worker (the policy's forced route).

Workers are reached through ``runtime/translator.py`` only: the scheduler's plans become wire
descriptors there.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import time

from dualpace.engine.cost_model import GpuWork, NeoCostModel, NeoSelection, neo_select
from dualpace.engine.cpu_round import cpu_round, make_room_for_head
from dualpace.engine.gpu_round import GpuPlan, StepRow, gpu_round
from dualpace.engine.lookahead import commit_lookahead, lookahead_rows
from dualpace.engine.metrics import Metrics
from dualpace.engine.outputs import RequestStream, TokenEvent
from dualpace.engine.policy import Policy
from dualpace.engine.request import EngineRequest, Owner, Phase
from dualpace.engine.stall import CpuStallClock
from dualpace.engine.state import Limits, SchedulerState
from dualpace.engine.step_overlap import StepOverlap
from dualpace.kv.block_pool import BlockPool, blocks_for_tokens
from dualpace.runtime import translator
from dualpace.runtime.step_work import cpu_step_work, gpu_step_work
from dualpace.sampling.params import SamplingParams
from dualpace.tokenizer.detokenizer import IncrementalDetokenizer

log = logging.getLogger("dualpace.engine")


def _gpu_work(plan: GpuPlan) -> GpuWork:
    """A GPU plan's batched tokens, attention context and sampling rows (Eq. 1 inputs)."""
    tokens = len(plan.decodes) + sum(n for _, n in plan.prefills)
    tokens += sum(r.num_tokens for r in plan.to_cpu)
    context = sum(r.num_tokens for r in plan.decodes)
    context += sum(r.computed + n for r, n in plan.prefills)
    context += sum(r.num_tokens for r in plan.to_cpu)
    return GpuWork(tokens=tokens, context=context, rows=plan.rows)


def _int64(x: int) -> int:
    """``x`` wrapped into the signed 64-bit range (a sibling's seed s + i at s = 2**63 - 1)."""
    return (x + 2**63) % 2**64 - 2**63


class EngineDead(RuntimeError):
    """The engine cannot serve (its workers failed past the restart bound, or it stopped)."""


def context_length_error(max_model_len: int, prompt_len: int, max_tokens: int) -> str:
    """vLLM's wording for a request that does not fit the model length."""
    return (
        f"This model's maximum context length is {max_model_len} tokens. However, you "
        f"requested {prompt_len + max_tokens} tokens ({prompt_len} in the messages, "
        f"{max_tokens} in the completion). Please reduce the length of the messages or "
        "completion."
    )


class LLMEngine:
    def __init__(self, workers, *, gpu_blocks: int, host_blocks: int, block_size: int,
                 limits: Limits, policy: Policy | str, vocab_size: int, eos_ids: tuple[int, ...],
                 tokenizer=None, on_round=None, clock=time.monotonic,
                 async_scheduling: bool = False):
        """``workers`` has ``.gpu`` and ``.cpu`` worker groups (``send``, ``step``; with
        ``async_scheduling`` also ``submit``, a future of the step's result, steps executed
        in submission order) and an ``available`` event: the runtime, or fakes in scheduler
        tests.
        ``on_round(engine, kind, plan)`` is a test hook called after every committed round.
        ``clock`` stamps arrivals, tokens and stalls (tests script it with fake workers)."""
        if gpu_blocks < 1 or host_blocks < 1:
            raise ValueError(f"KV pools need blocks: {gpu_blocks} GPU, {host_blocks} host "
                             "(a CUDA worker's measured GPU pool is settled at start)")
        self.workers = workers
        self.clock = clock
        self.async_scheduling = async_scheduling  # engine/lookahead.py
        self.state = SchedulerState(BlockPool(gpu_blocks, block_size),
                                    BlockPool(host_blocks, block_size), limits, policy)
        self.block_size = block_size
        self.vocab_size = vocab_size
        self.eos_ids = eos_ids
        self.tokenizer = tokenizer
        self.on_round = on_round
        self.metrics = Metrics()
        self.requests: dict[int, EngineRequest] = {}
        self.streams: dict[int, RequestStream] = {}
        self.trace: list[tuple[float, str, int]] | None = None  # (time, engine, rid) per token
        # ``on_step(record)``: every executed step's work and seconds from its round's start
        # to the end of applying its result (the loop's cadence: scheduling, the worker
        # round trip, applying), plus ``step_seconds``, the worker round trip alone.
        # ``serve --step-log`` writes them; the simulator fits its cost models to them.
        self.on_step = None
        # ``on_request(record)``: every finished request's arrival and token times (seconds
        # after arrival, as the engine stamped them): joined with a client's own times, what
        # the HTTP/SSE path adds, which the simulator's delivery model replays.
        self.on_request = None
        self._cpu_record: dict | None = None
        # Steps in flight per worker group: a step's record says whether and for how long
        # the other group ran beside it (``beside``, ``overlap``; on a small box they share
        # cores).
        self._overlap = StepOverlap(self.clock)
        self.neo = NeoCostModel()  # the gated baseline's Eq. 1 model
        # ... fitted only where it selects (a GPU step's sums cost ~5% of the engine's CPU
        # time a token at batch 1, on every step)
        self._neo_learns = self.state.policy.gpu_carries_cpu
        self.wire = translator.Translator(eos_ids)
        self._ids = itertools.count(1)
        self._steps = itertools.count(1)
        self._rng = random.Random()
        self._events: asyncio.Queue[TokenEvent] = asyncio.Queue()
        self._gpu_wake = asyncio.Event()
        self._cpu_wake = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self.dead: str | None = None
        self.stall = CpuStallClock()
        self.metrics.collectors.append(self._collect_stall)
        self.metrics.set("dualpace:kv_blocks_total", gpu_blocks, tier="gpu")
        self.metrics.set("dualpace:kv_blocks_total",
                         host_blocks if self.state.policy.host_tier else 0, tier="cpu")

    # --- life cycle -------------------------------------------------------------------------
    def start(self) -> None:
        policy = self.state.policy
        loops = [self._gated_loop() if policy.gpu_carries_cpu else self._gpu_loop(),
                 self._completion_loop()]
        if policy.cpu_clock:
            loops.append(self._cpu_loop())
        self._tasks = [asyncio.create_task(self._guard(c)) for c in loops]

    async def _guard(self, loop_coro) -> None:
        """A crashed engine loop is a dead engine, reported, never a silent hang."""
        try:
            await loop_coro
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.exception("engine loop crashed")
            self.mark_dead(f"engine loop crashed: {type(e).__name__}: {e}")

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        for r in list(self.requests.values()):
            self._finish(r, "abort", error="server shutting down")
        self._flush_events()

    def fail_all(self, error: str) -> None:
        """Every live request fails with ``error`` (a worker died: their KV is gone)."""
        for r in list(self.requests.values()):
            r.in_flight = None
            self._finish(r, "abort", error=error, release=False)
        self.wire.forget_all()
        st = self.state
        st.gpu_pool = BlockPool(st.gpu_pool.num_blocks, st.gpu_pool.block_size)
        st.host_pool = BlockPool(st.host_pool.num_blocks, st.host_pool.block_size)
        self._wake()

    def mark_dead(self, reason: str) -> None:
        self.dead = reason
        self.fail_all(reason)

    # --- requests ---------------------------------------------------------------------------
    def add_request(self, prompt_ids: list[int], params: SamplingParams,
                    max_model_len: int) -> RequestStream:
        """One sample of ``prompt_ids`` (``params.n`` must be 1: see ``add_samples``)."""
        if params.n != 1:
            raise ValueError(f"n: add_request takes n=1, got {params.n}; use add_samples")
        return self.add_samples(prompt_ids, params, max_model_len)[0]

    def add_samples(self, prompt_ids: list[int], params: SamplingParams,
                    max_model_len: int) -> list[RequestStream]:
        """``params.n`` samples of one prompt, a stream each. Parallel sampling is one
        prefill: the first request carries the others (``forks``) through admission, where
        they get blocks of their own in the same pool, and the step that completes its
        prompt copies the prompt's KV into them (a copy, not shared copy-on-write blocks:
        block accounting stays one owner per block, as every invariant and migration
        assumes). Each sibling then decodes on its own from the prompt's last position
        (recomputed: its first token is sampled from its own seed). With ``seed`` s the
        samples use s, s+1, ... (vLLM's parallel sampling), so the n choices repeat."""
        if self.dead:
            raise EngineDead(self.dead)
        if not prompt_ids:
            raise ValueError("prompt: must not be empty")
        bad = next((t for t in prompt_ids if not (0 <= t < self.vocab_size)), None)
        if bad is not None:
            raise ValueError(f"prompt: token id {bad} is out of vocabulary "
                             f"(size {self.vocab_size})")
        room = max_model_len - len(prompt_ids)
        if room < 1 or (params.max_tokens is not None and params.max_tokens > room):
            raise ValueError(context_length_error(max_model_len, len(prompt_ids),
                                                  params.max_tokens or 1))
        max_tokens = room if params.max_tokens is None else params.max_tokens
        peak = blocks_for_tokens(len(prompt_ids) + max_tokens, self.block_size)
        cap = self.state.gpu_pool.num_blocks
        if self.state.policy.host_tier:
            cap = max(cap, self.state.host_pool.num_blocks)
        if peak > cap:
            raise ValueError(f"request needs up to {peak} KV blocks; the largest KV pool has "
                             f"{cap}")
        if params.n > 1:
            self._check_group(len(prompt_ids), params.n)
        seed = params.seed if params.seed is not None else self._rng.getrandbits(63)
        now = self.clock()
        reqs = [EngineRequest(next(self._ids), list(prompt_ids), params, _int64(seed + i),
                              max_tokens, self.block_size, arrival=now,
                              awaiting_fork=i > 0) for i in range(params.n)]
        reqs[0].forks = reqs[1:]
        streams = []
        for i, r in enumerate(reqs):
            self.requests[r.rid] = r
            detok = (IncrementalDetokenizer(self.tokenizer, prompt_ids)
                     if self.tokenizer is not None else None)
            stream = RequestStream(r.rid, params, detok, len(prompt_ids), sample_index=i)
            self.streams[r.rid] = stream
            streams.append(stream)
        self.state.gpu_waiting.append(reqs[0])
        self._gpu_wake.set()
        return streams

    def _check_group(self, prompt_len: int, n: int) -> None:
        """A group is admitted whole (gpu_round step 5): to HBM, n rows and n prompts' blocks;
        Prefill-to-CPU, n prompts' host blocks. One that fits neither pool when empty would
        wait for ever: refuse it now."""
        st = self.state
        nb = blocks_for_tokens(prompt_len, self.block_size) * n
        gpu_ok = n <= st.limits.max_num_seqs and nb <= st.gpu_pool.num_blocks
        cpu_ok = st.policy.host_tier and nb <= st.host_pool.num_blocks
        if not (gpu_ok or cpu_ok):
            where = (f"{st.limits.max_num_seqs} sequences and {st.gpu_pool.num_blocks} GPU KV "
                     "blocks")
            if st.policy.host_tier:
                where += f", or {st.host_pool.num_blocks} host KV blocks"
            raise ValueError(f"n: {n} samples of a {prompt_len}-token prompt need {nb} KV "
                             f"blocks at once; this server admits at most {where}")

    def abort(self, rid: int, reason: str = "abort") -> None:
        """Finish a request in any state; a request inside a submitted step finishes when
        that step returns, so each of its blocks is freed exactly once."""
        r = self.requests.get(rid)
        if r is None or r.finished:
            return
        if r.in_flight:
            r.abort_requested = r.abort_requested or reason
            return
        self._finish(r, reason)

    # --- the GPU engine -----------------------------------------------------------------------
    async def _gpu_loop(self) -> None:
        while True:
            await self.workers.available.wait()  # never plan onto a restarting group
            t_round = self.clock()
            plan = gpu_round(self.state)
            self._after_round("gpu", plan)
            if plan.empty:
                await self._sleep(self._gpu_wake)
                continue
            await self._run_gpu(plan, t_round=t_round)

    async def _run_gpu(self, plan: GpuPlan, cpu_batch: list[EngineRequest] | None = None,
                       split: int = 0, t_round: float | None = None) -> None:
        """One GPU step; with ``cpu_batch`` (gated) the CPU sub-batches run as NEO's
        pipeline beside it (``split``: how many of them are sub-batch 0). With async
        scheduling, decode steps follow it ahead of its result (engine/lookahead.py)."""
        step_id = next(self._steps)
        rows = plan.step_rows()
        batch = self.wire.gpu_batch(step_id, plan, rows)
        involved = [m.req for m in plan.swap_out + plan.swap_in] + [row.req for row in rows]
        self._introduce("gpu", involved)
        # Siblings whose blocks this step fills are in it too: an abort waits for the step.
        involved += [f for row in rows for f in row.forks]
        for r in involved:
            r.in_flight = "gpu"
        cpu_reqs = cpu_batch or []
        t0 = self.clock()
        snap = self._overlap.begin("gpu")
        if cpu_reqs:
            results = await asyncio.gather(
                self.workers.gpu.step(batch),
                self._cpu_step(cpu_reqs, route=self.state.policy.forced_route, split=split),
                return_exceptions=True)
            self._gpu_step_done(plan, rows, batch, involved, results[0], t0, snap, t_round,
                                carried=len(cpu_reqs))
            self._apply_cpu(cpu_reqs, results[1])
            self._log_cpu_step(None)
        elif self.async_scheduling:
            await self._run_gpu_ahead(plan, rows, batch, involved, t0, snap, t_round)
        else:
            # Awaited here, not in a task that gather makes: this loop resumes in the
            # callback that completes the step, not a loop turn or two later behind work
            # queued meanwhile (the streams' deliveries) while the worker sits idle.
            # Measured: the worker's idle gap between single-stream steps 0.40-0.54 ->
            # 0.28-0.34 ms (Zen 5, 2 cores, the llama.cpp comparison model).
            try:
                done = await self.workers.gpu.step(batch)
            except Exception as e:  # as gather's return_exceptions
                done = e
            self._gpu_step_done(plan, rows, batch, involved, done, t0, snap, t_round)
        self._wake()

    async def _run_gpu_ahead(self, plan, rows, batch, involved, t0, snap, t_round) -> None:
        """The step in flight, followed while lookahead_rows allows by decode steps submitted
        before its predecessor's result is applied: the worker finds the next step queued
        when it finishes one. A step ahead starts when its predecessor ends (its record's
        ``step_seconds`` counts from there)."""
        fut = self.workers.gpu.submit(batch)
        ahead = self._submit_ahead(plan)
        while True:
            try:
                done = await fut
            except Exception as e:
                done = e
            t_end = self.clock()
            self._gpu_step_done(plan, rows, batch, involved, done, t0, snap, t_round)
            if ahead is None:
                return
            plan, batch, fut = ahead
            rows = plan.step_rows()
            involved = [row.req for row in rows]
            for r in involved:
                if not r.finished:
                    r.in_flight = "gpu"
            t0, t_round, snap = t_end, None, self._overlap.begin("gpu")
            ahead = self._submit_ahead(plan) if not isinstance(done, BaseException) else None

    def _submit_ahead(self, in_flight: GpuPlan):
        """(plan, descriptor, future) of a decode step behind ``in_flight``, or None."""
        reqs = lookahead_rows(self.state, in_flight)
        if not reqs or not self.workers.available.is_set():
            return None
        plan = commit_lookahead(self.state, reqs)
        # of _after_round's gauges only the blocks can change; and the tests' checks
        self.metrics.set("dualpace:kv_blocks_used", self.state.gpu_pool.num_used, tier="gpu")
        if self.on_round is not None:
            self.on_round(self, "gpu", plan)
        batch = self.wire.ahead_batch(next(self._steps), plan)
        self.metrics.inc("dualpace:async_scheduled_steps_total")
        return plan, batch, self.workers.gpu.submit(batch)

    def _gpu_step_done(self, plan, rows, batch, involved, done, t0, snap, t_round,
                       carried: int = 0) -> None:
        beside, overlap = self._overlap.end("gpu", snap)
        if isinstance(done, BaseException):
            self._step_failed(involved, done)
            return
        step = self.clock() - t0
        if self._neo_learns:
            work = _gpu_work(plan)
            self.neo.observe_gpu(work.tokens + carried, work.context, step)
        self._apply_gpu(plan, rows, done)
        if self.on_step is not None:
            self.on_step({"kind": "gpu", "step_seconds": step, "beside": beside,
                          "overlap": overlap,
                          "seconds": self.clock() - (t0 if t_round is None else t_round),
                          **gpu_step_work(batch, carried).as_dict()})

    def _apply_gpu(self, plan: GpuPlan, rows: list[StepRow], done) -> None:
        now = self.clock()
        for m in plan.swap_out:
            m.req.in_flight = None
            m.req.ready = True
            self.metrics.inc("dualpace:kv_migrations_total", kind="swap-out")
        for m in plan.swap_in:
            m.req.in_flight = None
            self.state.host_pool.free(m.req.pending_free)
            m.req.pending_free = []
            self.metrics.inc("dualpace:kv_migrations_total", kind="swap-in")
        lps = done.logprobs or [None] * len(done.tokens)
        plps = done.prompt_logprobs or [[]] * len(done.tokens)
        for row, token, lp, plp in zip(rows, done.tokens, lps, plps):
            r = row.req
            r.in_flight = None
            if r.finished:  # meanwhile: with async scheduling, by the step before this one
                self.metrics.inc("dualpace:async_dropped_tokens_total")
                continue
            if plp and not r.prompt_logprobs_done:
                r.prompt_lps.extend(plp[:len(r.prompt) - 1 - len(r.prompt_lps)])
            if row.kind == "prefill":
                self.metrics.inc("dualpace:prompt_tokens_total", row.tokens)
                r.computed += row.tokens
                if r.computed < r.num_tokens:
                    self._settle_abort(r)
                    continue
                r.phase = Phase.DECODE
                self._forked(r, row.forks)
            elif row.kind == "to_cpu":
                self.metrics.inc("dualpace:prompt_tokens_total", r.num_tokens)
                self.metrics.inc("dualpace:kv_migrations_total", kind="prefill-to-cpu")
                r.computed = r.num_tokens
                r.ready = True
                self._forked(r, row.forks)
            else:
                r.computed = r.num_tokens
            self._append_token(r, token, "gpu", now, lp)
        for m in plan.swap_out + plan.swap_in:
            self._settle_abort(m.req)
        self._update_cpu_readiness(now)  # swap-outs and Prefill-to-CPU became ready

    def _forked(self, r: EngineRequest, forks: tuple[EngineRequest, ...]) -> None:
        """``r``'s prompt KV is now in its siblings' blocks: each decodes on its own from the
        prompt's last position, which its first step recomputes (so it samples from its own
        seed with the same logits). They share the prompt's logprobs."""
        for f in forks:
            f.in_flight = None
            f.awaiting_fork = False
            self.metrics.inc("dualpace:kv_migrations_total",
                             kind="fork-gpu" if f.owner is Owner.GPU else "fork-cpu")
            f.computed = len(f.prompt) - 1
            f.prompt_lps = list(r.prompt_lps)
            if f.owner is Owner.GPU:
                f.phase = Phase.DECODE
            else:
                f.ready = True
            self._settle_abort(f)
        r.forks = []

    def _orphan_forks(self, r: EngineRequest) -> None:
        """``r`` ended before its prompt's KV was copied (an abort mid-prefill): its siblings
        go back to the head of the GPU waiting queue to prefill themselves."""
        st = self.state
        for f in reversed(r.forks):
            if f.finished:
                continue
            if f.blocks:  # admitted with r: its blocks hold nothing yet
                (st.gpu_pool if f.owner is Owner.GPU else st.host_pool).free(f.blocks)
                for q in (st.gpu_running, st.cpu_waiting):
                    if f in q:
                        q.remove(f)
            f.blocks, f.computed, f.awaiting_fork = [], 0, False
            f.owner, f.phase, f.ready = Owner.GPU, Phase.WAITING, True
            st.gpu_waiting.appendleft(f)
        r.forks = []

    # --- the CPU engine -----------------------------------------------------------------------
    async def _cpu_loop(self) -> None:
        while True:
            await self.workers.available.wait()
            t_round = self.clock()
            plan = cpu_round(self.state)
            self._after_round("cpu", plan)
            if plan.recomputed:  # preempted back to the GPU waiting queue
                self._gpu_wake.set()
            if not plan.batch:
                await self._sleep(self._cpu_wake)
                continue
            try:
                done = await self._cpu_step(plan.batch)
            except Exception as e:
                done = e
            self._apply_cpu(plan.batch, done)
            self._log_cpu_step(t_round)
            self._wake()

    def _log_cpu_step(self, t_round: float | None) -> None:
        """The CPU step's record, timed from its round's start (its own loop) or as the
        worker round trip alone (the gated pipeline: the GPU step's record has the round)."""
        rec, self._cpu_record = self._cpu_record, None
        if rec is not None and self.on_step is not None:
            rec["seconds"] = (rec["step_seconds"] if t_round is None
                              else self.clock() - t_round)
            self.on_step(rec)

    async def _cpu_step(self, reqs: list[EngineRequest], route: str = "",
                        split: int = 0):
        self._introduce("cpu", reqs)
        for r in reqs:
            r.in_flight = "cpu"
        batch = self.wire.cpu_batch(next(self._steps), reqs, route, split)
        t0 = self.clock()
        snap = self._overlap.begin("cpu")
        try:
            done = await self.workers.cpu.step(batch)
        finally:
            beside, overlap = self._overlap.end("cpu", snap)
        if self.on_step is not None:
            self._cpu_record = {"kind": "cpu", "step_seconds": self.clock() - t0,
                                "beside": beside, "overlap": overlap,
                                "attention": done.attn_us * 1e-6,
                                **cpu_step_work(batch, done.route).as_dict()}
        # Eq. 1 compares GPU linear time with CPU *attention* time: the worker reports it.
        if self._neo_learns:
            self.neo.observe_cpu(sum(r.num_tokens for r in reqs), done.attn_us * 1e-6)
        return done

    def _apply_cpu(self, reqs: list[EngineRequest], done) -> None:
        if isinstance(done, BaseException):
            self._step_failed(reqs, done)
            return
        now = self.clock()
        if done.assist_calls:
            self.metrics.inc("dualpace:dense_assist_calls_total", done.assist_calls,
                             route=done.route)
        emitted = False
        lps = done.logprobs or [None] * len(done.tokens)
        for r, token, lp in zip(list(reqs), done.tokens, lps):
            r.in_flight = None
            r.computed = r.num_tokens
            emitted |= self._append_token(r, token, "cpu", now, lp)
        if emitted:  # one emission per CPU step: Figure 1's curve rises once per step
            gap = self.stall.emitted(now)
            if gap is not None:
                self.metrics.observe("dualpace:cpu_tier_stall_seconds", gap)
        self._update_cpu_readiness(now)

    # --- the gated (NEO-style) baseline ------------------------------------------------------
    async def _gated_loop(self) -> None:
        """One clock: each GPU iteration may carry CPU-resident decodes, admitted only while
        NEO's overlap conditions (Eq. 1) hold and the pipeline beats GPU-only; their
        attention runs on the CPU worker, every dense stage on the GPU worker between its
        own stage tasks, in two sub-batches (asymmetric pipelining)."""
        while True:
            await self.workers.available.wait()
            t_round = self.clock()
            plan = gpu_round(self.state)
            self._after_round("gpu", plan)
            sel = self._gated_selection(plan)
            if plan.empty and not sel.cpu:
                await self._sleep(self._gpu_wake)
                continue
            await self._run_gpu(plan, sel.cpu, split=len(sel.sb0), t_round=t_round)
            st = self.state  # between iterations CPU-resident requests wait (swap-in-able)
            for r in reversed([r for r in st.cpu_running if not r.finished]):
                st.cpu_waiting.appendleft(r)
            st.cpu_running = []

    def _gated_selection(self, plan: GpuPlan):
        """NEO's admission (cost_model.neo_select) over the ready CPU-waiting decodes. The
        chosen requests are committed here, synchronously: in flight on the CPU tier and
        introduced to its worker before any other task runs, so an abort that arrives before
        the step is dispatched waits for the step instead of releasing them under it."""
        st = self.state

        def fits(r: EngineRequest, chosen: list[EngineRequest]) -> bool:
            return st.host_fits(growth=sum(c.growth_blocks() for c in chosen)
                                + r.growth_blocks())

        candidates = [r for r in st.cpu_waiting if r.ready and not r.finished
                      and not r.in_flight]
        gpu = _gpu_work(plan)
        sel = neo_select(self.neo, gpu, candidates, lambda r: r.num_tokens,
                         st.limits.cpu_batch_limit, fits)
        st.cpu_head_claim = 0
        if not sel.cpu and gpu.tokens == 0:
            sel = self._gated_liveness(candidates)
        for r in sel.cpu:
            st.cpu_waiting.remove(r)
            r.blocks += st.host_pool.allocate(r.blocks_for_next())
        st.cpu_running = list(sel.cpu)  # finishing requests leave it while the step applies
        self._introduce("cpu", sel.cpu)
        for r in sel.cpu:
            r.in_flight = "cpu"
        return sel

    def _gated_liveness(self, candidates: list[EngineRequest]) -> NeoSelection:
        """No GPU work and no CPU decode that fits Eq. 2: the host KV is full of waiting
        requests, each a token short of a block, and the GPU cannot take them (a prompt
        longer than its pool waits for Prefill-to-CPU, which needs host blocks). NEO's
        admission (neo_select's own liveness rule runs the FIFO head alone only if it fits)
        would then wait for ever: a simulated sweep here stalled so at 16 req/s (gated, 200
        requests, 8192 host blocks full with 107 waiting decodes). As the CPU round does
        (cpu_round.make_room_for_head), the youngest waiting requests are recompute-
        preempted until the first ready one fits, and it runs alone."""
        sel = NeoSelection()
        head = next((r for r in candidates if not r.swap_in_mark), None)
        if head is None or make_room_for_head(self.state, head) is None:
            return sel
        sel.sb1, sel.adopted = [head], True
        return sel

    # --- shared helpers ----------------------------------------------------------------------
    def _introduce(self, kind: str, reqs: list[EngineRequest]) -> None:
        group = self.workers.gpu if kind == "gpu" else self.workers.cpu
        for msg in self.wire.introductions(kind, reqs):
            group.send(msg)

    def _append_token(self, r: EngineRequest, token: int, engine: str, now: float,
                      logprobs=None) -> bool:
        """Appends ``token`` to ``r`` unless an abort is pending; True if it was appended.
        ``logprobs``: the sampling worker's, passed through to the stream untouched."""
        if r.abort_requested:
            self._finish(r, r.abort_requested)
            return False
        r.out.append(token)
        if r.first_token_time is None:
            r.first_token_time = now
            self.metrics.observe("dualpace:time_to_first_token_seconds", now - r.arrival)
        elif r.token_times:
            self.metrics.observe("dualpace:inter_token_latency_seconds", now - r.token_times[-1])
        r.token_times.append(now)
        self.metrics.inc("dualpace:generation_tokens_total", engine=engine)
        if self.trace is not None:
            self.trace.append((now, engine, r.rid))
        reason = None
        if token in r.params.stop_token_ids or (not r.params.ignore_eos and token in self.eos_ids):
            reason = "stop"
        elif len(r.out) >= r.max_tokens:
            reason = "length"
        # The prompt's logprobs travel with the first output token.
        plps = r.prompt_lps if len(r.out) == 1 and r.params.prompt_logprobs is not None else None
        if reason:
            self._finish(r, reason, new=[token], logprobs=[logprobs], prompt_logprobs=plps)
        else:
            self._events.put_nowait(TokenEvent(r.rid, [token], logprobs=[logprobs],
                                               prompt_logprobs=plps))
        return True

    # --- CPU-tier stalls (Figure 1) ------------------------------------------------------------
    def _cpu_tier_ready(self) -> bool:
        """Some CPU-resident request could decode now: KV on the host, no transfer into the
        host pool in flight, not finished. Short-circuits on the first ready request."""
        st = self.state
        return (any(r.ready and not r.finished for r in st.cpu_running)
                or any(r.ready and not r.finished for r in st.cpu_waiting))

    def _update_cpu_readiness(self, now: float | None = None) -> None:
        self.stall.set_ready(self.clock() if now is None else now, self._cpu_tier_ready())

    def _collect_stall(self, close_window: bool) -> None:
        self.metrics.set("dualpace:cpu_tier_longest_stall_seconds",
                         self.stall.window_max(self.clock(), close_window))

    def _settle_abort(self, r: EngineRequest) -> None:
        if r.abort_requested and not r.in_flight and not r.finished:
            self._finish(r, r.abort_requested)

    def _finish(self, r: EngineRequest, reason: str, error: str | None = None,
                new: list[int] | None = None, release: bool = True,
                logprobs: list | None = None, prompt_logprobs: list | None = None) -> None:
        if r.finished:
            return
        st = self.state
        r.phase = Phase.FINISHED
        r.finish_reason = reason
        for q in (st.gpu_running, st.cpu_running):
            if r in q:
                q.remove(r)
        for dq in (st.gpu_waiting, st.cpu_waiting):
            if r in dq:
                dq.remove(r)
        if release:
            pool = st.gpu_pool if r.owner is Owner.GPU else st.host_pool
            pool.free(r.blocks)
            st.host_pool.free(r.pending_free)
            self._orphan_forks(r)
        r.blocks, r.pending_free = [], []
        if release:
            for kind, msg in self.wire.releases(r):
                group = self.workers.gpu if kind == "gpu" else self.workers.cpu
                group.send(msg)
        self.requests.pop(r.rid, None)
        if self.on_request is not None and r.token_times:
            self.on_request({"kind": "request", "t": round(self.clock(), 4),
                             "arrival": round(r.arrival, 6), "prompt_tokens": len(r.prompt),
                             "tokens": [round(t - r.arrival, 6) for t in r.token_times]})
        self.metrics.inc("dualpace:request_success_total", finished_reason=reason)
        self.metrics.observe("dualpace:e2e_request_latency_seconds",
                             self.clock() - r.arrival)
        self._events.put_nowait(TokenEvent(r.rid, new or [], finish_reason=reason, error=error,
                                           logprobs=logprobs or [None] * len(new or []),
                                           prompt_logprobs=prompt_logprobs))
        if r.owner is Owner.CPU:
            self._update_cpu_readiness()
        self._wake()

    def _step_failed(self, reqs: list[EngineRequest], exc: BaseException) -> None:
        log.error("step failed: %r", exc)
        for r in reqs:
            r.in_flight = None
            self._finish(r, "abort", error=str(exc))

    def _after_round(self, kind: str, plan) -> None:
        st = self.state
        self.metrics.set("dualpace:num_requests_running", len(st.gpu_running), engine="gpu")
        self.metrics.set("dualpace:num_requests_running", len(st.cpu_running), engine="cpu")
        self.metrics.set("dualpace:num_requests_waiting",
                         len(st.gpu_waiting) + len(st.cpu_waiting))
        self.metrics.set("dualpace:num_requests_waiting_by_engine", len(st.gpu_waiting),
                         engine="gpu")
        self.metrics.set("dualpace:num_requests_waiting_by_engine", len(st.cpu_waiting),
                         engine="cpu")
        self.metrics.set("dualpace:kv_blocks_used", st.gpu_pool.num_used, tier="gpu")
        self.metrics.set("dualpace:kv_blocks_used", st.host_pool.num_used, tier="cpu")
        self._update_cpu_readiness()
        if self.on_round is not None:
            self.on_round(self, kind, plan)

    def _wake(self) -> None:
        self._gpu_wake.set()
        self._cpu_wake.set()

    @staticmethod
    async def _sleep(event: asyncio.Event) -> None:
        event.clear()
        await event.wait()

    # --- the completion loop -----------------------------------------------------------------
    async def _completion_loop(self) -> None:
        while True:
            ev = await self._events.get()
            self._deliver(ev)

    def _flush_events(self) -> None:
        while not self._events.empty():
            self._deliver(self._events.get_nowait())

    def _deliver(self, ev: TokenEvent) -> None:
        stream = self.streams.get(ev.rid)
        if stream is None:
            return
        delta, stop_hit = stream.process(ev)
        if stop_hit:
            self.abort(ev.rid, "stop")
        if delta is not None:
            stream.queue.put_nowait(delta)
            if delta.finished:
                self.streams.pop(ev.rid, None)
