"""Mutation check of the suite: plant one defect at a time in the package, run the tests
that should catch it, and report whether they failed (they must). Not collected by pytest;
run by hand from the repository root:

    .venv/bin/python tests/planted_defects.py [--only ID ...] [--json]

Every plant is a literal text replacement that must match exactly once, so a refactor that
moves the code makes the plant fail loudly instead of silently testing nothing. The source
file is restored after each run, also on Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Plant:
    id: str
    what: str
    file: str
    old: str
    new: str
    tests: tuple[str, ...]


ATTN_TEST = "tests/kernels/test_paged_attention.py::"
THREADS_TEST = ("tests/kernels/test_native_stages.py::"
                "test_dense_stages_do_not_depend_on_the_thread_count")
CHUNK_TEST = ("tests/kernels/test_native_stages.py::"
              "test_prefill_chunks_take_the_gemm_stages_and_match_torch")

PLANTS = [
    Plant("cpu-admits-unready", "the CPU round admits a request whose KV is still in flight",
          "dualpace/engine/cpu_round.py", "        if not r.ready or r.swap_in_mark:",
          "        if r.swap_in_mark:", ("tests/engine/test_scheduler_properties.py",)),
    Plant("spurious-output-error", "a request that finishes normally carries an error",
          "dualpace/engine/llm_engine.py", "self._finish(r, reason, new=[token], logprobs",
          'self._finish(r, reason, error="x", new=[token], logprobs',
          ("tests/engine/test_scheduler_properties.py",)),
    Plant("draining-still-admits", "a draining server admits new requests",
          "dualpace/server/app.py", "        if self.draining:\n            raise APIError",
          "        if False:\n            raise APIError",
          ("tests/server/test_robustness.py::test_sigterm_drains_and_notifies",)),
    Plant("futex-wait-ignores-timeout", "a futex wait with a timeout returns at once",
          "dualpace/kernels/futex.py",
          "        rc = self._lib.dp_futex_wait(self._addr, expected, _timeout_ns(timeout))",
          "        rc = self._lib.dp_futex_wait(self._addr, expected + 1, 0)",
          ("tests/kernels/test_futex.py",)),
    Plant("notify-blocks", "the systemd notify send blocks on a full receiver queue",
          "dualpace/server/systemd.py", "                           | socket.SOCK_NONBLOCK) as s:",
          "                           ) as s:", ("tests/server/test_systemd_notify.py",)),
    Plant("assist-logprobs-dropped", "the CPU side of a Dense Assist call drops the logprobs "
          "the GPU side sampled", "dualpace/runtime/assist.py",
          "        if all(k < 0 for k in ks):", "        if True:",
          ("tests/server/test_logprobs.py::test_completion_logprobs_from_both_tiers",)),
    Plant("assist-penalties-dropped", "penalized rows reach a Dense Assist call without their "
          "penalties", "dualpace/runtime/assist.py",
          "for i, r in enumerate(rows) if r.penalties]",
          "for i, r in enumerate(rows) if r.penalties and False]",
          ("tests/server/test_penalties.py::test_penalties_token_exact_on_both_tiers",)),
    Plant("penalty-order", "the repetition penalty divides negative logits too",
          "dualpace/sampling/penalties.py", "torch.where(v > 0, v / p.repetition, "
          "v * p.repetition)", "v / p.repetition", ("tests/sampling/test_penalties.py",)),
    Plant("sweep-by-pid-only", "the stale sweep trusts a pid whatever its start time",
          "dualpace/runtime/shm.py",
          "    return process_start_time(pid) == start",
          "    return process_start_time(pid) is not None",
          ("tests/runtime/test_stale_sweep.py",)),
    Plant("prompt-logprobs-shifted", "prompt logprobs are taken one position late",
          "dualpace/runtime/gpu_worker.py",
          "            first = last[j] - len(s.token_ids) + 1",
          "            first = last[j] - len(s.token_ids) + 2",
          ("tests/server/test_logprobs.py::test_prompt_logprobs_field",)),
    Plant("finish-leaks-swap-source", "a finished request's in-flight swap-in source blocks "
          "are never freed", "dualpace/engine/llm_engine.py",
          "            st.host_pool.free(r.pending_free)\n", "            pass\n",
          ("tests/engine/test_scheduler_properties.py::"
           "test_every_request_ends_finished_with_its_blocks_returned",
           "tests/engine/test_abort.py")),
    Plant("abort-under-a-running-step", "abort finishes a request inside a submitted step "
          "(its blocks are freed under the step)", "dualpace/engine/llm_engine.py",
          "        if r.in_flight:\n            r.abort_requested",
          "        if False:\n            r.abort_requested",
          ("tests/engine/test_abort.py",
           "tests/engine/test_e2e_policies.py::test_abort_mid_step_with_real_workers")),
    Plant("assist-failure-swallowed", "a GPU-side Dense Assist failure returns instead of "
          "raising", "dualpace/runtime/assist.py",
          "        if failed:\n            raise AssistFailed",
          "        if False:\n            raise AssistFailed",
          ("tests/runtime/test_assist_handshake.py",)),
    Plant("attention-scale", "the CPU attention kernel is called with a 0.1% wrong scale",
          "dualpace/kernels/cpu.py", "float(scale), isa_code", "float(scale) * 1.001, isa_code",
          ("tests/kernels/test_paged_attention.py",)),
    Plant("kv-write-slot", "the torch KV write puts every token one row late",
          "dualpace/kv/cache.py", "    offsets = slots - blocks * bs\n",
          "    offsets = (slots - blocks * bs + 1) % bs\n",
          ("tests/kernels/test_kv_copy.py",)),
    Plant("migration-drops-last-block", "a KV migration copies one block too few",
          "dualpace/runtime/gpu_worker.py", "        nb = -(-m.num_tokens // self.block_size)\n",
          "        nb = max(1, -(-m.num_tokens // self.block_size) - 1)\n",
          ("tests/runtime/test_workers_e2e.py::test_host_kv_after_prefill_to_cpu_and_a_swap_"
           "round_trip_equals_transformers",)),
    Plant("fused-assist-miscounted", "Fused-Assist does not count its per-layer calls",
          "dualpace/runtime/cpu_worker.py",
          "                hidden = self._assist(OP_POST_ATTN, i, hidden, attn, None)\n"
          "                calls += 1\n",
          "                hidden = self._assist(OP_POST_ATTN, i, hidden, attn, None)\n",
          ("tests/runtime/test_workers_e2e.py::test_prefill_to_cpu_then_each_route",)),
    Plant("loadgen-no-arrivals", "the load generator sends every request at once",
          "bench/loadgen.py",
          "        await asyncio.sleep(max(0.0, offsets[i] - (time.perf_counter() - t_start)))",
          "        await asyncio.sleep(0)", ("tests/bench/test_loadgen.py",)),
    Plant("shm-segment-leak", "instance cleanup leaves its first segment behind",
          "dualpace/runtime/shm.py", "        for seg in self.segments:\n            seg.unlink()",
          "        for seg in self.segments[1:]:\n            seg.unlink()",
          ("tests/runtime/test_faults.py",)),
    Plant("sse-error-dropped", "a stream whose request failed ends without an error event",
          "dualpace/server/app.py", "                if d.error:\n                    await resp",
          "                if False:\n                    await resp",
          ("tests/server/test_failures.py::"
           "test_worker_killed_mid_stream_then_the_group_restarts",)),
    Plant("restart-unbounded", "the supervisor ignores --max-restarts",
          "dualpace/runtime/supervisor.py",
          "        if self.restarts > self.config.max_restarts:",
          "        if self.restarts > self.config.max_restarts + 100:",
          ("tests/server/test_failures.py::"
           "test_restart_bound_makes_the_server_unavailable_and_exit_nonzero",)),
    Plant("drain-never-cuts", "SIGTERM's drain timeout does not abort the live requests",
          "dualpace/server/serve.py", "            serving.abort_all()", "            pass",
          ("tests/server/test_failures.py::"
           "test_drain_timeout_cuts_a_long_request_and_exits_zero",)),
    Plant("tp-no-all-reduce", "tensor-parallel ranks skip the all-reduce",
          "dualpace/runtime/worker_main.py", "            dist.all_reduce(t)\n",
          "            pass\n",
          ("tests/server/test_failures.py::"
           "test_tensor_parallel_server_gives_the_single_rank_tokens",)),
    Plant("ring-no-wrap-marker", "the ring writer skips to the start without a wrap marker",
          "dualpace/runtime/ring.py", "            _LEN.pack_into(self._data, pos, _WRAP)\n",
          "            pass\n",
          ("tests/runtime/test_placement_and_ring.py::test_ring_wraps_around_and_keeps_order",)),
    Plant("cores-reversed-range", "--cpu-cores accepts a reversed range such as 5-2",
          "dualpace/runtime/placement.py", "                if hi < lo:",
          "                if False:",
          ("tests/runtime/test_placement_and_ring.py",)),
    Plant("eq1-wrong-sub-batch", "Eq. 1's first margin subtracts sub-batch 0's CPU attention",
          "dualpace/engine/cost_model.py", "    return (t0_lin - m.t_ca(ctx1),",
          "    return (t0_lin - m.t_ca(ctx0),", ("tests/engine/test_cost_model.py",)),
    Plant("gated-without-forced-route", "the gated policy stops forcing the NEO pipeline",
          "dualpace/engine/policy.py", "forced_route=NEO_PIPELINE)", 'forced_route="")',
          ("tests/test_resolved_config.py",
           "tests/engine/test_e2e_policies.py::"
           "test_policy_outputs_match_transformers[gated-neo-pipeline]")),
    Plant("swap-in-table-diff", "after a swap-in the translator thinks the GPU worker knows "
          "no blocks (the next decode re-sends the table as a diff)",
          "dualpace/runtime/translator.py",
          '            self._known["gpu"][m.req.rid] = len(m.dst)',
          '            self._known["gpu"][m.req.rid] = 0',
          ("tests/engine/test_scheduler_properties.py",)),
    Plant("staging-without-rows", "the resolved staging area lacks the per-row rounding blocks",
          "dualpace/resolved.py", "               + config.max_num_seqs)", "               )",
          ("tests/test_resolved_config.py",)),
    Plant("scheduler-imports-transport", "the scheduler's request module imports msgspec",
          "dualpace/engine/request.py", "import enum\n", "import enum\n\nimport msgspec  # noqa\n",
          ("tests/engine/test_torch_free.py",)),
    Plant("fork-gpu-copy-skips-v", "the GPU-pool fork copies K but not V into the siblings",
          "dualpace/runtime/gpu_worker.py",
          "                    self.ops.copy_within(self.kv.v[i], src, f.blocks[:nb])",
          "                    pass",
          ("tests/server/test_parallel_sampling.py::"
           "test_seeded_choices_equal_lone_requests_with_seed_plus_j",)),
    Plant("fork-host-copy-missing", "Prefill-to-CPU fills the first request's host blocks "
          "only, not its siblings'", "dualpace/runtime/gpu_worker.py",
          "                    for dst in [s.host_blocks, *(f.blocks for f in s.forks)]:",
          "                    for dst in [s.host_blocks]:",
          ("tests/server/test_parallel_sampling.py::"
           "test_seeded_choices_equal_lone_requests_with_seed_plus_j",)),
    Plant("fork-sibling-not-in-flight", "a sibling whose blocks the forking step fills can be "
          "aborted (and its blocks reused) under the step", "dualpace/engine/llm_engine.py",
          "        involved += [f for row in rows for f in row.forks]\n", "",
          ("tests/engine/test_parallel_sampling.py",)),
    Plant("fork-orphans-lost", "siblings of a request aborted mid-prefill are never requeued",
          "dualpace/engine/llm_engine.py", "            self._orphan_forks(r)\n", "",
          ("tests/engine/test_parallel_sampling.py",)),
    Plant("fork-same-seed", "every sample of a group uses the request's seed",
          "dualpace/engine/llm_engine.py", "_int64(seed + i),", "_int64(seed),",
          ("tests/engine/test_parallel_sampling.py",)),
    Plant("sim-clock-overshoots", "the virtual clock advances past the next timer",
          "dualpace/sim/loop.py", "        self.now += max(timeout, 0.0)",
          "        self.now += max(timeout, 0.0) * 1.5", ("tests/sim/test_simulator.py",)),
    Plant("sim-cpu-bandwidth-uncapped", "the CPU roofline ignores what the cores can stream",
          "dualpace/sim/costs.py",
          "        return min(c.dram_gbps, c.cores * c.per_core_gbps) * 1e9 * c.eff_mem",
          "        return c.dram_gbps * 1e9 * c.eff_mem", ("tests/sim/test_simulator.py",)),
    Plant("sim-fit-beside-ignored", "simulated GPU steps never use the fit for steps run "
          "beside the CPU worker", "dualpace/sim/costs.py",
          "        return self.gpu_beside if beside and self.gpu_beside else self.gpu",
          "        return self.gpu", ("tests/sim/test_simulator.py",)),
    Plant("step-work-forks-uncounted", "a Prefill-to-CPU step's copies into siblings' host "
          "blocks cost nothing on the host link", "dualpace/runtime/step_work.py",
          "            link += n * (1 + len(s.forks))", "            link += n",
          ("tests/sim/test_simulator.py",)),
    Plant("step-log-never-beside", "the step log never marks a step as run beside the other "
          "worker", "dualpace/engine/step_overlap.py",
          "beside = int(snap.busy or self.started[o] != snap.started or self.in_flight[o] > 0)",
          "beside = 0", ("tests/sim/test_simulator.py",)),
    Plant("overlap-counts-from-zero", "a step's overlap counts the other group's busy time "
          "since the start, not since the step began", "dualpace/engine/step_overlap.py",
          "        overlap = max(0.0, self.busy_time(o) - snap.busy_time)",
          "        overlap = self.busy_time(o)", ("tests/sim/test_contention.py",)),
    Plant("overlap-open-interval-dropped", "the other group's step still in flight adds "
          "nothing to a step's overlap", "dualpace/engine/step_overlap.py",
          "open_part = self.clock() - self._busy_since[kind] if self.in_flight[kind] else 0.0",
          "open_part = 0.0", ("tests/sim/test_contention.py",)),
    Plant("sim-contention-unfitted", "the step-cost fit never has a contention term",
          "dualpace/sim/costs.py",
          "    return bool(samples) and measured and not any(",
          "    return False and measured and not any(", ("tests/sim/test_contention.py",)),
    Plant("overlap-share-as-seconds", "the contention fit takes a step's overlap seconds for "
          "its share of the step", "dualpace/sim/costs.py",
          'return min(1.0, record[OVERLAP] / record["step_seconds"])',
          "return min(1.0, record[OVERLAP])", ("tests/sim/test_contention.py",)),
    Plant("steal-counts-guest-twice", "the steal share's total counts guest time a second "
          "time", "bench/common.py", "    total = sum(delta[:8])", "    total = sum(delta)",
          ("tests/bench/test_steal_fraction.py",)),
    Plant("jitter-bins-by-prediction", "the jitter tables are cut on the contended "
          "prediction while simulated steps look them up by their time alone",
          "dualpace/sim/costs.py", "    size = predicted if size is None else size",
          "    size = predicted", ("tests/sim/test_jitter.py",)),
    Plant("jitter-ranks-ignored", "the simulated steps draw their jitter independently of the "
          "measured steps' order", "dualpace/sim/costs.py",
          "ranks = self._ranks[key] = decode_ranks(jitter)", 'ranks = self._ranks[key] = b""',
          ("tests/sim/test_jitter.py",)),
    Plant("jitter-spell-never-ends", "the jitter walk replays one stretch of the log forever",
          "dualpace/sim/costs.py",
          "        if at is None or self.rng.random() * JITTER_SPELL < 1.0:",
          "        if at is None:", ("tests/sim/test_jitter.py",)),
    Plant("jitter-ranks-across-bins", "a measured step's rank is its place among all steps, "
          "not in its own bin", "dualpace/sim/costs.py",
          "        order = np.argsort(ratio[in_bin], kind=\"stable\")",
          "        order = np.argsort(ratio, kind=\"stable\")[:in_bin.sum()]",
          ("tests/sim/test_jitter.py",)),
    Plant("jitter-walks-shared", "GPU and CPU steps advance one walk through the logs",
          "dualpace/sim/costs.py", "        key = id(jitter)", "        key = 0",
          ("tests/sim/test_jitter.py",)),
    Plant("jitter-seed-ignores-rate", "every point of a simulated sweep replays the same "
          "stretch of the measured logs", "dualpace/sim/run.py",
          '@{rate}"', '"',
          ("tests/sim/test_jitter.py",)),
    Plant("quiet-ignores-threshold", "--max-steal counts every measured point as quiet",
          "bench/compare_policies.py", "steal is not None and steal <= max_steal",
          "steal is not None", ("tests/bench/test_compare_repeat.py",)),
    Plant("unmeasured-point-quiet", "a point that did not measure its steal counts as quiet",
          "bench/compare_policies.py", "steal is not None and steal <= max_steal",
          "steal is None or steal <= max_steal", ("tests/bench/test_compare_repeat.py",)),
    Plant("median-takes-noisy-points", "--max-steal leaves the per-rate median as it was",
          "bench/compare_policies.py", "median[p].append(median_run(calm or points))",
          "median[p].append(median_run(points))", ("tests/bench/test_compare_repeat.py",)),
    Plant("profile-fits-noisy-steps", "--max-steal fits the step costs to every step",
          "bench/compare_policies.py",
          "                    records = _quiet_steps(records, runs.get(p, []), max_steal, log)",
          "                    pass", ("tests/bench/test_compare_repeat.py",)),
    Plant("step-log-untimed", "the step log's records carry no time",
          "dualpace/engine/serving.py", '"t": round(time.monotonic(), 4)', '"t": None',
          ("tests/engine/test_step_log_time.py",)),
    Plant("sim-repeat-one-seed", "compare_policies --simulate --repeat runs one jitter seed "
          "N times", "bench/compare_policies.py",
          "simulate_policy(model, p, jobs, args, profile, args.seed + i)",
          "simulate_policy(model, p, jobs, args, profile, args.seed)",
          ("tests/bench/test_compare_sim_repeat.py",)),
    Plant("contention-always-on", "the step-cost fit models shared cores unasked",
          "dualpace/sim/costs.py", "    contention = contention and contention_fit(samples)",
          "    contention = contention_fit(samples)", ("tests/sim/test_contention.py",)),
    Plant("profile-contended-ignored", "simulating with --contention takes the plain fits",
          "dualpace/sim/costs.py",
          '    key = "step_costs_contended" if contended else "step_costs"',
          '    key = "step_costs"', ("tests/sim/test_contention.py",)),
    Plant("busy-intervals-not-united", "a group's busy time counts each of its steps "
          "alone, so two in flight at once count twice", "dualpace/engine/step_overlap.py",
          "        if not self.in_flight[kind]:\n            self._busy_total",
          "        if True:\n            self._busy_total", ("tests/sim/test_contention.py",)),
    Plant("contention-fit-on-gated", "the gated pipeline's logs get a contention term",
          "dualpace/sim/costs.py", "    return bool(samples) and measured and not any(",
          "    return bool(samples) and measured or not any(",
          ("tests/sim/test_contention.py",)),
    Plant("slowdown-uncapped", "a fitted fraction of pace lost is used above its ceiling",
          "dualpace/sim/costs.py", "min(c.get(OVERLAP, 0.0), MAX_LOST))",
          "c.get(OVERLAP, 0.0))", ("tests/sim/test_contention.py",)),
    Plant("sim-cancel-keeps-running", "a simulated step cancelled midway keeps sharing the "
          "cores", "dualpace/sim/workers.py",
          "            if self.running[kind] is r:  # cancelled mid-step (the engine stopping)",
          "            if False:", ("tests/sim/test_contention.py",)),
    Plant("jitter-seed-ignored", "simulate's jitter seed never reaches the draws",
          "dualpace/sim/run.py",
          'f"{seed if jitter_seed is None else jitter_seed}@{rate}"', 'f"{seed}@{rate}"',
          ("tests/sim/test_jitter.py",)),
    Plant("proc-stat-truncated", "the host's CPU times stop before the steal field",
          "bench/common.py", "            return [int(x) for x in f.readline().split()[1:]]",
          "            return [int(x) for x in f.readline().split()[1:5]]",
          ("tests/bench/test_steal_fraction.py",)),
    Plant("contention-hardware-accepted", "simulate --contention with --hardware runs "
          "without a word", "dualpace/sim/cli.py",
          "    if args.contention and not args.profile:", "    if False:",
          ("tests/sim/test_simulator.py",)),
    Plant("sim-slowdown-inverted", "the fitted fraction of pace lost is used as the slowdown "
          "itself", "dualpace/sim/costs.py",
          "        return 1.0 / (1.0 - min(c.get(OVERLAP, 0.0), MAX_LOST))",
          "        return 1.0 + min(c.get(OVERLAP, 0.0), MAX_LOST)",
          ("tests/sim/test_contention.py",)),
    Plant("sim-pace-always-alone", "simulated steps beside each other keep their pace alone",
          "dualpace/sim/workers.py",
          "        return 1.0 / r.slowdown if both else 1.0", "        return 1.0",
          ("tests/sim/test_contention.py",)),
    Plant("sim-finish-not-rescheduled", "when one simulated step ends, the other keeps its "
          "shared pace's finish time", "dualpace/sim/workers.py",
          "        self._next_finish()  # the step still running may now have the cores alone",
          "        pass", ("tests/sim/test_contention.py",)),
    Plant("usage-counts-every-sample", "usage counts a prompt once per sample",
          "dualpace/server/app.py",
          "        p = sum(s.num_prompt_tokens for s in streams if s.sample_index == 0)",
          "        p = sum(s.num_prompt_tokens for s in streams)",
          ("tests/server/test_parallel_sampling.py::"
           "test_seeded_choices_equal_lone_requests_with_seed_plus_j",)),
    Plant("fork-group-rows-uncounted", "a parallel-sampling group is admitted to HBM when "
          "only its first request's row is free", "dualpace/engine/gpu_round.py",
          "len(st.gpu_running) + b_new(plan) + len(group) <= st.limits.max_num_seqs",
          "len(st.gpu_running) + b_new(plan) + 1 <= st.limits.max_num_seqs",
          ("tests/engine/test_parallel_sampling.py",)),
    Plant("sim-disturbance-ignored", "Dense Assist's GPU time never reaches GPU-main",
          "dualpace/sim/workers.py", "            self.disturbance += c.gpu_disturbance",
          "            pass", ("tests/sim/test_simulator.py",)),
    Plant("staging-reused-before-copy", "a Prefill-to-CPU layer overwrites the staging buffer "
          "an earlier layer's host copy still reads", "dualpace/runtime/gpu_worker.py",
          "                self.copies.compute_waits(fences[i - StagingKV.BUFFERS])",
          "                pass", ("tests/runtime/test_async_copies.py",)),
    Plant("forward-before-swap-copies", "the forward runs without waiting for the step's "
          "swap copies (it reuses swapped-out blocks)", "dualpace/runtime/gpu_worker.py",
          "            if mig_fences:\n                self.copies.compute_waits(mig_fences[i])",
          "            if False:\n                pass", ("tests/runtime/test_async_copies.py",)),
    Plant("forward-waits-for-the-wrong-layer", "layer i of the forward waits only for the "
          "swaps' layer 0", "dualpace/runtime/gpu_worker.py",
          "                self.copies.compute_waits(mig_fences[i])",
          "                self.copies.compute_waits(mig_fences[0])",
          ("tests/runtime/test_async_copies.py",)),
    Plant("noise-device-dependent", "seeded noise comes from the device's own generator",
          "dualpace/sampling/sampler.py",
          "    return -torch.log(uniform_draws(keys, vocab, device))",
          "    return torch.empty((len(keys), vocab), dtype=torch.float64, device=device)"
          ".exponential_()",
          ("tests/sampling/test_sampler.py",)),
    Plant("stage-gate-unbounded", "the stage gate lets every stage run ahead of the device",
          "dualpace/runtime/stage_gate.py", "        while len(self._events) > self.depth:",
          "        while False:", ("tests/runtime/test_stage_gate.py",)),
    Plant("kv-sizing-ignores-others", "GPU KV sizing ignores memory held outside torch",
          "dualpace/runtime/gpu_memory.py",
          "    non_torch = max(0, (total - free) - torch_reserved)", "    non_torch = 0",
          ("tests/runtime/test_gpu_memory.py",)),
    Plant("install-keeps-cpu-torch-on-gpu", "a GPU box keeps a CPU torch build",
          "bin/install-torch", 'if [[ "$have" == *" cuda" ]]; then\n    echo "install-torch: '
          'keeping existing CUDA torch ${have% *}"\nelse',
          'if [[ -n "$have" ]]; then\n    echo "install-torch: keeping existing CUDA torch '
          '${have% *}"\nelse', ("tests/test_install_torch.py",)),
    Plant("triton-decode-reads-past-the-end", "Triton decode attends one token past each "
          "sequence", "dualpace/model/attention_triton.py",
          '    end = tl.minimum(last * BS, seq_len)  # this split',
          '    end = tl.minimum(last * BS, seq_len + 1)  # this split',
          ("tests/model/test_attention_triton.py",)),
    Plant("triton-merge-ignores-lse", "the split merge averages partial outputs unweighted",
          "dualpace/model/attention_triton.py",
          '    w = tl.where(sp_ok & (lse > float("-inf")), tl.exp(lse - m), 0.0)',
          '    w = tl.where(sp_ok & (lse > float("-inf")), 1.0, 0.0)',
          ("tests/model/test_attention_triton.py",)),
    Plant("triton-prefill-not-causal", "Triton prefill lets a row see later rows",
          "dualpace/model/attention_triton.py",
          "        s = tl.where((kpos[None, :] <= qpos[:, None]) & ok[None, :], s,",
          "        s = tl.where(ok[None, :], s,",
          ("tests/model/test_attention_triton.py",)),
    Plant("triton-key-tile-under-16", "the Triton key tile is one block however short "
          "(tl.dot's inner dimension under 16: the GPU compiler refuses it, the interpreter "
          "does not)", "dualpace/model/attention_triton.py",
          "    return max(DOT_K_MIN, triton.next_power_of_2(block_size))",
          "    return triton.next_power_of_2(block_size)",
          ("tests/model/test_triton_compiles_for_cuda.py",)),
    Plant("triton-tile-reads-its-first-block", "a key tile spanning several blocks reads "
          "every key's block id as its 16-key span's first", "dualpace/model/attention_triton.py",
          "    blk = tl.load(table_row_ptr + pos // BS, mask=ok, other=0).to(tl.int64)",
          "    blk = tl.load(table_row_ptr + (pos - pos % 16) // BS, mask=ok, other=0)"
          ".to(tl.int64)",
          ("tests/model/test_attention_triton.py",)),
    Plant("engine-pool-read-before-start", "the serving engine takes the GPU pool size from "
          "the config as it was before the runtime settled the CUDA worker's measurement",
          "dualpace/engine/serving.py",
          "        rt, mc = self.runtime, self.model_config\n        await rt.start()\n",
          "        rt, mc = self.runtime, self.model_config\n        cfg0 = self.config\n"
          "        await rt.start()\n        self.runtime.config = cfg0\n",
          ("tests/engine/test_llm_api.py::"
           "test_the_engine_takes_the_gpu_pool_the_runtime_settled",)),
    Plant("engine-takes-an-empty-pool", "the engine accepts a GPU pool of 0 blocks",
          "dualpace/engine/llm_engine.py", "        if gpu_blocks < 1 or host_blocks < 1:\n",
          "        if False:\n",
          ("tests/engine/test_llm_api.py::test_an_engine_without_a_gpu_pool_is_refused",)),
    Plant("prompts-always-prefill-to-cpu", "step 5 never admits a prompt to the GPU: every one "
          "goes Prefill-to-CPU (as with the empty pool the H200 run found)",
          "dualpace/engine/gpu_round.py",
          "        if (not to_cpu_mode and b.tokens >= 1 and need <= b.free",
          "        if (False and b.tokens >= 1 and need <= b.free",
          ("tests/bench/test_gpu_check.py::test_served_smoke_run_checks_the_tiers_and_the_stream",)),
    Plant("gpu-check-skips-dram-probe", "gpu_check's host facts measure no DRAM bandwidth",
          "bench/gpu_check.py",
          '        threads = sorted({t for t in (1, 4, 8, out["cores"]) if t <= out["cores"]})',
          "        threads = []",
          ("tests/bench/test_gpu_check.py::"
           "test_host_facts_name_the_isa_paths_and_the_bandwidth_by_threads",)),
    Plant("gpu-check-passes-without-cuda", "gpu_check passes on a box without CUDA",
          "bench/gpu_check.py", "    ok = cuda\n", "    ok = True\n",
          ("tests/bench/test_gpu_check.py::test_without_cuda_the_check_fails_and_runs_no_tests",)),
    Plant("worker-ignores-attention-backend", "the GPU worker builds its model with the "
          "default attention whatever was configured", "dualpace/runtime/worker_main.py",
          "                                attention_backend=cfg.attention_backend,\n",
          "",
          ("tests/model/test_attention_triton.py::test_served_by_a_gpu_worker_on_triton",)),
    Plant("replay-skips-swap-fences", "a decode step replayed from graphs does not wait for "
          "the step's swaps", "dualpace/runtime/gpu_worker.py",
          "            if mig_fences and g.per_stage and k > 0:",
          "            if False:", ("tests/runtime/test_async_copies.py",)),
    Plant("graph-padding-writes-block-0", "padding rows of a replayed batch write KV into "
          "block 0", "dualpace/runtime/decode_graphs.py",
          "        self.slot_mapping[lo:hi] = self.scratch_block * self.block_size",
          "        self.slot_mapping[lo:hi] = 0",
          ("tests/runtime/test_decode_graphs.py",)),
    Plant("threads-ignore-the-other-tier", "shared cores: a worker takes every core even "
          "while the other tier works", "dualpace/runtime/thread_share.py",
          "        n = self.own if self.peer.load() else self.total",
          "        n = self.total", ("tests/runtime/test_thread_share.py",)),
    Plant("shared-cores-never-used", "without a GPU the workers stay on their own share",
          "dualpace/runtime/worker_main.py",
          "    placement = pin_current_process(spec.all_cores or spec.cores)",
          "    placement = pin_current_process(spec.cores)",
          ("tests/runtime/test_thread_share.py",)),
    Plant("flashinfer-last-page-zero", "FlashInfer's page table says 0 tokens in a full "
          "last page", "dualpace/model/attention_flashinfer.py",
          "        last.append(n - (pages - 1) * block_size)",
          "        last.append(n % block_size)",
          ("tests/model/test_attention_flashinfer.py",)),
    Plant("backend-check-never-falls-back", "a backend that fails its start-up check is "
          "served anyway", "dualpace/model/attention_check.py",
          "        if reason is None:\n            return backend",
          "        if True:\n            return backend",
          ("tests/model/test_attention_flashinfer.py",
           "tests/model/test_attention_triton.py::"
           "test_start_up_check_passes_and_catches_a_broken_kernel")),
    Plant("gpu-decode-counts-the-embedding", "the GPU decode roofline counts the embedding "
          "table as read every step", "bench/gpu_decode.py",
          "    return (cfg.num_layers * per_layer + cfg.vocab_size * h) * itemsize",
          "    return (cfg.num_layers * per_layer + 2 * cfg.vocab_size * h) * itemsize",
          ("tests/bench/test_gpu_decode.py",)),
    Plant("graphs-ignore-enforce-eager", "--enforce-eager still captures CUDA graphs",
          "dualpace/resolved.py", "\n                     and not config.enforce_eager),",
          "),", ("tests/test_resolved_config.py",)),
    Plant("flashinfer-graph-not-replanned", "a decode graph on FlashInfer is replayed "
          "without planning its bucket's page table for the batch",
          "dualpace/runtime/decode_graphs.py",
          "        if self.planner is not None:\n            pad = bucket - fb.num_rows",
          "        if False:\n            pad = bucket - fb.num_rows",
          ("tests/model/test_attention_flashinfer.py",)),
    Plant("flashinfer-plans-every-layer", "FlashInfer is planned again at every layer",
          "dualpace/model/attention_flashinfer.py", "        if batch is not self._planned:",
          "        if True:", ("tests/model/test_attention_flashinfer.py",)),
    Plant("graph-check-never-fails", "the decode graphs' start-up check passes whatever the "
          "replay gave", "dualpace/runtime/decode_graphs.py",
          "        if not err <= tol * max(scale, 1.0):  # also catches NaN",
          "        if False:", ("tests/runtime/test_decode_graphs.py",
                               "tests/model/test_attention_flashinfer.py")),
    Plant("graph-check-always-skipped", "the graphs' start-up check never runs, as if "
          "every pool were too small for its batch", "dualpace/runtime/decode_graphs.py",
          "        if sum(need) > inp.scratch_block:", "        if True:",
          ("tests/runtime/test_decode_graphs.py",)),
    Plant("jitter-bins-never-split", "prefill steps share a jitter table with the decodes "
          "around them", "dualpace/sim/costs.py",
          "        out.append(cut)\n", "        return\n", ("tests/sim/test_jitter.py",)),
    Plant("jitter-split-without-steps", "a jitter bin is split even where a side has too "
          "few steps for a table", "dualpace/sim/costs.py",
          "        if below < JITTER_MIN_BIN or len(inside) - below < JITTER_MIN_BIN:",
          "        if below < 1 or len(inside) - below < 1:", ("tests/sim/test_jitter.py",)),
    Plant("fallback-triton-any-block-size", "a FlashInfer worker that fails its start-up "
          "check falls back to Triton for blocks its tiles cannot take",
          "dualpace/model/attention_check.py",
          '    chain = [name] + (["triton"] if name == "flashinfer" and block_size >= 16',
          '    chain = [name] + (["triton"] if name == "flashinfer"',
          ("tests/model/test_attention_flashinfer.py",)),
    Plant("graph-plan-any-row-count", "a FlashInfer graph bucket is planned with another "
          "batch size than its own", "dualpace/model/attention_flashinfer.py",
          "        if len(block_ids) != rows:", "        if False:",
          ("tests/model/test_attention_flashinfer.py",)),
    Plant("auto-skips-flashinfer", "auto never picks FlashInfer on CUDA",
          "dualpace/resolved.py",
          '        if cuda and importlib.util.find_spec("flashinfer") is not None:',
          "        if False:", ("tests/test_resolved_config.py",)),
    Plant("flashinfer-falls-back-to-torch", "a FlashInfer worker that fails its start-up "
          "check skips Triton", "dualpace/model/attention_check.py",
          "    chain = [name] + ([\"triton\"] if name == \"flashinfer\"",
          "    chain = [name] + ([] if name == \"flashinfer\"",
          ("tests/model/test_attention_flashinfer.py",)),
    Plant("copy-runs-merge-gaps", "non-consecutive blocks are DMA'd as one run",
          "dualpace/runtime/copies.py", "        if runs and runs[-1][1] + runs[-1][2] == b:",
          "        if runs:", ("tests/runtime/test_async_copies.py",)),
    Plant("copy-lengths-unchecked", "a block copy with more sources than destinations is "
          "accepted", "dualpace/runtime/copies.py",
          "    if len(src_ids) != len(dst_ids):", "    if False:",
          ("tests/runtime/test_async_copies.py",)),
    Plant("stand-in-lands-everything", "the copy stand-in lands every queued copy on any "
          "wait (it would hide a fence placed too early)", "dualpace/runtime/copies.py",
          "        while self._queue and self._queue[0][0] <= upto:",
          "        while self._queue:", ("tests/runtime/test_async_copies.py",)),
    Plant("kv-blocks-take-largest", "the GPU group's KV pool is the largest rank's report",
          "dualpace/runtime/supervisor.py",
          "        self.config = msgspec.structs.replace(self.config, gpu_kv_blocks=min(reported))",
          "        self.config = msgspec.structs.replace(self.config, gpu_kv_blocks=max(reported))",
          ("tests/runtime/test_gpu_memory.py",)),
    Plant("graphs-miss-max-num-seqs", "no decode graph holds a full batch of max_num_seqs",
          "dualpace/runtime/decode_graphs.py", "    sizes.add(max_num_seqs)\n", "",
          ("tests/runtime/test_decode_graphs.py",)),
    Plant("triton-auto-any-block-size", "auto picks Triton for blocks its tiles cannot take",
          "dualpace/resolved.py", "and have and block_size >= 16", "and have",
          ("tests/test_resolved_config.py",)),
    Plant("ready-before-copies-landed", "a step reports requests ready with host copies in "
          "flight", "dualpace/runtime/gpu_worker.py",
          "        self.copies.synchronize()\n        self.gate.drain()",
          "        self.gate.drain()", ("tests/runtime/test_async_copies.py",)),
    Plant("native-rope-sign", "the native pre-attention rotates the first half the wrong way",
          "cext/layer.c", "x[i] = a * cos[i] + (-b) * sin[i];", "x[i] = a * cos[i] + b * sin[i];",
          ("tests/kernels/test_native_stages.py::test_pre_attention_matches_torch_stages",)),
    Plant("native-down-residual-dropped", "the native post-attention drops the MLP's residual",
          "cext/layer.c", "hidden_out[(int64_t)r * H + n] += o[(int64_t)r * H + n];",
          "hidden_out[(int64_t)r * H + n] = o[(int64_t)r * H + n];",
          ("tests/kernels/test_native_stages.py::test_post_attention_and_final_match_torch_stages",)),
    Plant("native-silu-negative-side", "the vector SiLU takes g / (1 + exp(-|g|)) for negative "
          "gates too", "cext/attention_avx512.c", "_mm512_mask_mul_ps(g, neg, g, e)", "g",
          ("tests/kernels/test_native_stages.py::test_silu_over_its_whole_range",)),
    Plant("native-position-unchecked", "the native pre-attention reads RoPE rows past the table",
          "cext/layer.c",
          "        if (positions[r] < 0 || positions[r] >= m->max_positions) return -3;\n", "",
          ("tests/kernels/test_native_stages.py::test_bad_index_is_an_error_and_writes_nothing",)),
    Plant("native-for-prefill-chunks", "prefill-sized batches take the weight-streaming "
          "post-attention", "dualpace/model/stages.py",
          "                                       self.native.post_chunk, self.native.post_rows)",
          "                                       self.native.post, self.native.post_rows)",
          (CHUNK_TEST,)),
    Plant("chunk-qkv-bias-dropped", "a prefill chunk's QKV GEMM leaves out the QKV bias",
          "dualpace/model/native_stages.py",
          "        qkv = self._project(x, lw.qkv, self.biases[i][0])",
          "        qkv = self._project(x, lw.qkv)",
          (CHUNK_TEST,)),
    Plant("chunk-silu-halves-swapped", "a prefill chunk's SiLU * up takes SiLU of the up half",
          "cext/layer.c",
          "j->silu_mul(j->x + r * 2 * j->I, j->x + r * 2 * j->I + j->I,",
          "j->silu_mul(j->x + r * 2 * j->I + j->I, j->x + r * 2 * j->I,",
          (CHUNK_TEST,)),
    Plant("chunk-post-norm-is-input-norm", "a prefill chunk's post-attention normalizes with the "
          "input norm's weight", "dualpace/model/native_stages.py",
          "self._norm_rows(out, self.layers[i].post_norm)",
          "self._norm_rows(out, self.layers[i].input_norm)", (CHUNK_TEST,)),
    Plant("race-bound-without-1-u", "the C race skips elements by p <= best, as if E >= 1",
          "cext/sampling.c", "pv <= r.best * (1.0 - u) * (1.0 - 1e-12)",
          "pv <= r.best * (1.0 - 1e-12)",
          ("tests/sampling/test_sampler.py::test_c_race_picks_the_tensor_races_token",
           "tests/sampling/test_sampler.py::"
           "test_a_last_bit_difference_in_the_log_picks_the_same_tokens")),
    Plant("race-ignores-nan", "the C race passes over NaN probabilities (torch picks the first)",
          "cext/sampling.c",
          "        if (pv != pv) { r.idx = v; r.nan = 1; return r; }", "",
          ("tests/sampling/test_sampler.py::"
           "test_c_race_returns_the_first_nan_like_torchs_argmax",)),
    Plant("sampler-race-on-cpu-skipped", "the sampler never takes the C race on CPU",
          "dualpace/sampling/sampler.py",
          'if probs.device.type == "cpu" and cpu_kernels.available():',
          'if probs.device.type == "nowhere" and cpu_kernels.available():',
          ("tests/sampling/test_sampler.py::"
           "test_sample_takes_the_c_race_on_cpu_and_the_tensor_race_without_it",)),
    Plant("peers-phases-overlap", "the single-stream phase replays the concurrent phase's "
          "prompts (llama-server's prompt cache skips their prefill)",
          "bench/peers/compare_peers.py",
          "    return [(b[:args.num_requests], b[args.num_requests:]) for b in blocks]",
          "    return [(b[:args.num_requests], b[:args.single_requests]) for b in blocks]",
          ("tests/bench/test_peers.py::test_no_phase_or_round_replays_a_prompt",)),
    Plant("filter-denominator-from-candidates", "top-p among the candidates normalizes by the "
          "candidates' mass alone", "dualpace/sampling/sampler.py",
          "denom = torch.where(ins, vals.logsumexp(dim=-1), lse[rows])",
          "denom = vals.logsumexp(dim=-1)",
          ("tests/sampling/test_sampler.py::"
           "test_candidate_filter_keeps_what_the_sorted_definition_keeps",)),
    Plant("filter-wide-rows-kept-as-candidates", "a nucleus wider than the candidates is cut at "
          "the candidates", "dualpace/sampling/sampler.py",
          "            done[wide] = _filter_by_sort(sub[wide], top_k[rows][wide], tp[wide])\n",
          "            pass\n", ("tests/sampling/test_sampler.py::"
           "test_candidate_filter_keeps_what_the_sorted_definition_keeps",)),
    Plant("filter-flat-rows-skipped", "flat rows sorted whole are left unfiltered",
          "dualpace/sampling/sampler.py",
          "        out[flat] = _filter_by_sort(logits[flat], top_k[flat], top_p[flat])\n",
          "        pass\n", ("tests/sampling/test_sampler.py::"
           "test_candidate_filter_keeps_what_the_sorted_definition_keeps",)),
    Plant("race-keys-unchecked", "the C race takes a key of 2^64 or more (it wraps)",
          "dualpace/kernels/cpu.py", "    if any(not 0 <= k < 1 << 64 for k in keys):",
          "    if any(k < 0 for k in keys):",
          ("tests/sampling/test_sampler.py::test_c_race_refuses_bad_arguments",)),
    Plant("filter-plain-rows-filtered", "rows that asked for neither top-k nor top-p go "
          "through the candidate filter too", "dualpace/sampling/sampler.py",
          "    rows = ~plain & ~flat", "    rows = ~flat", ("tests/sampling/test_sampler.py::"
           "test_candidate_filter_keeps_what_the_sorted_definition_keeps",)),
    Plant("native-attention-trusts-strided-q", "the native attention call hands a strided q "
          "to the kernel unchecked", "dualpace/model/native_stages.py",
          "        if (q.dtype != self.act_dtype or q.dim() != 3 or not q.is_contiguous()",
          "        if (q.dtype != self.act_dtype or q.dim() != 3",
          ("tests/kernels/test_native_stages.py::test_decode_attention_matches_the_validating_kernel",)),
    Plant("roofline-counts-the-embedding", "the decode roofline counts the untied embedding "
          "table a step never streams", "dualpace/model/weights.py",
          "    tensors = [weights.final_norm, weights.lm_head]",
          "    tensors = [weights.embed, weights.final_norm, weights.lm_head]",
          ("tests/model/test_checkpoint_loading.py::test_decode_step_weight_bytes",)),
    Plant("native-under-tp", "the native stages serve a tensor-parallel rank (they would skip "
          "its all-reduces)", "dualpace/model/native_stages.py",
          "    if has_all_reduce:\n", "    if False:\n",
          ("tests/kernels/test_native_stages.py::test_why_not_native",)),
    Plant("linear-accepts-ragged-k", "the decode linear takes an in-width the kernel cannot "
          "(and returns uninitialized rows)", "dualpace/kernels/cpu.py",
          "    if K % 16 or M == 0 or N == 0:", "    if M == 0 or N == 0:",
          ("tests/kernels/test_linear.py::test_linear_rejects_bad_shapes",)),
    Plant("linear-drops-bias", "the decode linear ignores its bias", "cext/linear_body.h",
          "vreduce_add(acc[i][j]) + (bias ? bias[n0 + j] : 0.f)", "vreduce_add(acc[i][j])",
          ("tests/kernels/test_linear.py",)),
    Plant("linear-blocks-reorder-sums", "the decode linear runs each K block back to front, "
          "so a blocked batch sums a row in another order than the same row alone",
          "cext/linear_body.h",
          "    for (int k = 0; k < kl; k += VW) {\n        /* the next tile's rows",
          "    for (int k = kl - VW; k >= 0; k -= VW) {\n        /* the next tile's rows",
          ("tests/kernels/test_linear.py::test_row_results_do_not_depend_on_the_batch",)),
    Plant("linear-k-block-restarts", "a K block of the decode linear after the first starts "
          "its sums from zero, not from the carried ones", "cext/linear_body.h",
          "acc[i][j] = cin ? carry[i][j] : vzero();", "acc[i][j] = vzero();",
          ("tests/kernels/test_linear.py::test_linear_matches_torch",)),
    Plant("linear-panel-shares-carry", "the tiles of a decode-linear panel carry their sums "
          "in one another's slots", "cext/linear_body.h",
          "carry[(n - n0) / NRT * gp + (m - g) / MR]", "carry[(m - g) / MR]",
          ("tests/kernels/test_linear.py::test_linear_matches_torch",)),
    Plant("softmax-fold-short", "the softmax across a group's heads folds one lane step too "
          "few, so lanes of one head keep different maxima", "cext/attention_simd.h",
          "    for (int k = VW / 2; k >= G; k /= 2) v = vmax(v, vswap(v, k));",
          "    for (int k = VW / 2; k > G; k /= 2) v = vmax(v, vswap(v, k));",
          (ATTN_TEST + "test_random_ragged_batches",
           ATTN_TEST + "test_every_listed_head_dim_group_and_block_size")),
    Plant("softmax-no-rescale", "the vectorized softmax leaves a head's accumulator unscaled "
          "when its running max moves", "cext/attention_simd.h",
          "prim_scale(acc + (int64_t)g * D, cs[g], D);", "(void)acc;",
          (ATTN_TEST + "test_random_ragged_batches",
           ATTN_TEST + "test_every_listed_head_dim_group_and_block_size")),
    Plant("fma-probe-skips-chains", "the FMA probe's loop runs every other chain but reports "
          "them all, so the bench's compute ceiling doubles", "cext/fma_probe_body.h",
          "        for (int j = 0; j < DP_FMA_CHAINS; j++) a[j] = vfma(a[j], b, c);",
          "        for (int j = 0; j < DP_FMA_CHAINS; j += 2) a[j] = vfma(a[j], b, c);",
          ("tests/kernels/test_fma_probe.py::test_the_probe_runs_the_fmas_it_reports",)),
    Plant("gemm-k-blocks-overwrite", "the prefill GEMM's later K blocks overwrite the sums "
          "of the earlier ones", "cext/gemm_body.h",
          "                    for (int j = 0; j < nr; j++) o[j] += t[j][i];",
          "                    for (int j = 0; j < nr; j++) o[j] = t[j][i];",
          ("tests/kernels/test_gemm.py::test_gemm_matches_float64",)),
    Plant("gemm-edge-tile-short", "the prefill GEMM's last partial tile of N loses its last "
          "W row", "cext/gemm_body.h",
          "    for (int j = 0; j < nr; j++) {\n        VEC a = vzero(), b = vzero();",
          "    for (int j = 0; j < nr - 1; j++) {\n        VEC a = vzero(), b = vzero();",
          ("tests/kernels/test_gemm.py::test_gemm_matches_float64",)),
    Plant("gemm-k-blocks-by-threads", "the prefill GEMM's K blocks shrink with the thread "
          "count, so a row's rounding depends on it", "cext/gemm.c",
          "    for (int k0 = 0; k0 < K; k0 += DP_GEMM_KC) {\n"
          "        const int kc = K - k0 < DP_GEMM_KC ? K - k0 : DP_GEMM_KC;",
          "    const int ks = DP_GEMM_KC / T;\n"
          "    for (int k0 = 0; k0 < K; k0 += ks) {\n"
          "        const int kc = K - k0 < ks ? K - k0 : ks;",
          ("tests/kernels/test_gemm.py::test_rows_do_not_depend_on_the_batch_or_the_threads",)),
    Plant("gemm-out-overlap-unchecked", "gemm lets out overlap its own input x",
          "dualpace/kernels/cpu.py",
          "    elif (any(t is not None and _overlaps(t, out) for t in (x, weight, bias))",
          "    elif (any(t is not None and _overlaps(t, out) for t in (weight, bias))",
          ("tests/kernels/test_gemm.py::test_bad_arguments_are_refused",)),
    Plant("prefill-gemm-auto-everywhere", "auto picks the AVX-512 GEMM on Intel hosts too, "
          "where it is not measured against MKL", "dualpace/kernels/cpu.py",
          "    if (flag == \"cext\" or path == \"avx2\" or weight_dtype != torch.float32\n"
          "            or cpu_vendor() in _GEMM_AUTO_AVX512_VENDORS):",
          "    if True:",
          ("tests/kernels/test_gemm.py::test_the_prefill_gemm_choice",)),
    Plant("vendor-key-unstripped", "the cpuinfo vendor parser compares the key with its "
          "tab, so no Linux host is ever AMD", "dualpace/kernels/cpu.py",
          "        if sep and key.strip() == \"vendor_id\":",
          "        if sep and key == \"vendor_id\":",
          ("tests/kernels/test_gemm.py::test_vendor_from_cpuinfo",)),
    Plant("prefill-gemm-env-unchecked", "a bad $DUALPACE_PREFILL_GEMM passes resolution (each "
          "worker then fails on its own)", "dualpace/resolved.py",
          "        cpu.prefill_gemm_isa()  # $DUALPACE_PREFILL_GEMM validated here too, as the "
          "ISA is",
          "        pass",
          ("tests/test_resolved_config.py::test_bad_isa_fails_in_resolution",)),
    Plant("prefill-gemm-bench-one-core-peak", "bench/prefill_gemm.py's roofline counts one "
          "core whatever the threads", "bench/prefill_gemm.py",
          "        peak = fma_per_s * lanes * 2 * threads",
          "        peak = fma_per_s * lanes * 2",
          ("tests/bench/test_prefill_gemm.py::"
           "test_the_bench_reports_each_path_against_its_roofline",)),
    Plant("prefill-attn-sees-next-key", "the C prefill attention lets each row see the "
          "key after its own", "cext/prefill_attention_body.h",
          "                const int seen = ctx + PFA_VEC(i0 + j) / G + 1 - c0;",
          "                const int seen = ctx + PFA_VEC(i0 + j) / G + 2 - c0;",
          ("tests/kernels/test_prefill_attention.py::test_the_causal_mask_is_exact",)),
    Plant("prefill-attn-no-rescale", "the C prefill attention never rescales a row's output "
          "when its running max grows in a later key chunk", "cext/prefill_attention_body.h",
          "    if (alpha != 1.f) {", "    if (alpha == 0.f) {",
          ("tests/kernels/test_prefill_attention.py::test_matches_the_reference",)),
    # Only the 16-lane body has that tail (head dims are multiples of 16): caught on an
    # AVX-512 host, where the AVX-512 cases of the test run; MISSED on an AVX2-only one.
    Plant("prefill-attn-d-tail-dropped", "the C prefill attention skips the last VW of a head "
          "dim that is an odd number of VW (AVX-512 hosts only)", "cext/prefill_attention_body.h",
          "            if (d0 < D) pfa_pv_tile1(s, vc, width, D, d0, ot);",
          "            (void)pfa_pv_tile1;",
          ("tests/kernels/test_prefill_attention.py::test_matches_the_reference",)),
    Plant("prefill-attn-scalar-unchecked", "serving's prefill attention calls the C kernel on "
          "the scalar path too", "dualpace/kernels/prefill_attention.py",
          "    if has_path() and D % 16 == 0 and 16 <= D <= 512:",
          "    if cpu_kernels.available() and D % 16 == 0 and 16 <= D <= 512:",
          ("tests/kernels/test_prefill_attention.py::"
           "test_serving_takes_it_on_vector_paths_only",)),
    Plant("chunk-gemm-drops-residual", "a prefill chunk's O projection on the cext GEMM loses "
          "the residual", "dualpace/model/native_stages.py",
          "            return cpu_kernels.gemm(x.contiguous(), w, bias, add, out=out, "
          "isa=self.gemm_isa)",
          "            return cpu_kernels.gemm(x.contiguous(), w, bias, None, out=out, "
          "isa=self.gemm_isa)",
          (CHUNK_TEST,)),
    Plant("decode-batches-take-the-gemm-from-16", "decode batches from 16 rows take the "
          "chunk stages again, where the fused stages are faster", "dualpace/model/stages.py",
          "        return rows <= NATIVE_MAX_ROWS",
          "        return rows < 16",
          ("tests/kernels/test_native_stages.py::"
           "test_decode_batches_past_native_max_rows_take_the_gemm",)),
    Plant("decode-batches-past-the-cap-fused", "decode batches past NATIVE_MAX_ROWS take the "
          "fused decode-sized stages", "dualpace/model/stages.py",
          "        return rows <= NATIVE_MAX_ROWS",
          "        return True",
          ("tests/kernels/test_native_stages.py::"
           "test_decode_batches_past_native_max_rows_take_the_gemm",)),
    Plant("decode-layers-never-pause", "the one-call decode step ignores a raised Dense Assist "
          "word until its last layer", "cext/decode_layers.c",
          "            raised |= __atomic_load_n(pause_words[i], __ATOMIC_ACQUIRE) == pause_value;",
          "            raised |= 0;",
          ("tests/kernels/test_native_stages.py::"
           "test_decode_layers_pauses_at_layer_boundaries_for_a_raised_word",)),
    Plant("amx-drops-bias", "the AMX linear ignores its bias", "cext/linear_amx.c",
          "{bias ? _mm512_loadu_ps(bias + n) : _mm512_setzero_ps(),",
          "{_mm512_setzero_ps(),",
          ("tests/kernels/test_linear.py::test_linear_matches_torch",)),
    Plant("amx-second-tile-bias", "the AMX linear adds the first W tile's bias to the second's "
          "rows", "cext/linear_amx.c", "_mm512_loadu_ps(bias + n + 16)",
          "_mm512_loadu_ps(bias + n)",
          ("tests/kernels/test_linear.py::test_linear_matches_torch",)),
    Plant("amx-out-transposed", "the AMX linear writes a C tile's rows where its columns go",
          "cext/linear_amx.c", "_mm512_i32gather_ps(col, &c[0][m], 4)",
          "_mm512_loadu_ps(&c[m][0])",
          ("tests/kernels/test_linear.py::test_linear_matches_torch",)),
    Plant("amx-second-block-lost", "the AMX linear drops x rows 16-31 of each pair of blocks",
          "cext/linear_amx.c", "            _tile_dpbf16ps(1, 4, 7);\n", "",
          ("tests/kernels/test_linear.py::test_linear_matches_torch",)),
    Plant("amx-k-blocks-restart", "the AMX linear starts every K block from zero",
          "cext/linear_amx.c", "cb[p * pairs + b / 2], k0 == 0, k1 == K,",
          "cb[p * pairs + b / 2], 1, k1 == K,",
          ("tests/kernels/test_linear.py::test_linear_matches_torch",
           "tests/kernels/test_linear.py::test_amx_rows_do_not_depend_on_the_batch")),
    Plant("amx-group-shares-carry", "the panels of an AMX group carry their tiles in one place",
          "cext/linear_amx.c", "cb[p * pairs + b / 2], k0 == 0", "cb[b / 2], k0 == 0",
          ("tests/kernels/test_linear.py::test_linear_matches_torch",)),
    Plant("amx-pack-transposed", "the AMX pack of x puts row j's pairs where pair j goes",
          "cext/linear_amx.c", "_mm512_i32gather_epi32(col, &rows[0][p], 4)",
          "_mm512_load_si512(rows[p])",
          ("tests/kernels/test_linear.py::test_linear_matches_torch",)),
    Plant("amx-from-one-row", "the AMX path rounds x to bf16 for every bf16 projection, one row "
          "too", "cext/dp_internal.h", "#define DP_AMX_MIN_ROWS 4", "#define DP_AMX_MIN_ROWS 1",
          ("tests/kernels/test_linear.py::test_amx_path_changes_only_the_projections_it_names",)),
    Plant("mixed-chunks-native", "a bf16 model's prefill chunks take the fp32 chunk stages",
          "dualpace/model/stages.py",
          "        if not self.native.mixed:\n            return chunk\n", "        return chunk\n",
          ("tests/kernels/test_native_stages.py::test_mixed_prefill_chunks_take_the_torch_stages",)),
    Plant("gemm-widens-one-row-short", "the GEMM widens all but the last W row of a tile",
          "cext/gemm_body.h", "    for (int j = 0; j < nr; j++) {\n        const char *src",
          "    for (int j = 0; j < nr - 1; j++) {\n        const char *src",
          ("tests/kernels/test_gemm.py::test_narrow_weights_multiply_as_their_fp32_widening",)),
    Plant("mixed-chunks-always-slice", "a bf16 model's chunks slice even where the cext GEMM "
          "has its weights", "dualpace/model/stages.py",
          "        return chunk if chunk is not None and self.native.gemm_isa is not None "
          "else by_rows",
          "        return by_rows",
          ("tests/kernels/test_native_stages.py::"
           "test_mixed_rows_past_decode_size_take_the_gemm_stages_where_torch_lacks_the_arithmetic",)),
    Plant("mixed-never-gets-gemm", "a bf16 model never gets the cext GEMM",
          "dualpace/model/native_stages.py",
          "                         if not self.mixed or self.slices_rows else None)",
          "                         if not self.mixed else None)",
          ("tests/kernels/test_native_stages.py::"
           "test_a_mixed_model_takes_the_cext_gemm_only_where_torch_lacks_the_arithmetic",)),
    Plant("mixed-chunk-q-fp32", "a bf16 model's chunk stage hands q on in fp32",
          "dualpace/model/native_stages.py",
          "dp_qkv_rope_append failed with code {rc}\"))\n        return self._out(q)",
          "dp_qkv_rope_append failed with code {rc}\"))\n        return q",
          ("tests/kernels/test_native_stages.py::"
           "test_mixed_rows_past_decode_size_take_the_gemm_stages_where_torch_lacks_the_arithmetic",)),
    Plant("chunk-bias-in-model-dtype", "a bf16 model's chunk QKV takes its bias in bf16",
          "dualpace/model/native_stages.py",
          "        qkv = self._project(x, lw.qkv, self.biases[i][0])",
          "        qkv = self._project(x, lw.qkv, lw.qkv_bias)",
          ("tests/kernels/test_native_stages.py::"
           "test_mixed_rows_past_decode_size_take_the_gemm_stages_where_torch_lacks_the_arithmetic",)),
    Plant("llm-del-uses-module-globals", "LLM.__del__ leans on a module global, None at exit",
          "dualpace/llm.py",
          "        with _suppress(Exception):\n            self.shutdown()",
          "        with contextlib.suppress(Exception):\n            self.shutdown()",
          ("tests/engine/test_llm_api.py::"
           "test_a_collected_llm_says_nothing_at_interpreter_exit",)),
    Plant("calibration-p-one-layer", "p's calibration calls all go to layer 0",
          "dualpace/profiler/run.py",
          "            layer = (layer_turns(num_layers) if op == OP_POST_ATTN",
          "            layer = ((lambda: 0) if op == OP_POST_ATTN",
          ("tests/profiler/test_profile_run.py::"
           "test_calibration_calls_of_p_take_the_layers_in_turn",)),
    Plant("calibration-la-not-last", "lA's calibration calls take layer 0, not the last",
          "dualpace/profiler/run.py",
          "                     else (lambda last=num_layers - 1: last))",
          "                     else (lambda last=0: last))",
          ("tests/profiler/test_profile_run.py::"
           "test_calibration_calls_of_p_take_the_layers_in_turn",)),
    Plant("cpu-dtype-largest-batch", "the CPU dtype is read off the largest batch alone",
          "dualpace/profiler/run.py",
          " for b in t_p[\"float32\"]]",
          " for b in [max(t_p[\"float32\"])]]",
          ("tests/profiler/test_profile_run.py::"
           "test_the_cpu_dtype_is_the_faster_over_every_batch_size",)),
    Plant("cpu-dtype-tie-bf16", "a tie of the dtypes picks bf16", "dualpace/profiler/run.py",
          "    return (\"bfloat16\" if g < 1 else \"float32\"), g",
          "    return (\"bfloat16\" if g <= 1 else \"float32\"), g",
          ("tests/profiler/test_profile_run.py::"
           "test_the_cpu_dtype_is_the_faster_over_every_batch_size",)),
    Plant("cpu-dtype-one-after-the-other", "each dtype's post-attention is timed in rounds of "
          "its own", "dualpace/profiler/run.py",
          "             for b in sizes for name, models in model_sets.items()}",
          "             for name, models in model_sets.items() for b in sizes}",
          ("tests/profiler/test_profile_run.py::"
           "test_both_dtypes_post_attention_is_timed_in_the_same_rounds",)),
    Plant("mixed-head-slices", "a bf16 model's head past 128 rows slices though the GEMM "
          "has its weights", "dualpace/model/stages.py",
          "            chunk = self.native.final_chunk if self.native.mixed else None",
          "            chunk = None",
          ("tests/kernels/test_native_stages.py::"
           "test_mixed_rows_past_decode_size_take_the_gemm_stages_where_torch_lacks_the_arithmetic",)),
    Plant("gemm-bench-libgomp-spin", "bench/prefill_gemm.py leaves libgomp's long spin",
          "bench/prefill_gemm.py",
          'os.environ.setdefault("GOMP_SPINCOUNT", "3000")',
          'os.environ.setdefault("GOMP_SPINCOUNT_UNSET", "3000")',
          ("tests/bench/test_prefill_gemm.py::"
           "test_a_narrow_weight_dtype_reports_the_widening_against_fp32_and_the_sliced_linear",)),
    Plant("mixed-bench-default-route", "bench/mixed_precision_steps.py names the sliced route "
          "where the GEMM is taken", "bench/mixed_precision_steps.py",
          '    return "gemm" if native.gemm_isa is not None else "sliced"',
          '    return "sliced"',
          ("tests/bench/test_mixed_precision_steps.py::test_both_steps_through_every_route",)),
    Plant("mixed-leaks-fp32", "a bf16 model's native stages hand fp32 to the next stage",
          "dualpace/model/native_stages.py",
          "        return t.to(self.act_dtype) if self.mixed else t", "        return t",
          ("tests/kernels/test_native_stages.py::"
           "test_mixed_stages_keep_the_model_dtype_at_their_boundaries",)),
    Plant("argmax-last-of-ties", "greedy argmax keeps the last of equal maxima in a lane",
          "cext/argmax.c",
          "const __mmask16 gt = _mm512_cmp_ps_mask(xv, best, _CMP_GT_OQ);",
          "const __mmask16 gt = _mm512_cmp_ps_mask(xv, best, _CMP_GE_OQ);",
          ("tests/kernels/test_argmax.py::test_argmax_rows_is_torchs",)),
    Plant("argmax-ignores-nan", "greedy argmax skips NaN logits (torch returns the first)",
          "cext/argmax.c", "    if (nan) return amax_scalar(x, v0, v1);\n", "",
          ("tests/kernels/test_argmax.py::test_argmax_rows_is_torchs",)),
    Plant("attention-q-rounded-to-bf16", "the attention kernel rounds fp32 queries to bf16",
          "cext/attention_body.h",
          "D, a->scale, qrow);\n",
          "D, a->scale, qrow);\n"
          "            for (int d = 0; d < D; d++)\n"
          "                qrow[d] = dp_bf16_to_f32(dp_f32_to_bf16(qrow[d]));\n",
          ("tests/kernels/test_paged_attention.py::"
           "test_fp32_queries_over_bf16_kv_keep_fp32_precision",)),
    Plant("workers-spin-for-ms", "workers keep libgomp's milliseconds-long idle spin",
          "dualpace/runtime/supervisor.py",
          '        env["GOMP_SPINCOUNT"] = str(OMP_SPIN_COUNT)',
          '        env["GOMP_SPINCOUNT"] = "300000"',
          ("tests/runtime/test_thread_share.py",)),
    Plant("stream-skips-held-back-tokens", "a stream sends no chunk for a token whose text "
          "is held back", "dualpace/server/app.py",
          "                piece = Piece()\n                piece.add(d)\n",
          "                if not d.text and not d.finished:\n                    continue\n"
          "                piece = Piece()\n                piece.add(d)\n",
          ("tests/server/test_openai_api.py::"
           "test_stream_has_a_chunk_per_token_empty_while_a_character_is_held_back",)),
    Plant("loadgen-skips-empty-chunks", "the load generator times only chunks with text",
          "bench/loadgen.py", '                if chunk.get("choices"):',
          '                if chunk.get("choices") and chunk["choices"][0].get("text"):',
          ("tests/bench/test_loadgen.py",)),
    Plant("fit-total-not-kept", "the step-cost fit is not rescaled to the measured total",
          "dualpace/sim/costs.py",
          "    return coef * (float(y.sum()) / pred) if pred > 0 else coef",
          "    return coef", ("tests/sim/test_simulator.py",)),
    Plant("validation-one-target", "the validation compares every target factor at the "
          "strict one", "bench/compare_policies.py",
          "            targets = sweep_targets(ref, f)",
          "            targets = sweep_targets(ref, factor)",
          ("tests/bench/test_histogram_quantile.py",)),
    Plant("sim-itl-histogram-missing", "the simulated engine's inter-token histogram is "
          "read before the run", "dualpace/sim/run.py",
          "    out.update(engine_latencies(samples))", "    out.update(engine_latencies({}))",
          ("tests/sim/test_simulator.py",)),
    Plant("pv-short-pass-drops-a-chunk", "the PV loop's short last pass over the head dim "
          "leaves out its last chunk", "cext/attention_simd.h",
          "d0, (r), pairs, nxt); \\", "d0, (r) - 1, pairs, nxt); \\",
          ("tests/kernels/test_paged_attention.py::test_every_listed_head_dim_group_and_block_size",)),
    Plant("attention-head-range-of-one", "a KV-head range of the attention driver covers "
          "only its first head", "cext/attention.c",
          "h1 = (int)((int64_t)(hg + 1) * Hkv / HG);", "h1 = h0 + 1;",
          ("tests/kernels/test_paged_attention.py::"
           "test_few_sequences_split_into_segments_and_head_ranges",)),
    Plant("qk-slices-overwrite-first-heads", "every QK slice of a large GQA group writes its "
          "scores to the first heads' rows", "cext/attention_simd.h",
          "dtype, D, gn, TT, s + t * G + g0, G,", "dtype, D, gn, TT, s + t * G, G,",
          ("tests/kernels/test_paged_attention.py::"
           "test_few_sequences_split_into_segments_and_head_ranges",)),
    Plant("bf16-dot-reads-past-the-end", "the bf16 dot-product PV reads the row after an odd "
          "last token instead of zeros", "cext/attention_avx512bf16.c",
          "            const __m512i r1 = t + 1 < n ? _mm512_loadu_si512(vt + row + c * BF_CH * 2)"
          "\n                                         : _mm512_setzero_si512();",
          "            const __m512i r1 = _mm512_loadu_si512(vt + row + c * BF_CH * 2);",
          (ATTN_TEST + "test_slots_past_a_sequence_are_never_read",)),
    Plant("bf16-dot-unscaled", "the bf16 dot-product QK leaves the scores unscaled",
          "cext/attention_avx512bf16.c",
          "    vstore_scores(flat, TT, G, scale, s, ss);",
          "    vstore_scores(flat, TT, G, 1.f, s, ss);",
          (ATTN_TEST + "test_bf16_within_its_rounding_bound",)),
    Plant("bf16-dot-pv-order-kept", "the bf16 dot-product item returns its accumulators in "
          "the unpack's lane order", "cext/avx512_vec.h",
          "        _mm512_storeu_ps(acc + i, _mm512_permutex2var_ps(x, lo_idx, y));\n"
          "        _mm512_storeu_ps(acc + i + 16, _mm512_permutex2var_ps(x, hi_idx, y));",
          "        (void)x; (void)y; (void)lo_idx; (void)hi_idx;",
          (ATTN_TEST + "test_bf16_within_its_rounding_bound",)),
    Plant("bf16-dot-takes-fp32-queries", "the bf16 dot products also take fp32 queries",
          "cext/dp_internal.h",
          "        && q_dtype == DP_BF16 && kv_dtype == DP_BF16 && G >= 8",
          "        && kv_dtype == DP_BF16 && G >= 8",
          (ATTN_TEST + "test_fp32_queries_over_bf16_kv_keep_fp32_precision",)),
    Plant("bf16-dot-never-taken", "the AVX512_BF16 path never takes the bf16 dot products",
          "cext/dp_internal.h",
          "        && q_dtype == DP_BF16 && kv_dtype == DP_BF16 && G >= 8",
          "        && 0 && kv_dtype == DP_BF16 && G >= 8",
          (ATTN_TEST + "test_bf16_dot_products_where_they_apply",)),
    Plant("bf16-dot-switch-ignored", "the bf16 dot products are taken where the probe turned "
          "them off", "cext/dp_internal.h",
          "    return __atomic_load_n(&dp_bf16_dot_on, __ATOMIC_RELAXED)\n",
          "    return 1\n",
          (ATTN_TEST + "test_bf16_dot_products_where_they_apply",)),
    Plant("bf16-dot-ratio-half", "bf16 dot products taken at half the FMA rate",
          "dualpace/kernels/cpu.py",
          "    return dot_per_s >= BF16_DOT_MIN_RATIO * fma_per_s",
          "    return dot_per_s >= 0.5 * BF16_DOT_MIN_RATIO * fma_per_s",
          (ATTN_TEST + "test_bf16_dot_pays_at_three_quarters_of_the_fma_rate",)),
    Plant("bf16-dot-env-inverted", "DUALPACE_BF16_DOT=1 turns the route off",
          "dualpace/kernels/cpu.py", "            enabled = env == \"1\"",
          "            enabled = env == \"0\"",
          (ATTN_TEST + "test_the_route_follows_dualpace_bf16_dot",)),
    Plant("bf16-dot-probe-counts-nothing", "the bf16 dot-product probe counts no instructions",
          "cext/attention.c",
          "    *sink = dp_bf16_dot_chains(iters);\n    return iters * DP_FMA_CHAINS;",
          "    *sink = dp_bf16_dot_chains(iters);\n    return 0;",
          (ATTN_TEST + "test_bf16_dot_probe_measures_a_rate",)),
    Plant("bf16-path-dense-stages-missing", "the AVX512_BF16 path has no dense-stage bodies",
          "cext/dp_internal.h",
          "    return isa == DP_ISA_AVX512_BF16 || isa == DP_ISA_AMX ? DP_ISA_AVX512 : isa;",
          "    return isa == DP_ISA_AMX ? DP_ISA_AVX512 : isa;",
          ("tests/kernels/test_native_stages.py",)),
    Plant("decode-layers-skips-the-last", "the one-call decode step leaves out the last "
          "layer", "cext/decode_layers.c", "    for (; l < dm->n_layers; l++) {",
          "    for (; l < dm->n_layers - 1; l++) {",
          ("tests/kernels/test_native_stages.py::"
           "test_decode_layers_is_the_layer_loop_in_one_call",)),
    Plant("decode-layers-ignores-the-other-tier", "the one-call decode step takes every core "
          "while the other tier computes", "cext/decode_layers.c",
          "    for (; l < dm->n_layers; l++) {\n"
          "        const int nt = peer_busy && __atomic_load_n(peer_busy, __ATOMIC_ACQUIRE)",
          "    for (; l < dm->n_layers; l++) {\n"
          "        const int nt = 0 && __atomic_load_n(peer_busy, __ATOMIC_ACQUIRE)",
          ("tests/kernels/test_native_stages.py::"
           "test_decode_layers_picks_threads_per_layer_from_the_other_tier",)),
    Plant("gpu-worker-fuses-past-assists", "the GPU worker runs a step's layers in one call "
          "that never stops at a layer boundary for a waiting Dense Assist call",
          "dualpace/runtime/gpu_worker.py",
          "        if not self.assist_reachable:\n            return None\n        self.boundary()",
          "        if True:\n            return None\n        self.boundary()",
          ("tests/runtime/test_workers_e2e.py::test_neo_pipeline_overlaps_the_gpu_step",)),
    Plant("tile-sums-drop-bias", "the AVX-512 linear's tile sums leave out the bias",
          "cext/attention_avx512.c",
          "    const __m512 b = bias ? _mm512_maskz_loadu_ps(row, bias) : _mm512_setzero_ps();",
          "    const __m512 b = _mm512_setzero_ps();", ("tests/kernels/test_linear.py",)),
    Plant("tile-sums-first-row-everywhere", "the AVX-512 linear's tile sums store the first "
          "row's sums in every row", "cext/attention_avx512.c",
          "_mm512_add_epi32(first, _mm512_set1_epi32(i * nr)), r)));",
          "_mm512_add_epi32(first, _mm512_set1_epi32(0 * nr)), r)));",
          ("tests/kernels/test_linear.py",)),
    Plant("sim-jitter-shifts-the-mean", "a step-time jitter table is not divided by its mean",
          "dualpace/sim/costs.py", "        tables.append((q / q.mean()).round(4).tolist()",
          "        tables.append(q.round(4).tolist()", ("tests/sim/test_jitter.py",)),
    Plant("sim-jitter-one-bin", "every simulated step draws from the longest steps' table",
          "dualpace/sim/costs.py",
          '        table = jitter["tables"][bisect.bisect_right(jitter["edges"], predicted)]',
          '        table = jitter["tables"][-1]', ("tests/sim/test_jitter.py",)),
    Plant("sim-jitter-on-the-pipeline", "the gated pipeline's CPU steps are jittered too",
          "dualpace/sim/costs.py",
          "        if w.route == NEO_PIPELINE:\n            # The gated pipeline's two halves",
          "        if False:\n            # The gated pipeline's two halves",
          ("tests/sim/test_jitter.py",)),
    Plant("sim-pipeline-counted-twice", "the gated pipeline's CPU half takes the logged "
          "(whole pipelined) step time", "dualpace/sim/costs.py",
          "            return CpuStepCost(min(att, t), min(att, t), 0.0)",
          "            return CpuStepCost(t, min(att, t), 0.0)", ("tests/sim/test_jitter.py",)),
    Plant("repeat-takes-the-first-sweep", "compare_policies --repeat keeps the first sweep's "
          "values instead of the median", "bench/compare_policies.py",
          "            out[key] = statistics.median(nums)", "            out[key] = nums[0]",
          ("tests/bench/test_compare_repeat.py",)),
    Plant("jitter-from-a-handful", "a jitter table is built from a handful of steps",
          "dualpace/sim/costs.py", "    if ok.sum() < JITTER_BINS * 10:", "    if not ok.any():",
          ("tests/sim/test_jitter.py",)),
    Plant("jitter-needs-tables", "a profile without jitter tables breaks the simulation",
          "dualpace/sim/costs.py", "        if not jitter:\n            return 1.0\n", "",
          ("tests/sim/test_jitter.py",)),
    Plant("repeat-mixes-rates", "compare_policies --repeat merges points of different rates",
          "bench/compare_policies.py", "    if len(rates) != 1:", "    if False:",
          ("tests/bench/test_compare_repeat.py",)),
    Plant("claims-in-tiles", "projection rows are claimed in 4-row tiles, not 16-row units",
          "cext/dp_internal.h", "#define DP_UNIT_ROWS 16", "#define DP_UNIT_ROWS 4",
          (THREADS_TEST,)),
    Plant("claims-skip-the-others", "a thread done with its share takes nothing of the others'",
          "cext/dp_internal.h", "    for (int k = 0; k < T; k++) {\n        int u;",
          "    for (int k = 0; k < 1; k++) {\n        int u;",
          ("tests/kernels/test_native_stages.py::test_shares_of_threads_openmp_did_not_start",)),
    Plant("ahead-past-max-tokens", "a step ahead includes rows the step in flight finishes by "
          "length", "dualpace/engine/lookahead.py", "len(r.out) + 2 <= r.max_tokens]",
          "len(r.out) + 1 <= r.max_tokens]", ("tests/engine/test_async_scheduling.py",)),
    Plant("ahead-beside-a-prompt", "a step ahead is submitted while a prompt waits or the "
          "CPU tier holds requests", "dualpace/engine/lookahead.py",
          "    if not only_gpu_decodes(st):\n        return []\n    live", "    live",
          ("tests/engine/test_async_scheduling.py",)),
    Plant("ahead-keeps-finished-tokens", "the token a step ahead sampled for a request that "
          "finished is applied", "dualpace/engine/llm_engine.py",
          "            if r.finished:  # meanwhile", "            if False:  # meanwhile",
          ("tests/engine/test_async_scheduling.py",)),
    Plant("worker-takes-any-previous", "a worker decodes its last token whichever output "
          "the step asks for", "dualpace/runtime/worker_state.py",
          "                if req.last_index != s.out_index - 1:",
          "                if req.last_index < 0:", ("tests/runtime/test_previous_token.py",)),
    Plant("invalid-result-hangs", "a worker's invalid result is skipped, its step left "
          "waiting", "dualpace/runtime/client.py",
          '                self.fail_all(StepError(f"{self.kind} worker sent an invalid '
          'message: {e}"))\n', "", ("tests/runtime/test_worker_client.py",)),
    Plant("steady-skips-reserve", "the steady-state GPU round leaves Eq. 4's reserve as it "
          "was", "dualpace/engine/gpu_round.py",
          "    plan.decodes = list(decodes)\n    step3_migration_reserve(st, plan)\n",
          "    plan.decodes = list(decodes)\n", ("tests/engine/test_steady_round.py",)),
    Plant("steady-beside-a-prompt", "the steady-state GPU round runs while a prompt waits",
          "dualpace/engine/gpu_round.py",
          " or any(not r.finished for r in st.gpu_waiting):", ":",
          ("tests/engine/test_steady_round.py",)),
    Plant("steady-past-hbm", "the steady-state GPU round runs when HBM lacks a decode's "
          "next block", "dualpace/engine/gpu_round.py",
          "    if sum(r.blocks_for_next() for r in decodes) > st.gpu_pool.num_free:",
          "    if False:", ("tests/engine/test_steady_round.py",)),
    Plant("decode-graphs-never-replay", "the stand-in worker never replays a decode graph",
          "dualpace/runtime/gpu_worker.py",
          "and all(s.next_token == -2 for s in seqs) and self.graphs.prepare(fb)):",
          "and False and self.graphs.prepare(fb)):", ("tests/runtime/test_async_copies.py",)),
    Plant("latency-buckets-coarse", "the latency histograms go back to 1-5-10 ms edges",
          "dualpace/engine/metrics.py",
          "(0.001, 0.002, 0.003, 0.004, 0.005, 0.006, 0.008, 0.01, 0.0125, 0.015, 0.02,\n"
          "                   0.025, 0.03, 0.04, 0.05, 0.06, 0.08, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4,"
          " 0.5,\n",
          "(0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,\n",
          ("tests/sim/test_simulator.py",)),
    Plant("one-call-head-norm-eps", "the one-call decode step's final norm takes a "
          "larger epsilon than final's", "cext/decode_layers.c",
          "dm->final_norm, m->eps,\n                                      dm->lm_head",
          "dm->final_norm, m->eps * 4,\n                                      dm->lm_head",
          ("tests/kernels/test_native_stages.py::"
           "test_decode_logits_is_decode_layers_then_post_layer_in_one_call",)),
    Plant("one-call-head-unrounded", "a bf16 model's one-call head reads the fp32 hidden "
          "rows, not the bf16 ones a head of its own reads", "cext/decode_layers.c",
          "        if (dm->embed && dm->embed_dtype == DP_BF16)\n",
          "        if (0)\n",
          ("tests/kernels/test_native_stages.py::"
           "test_mixed_decode_logits_are_the_two_calls_logits",)),
    Plant("one-call-takes-prefills", "the one-call decode step takes a prefill batch",
          "dualpace/model/stages.py",
          "                and batch.is_decode and self._decode_sized(batch.num_rows))",
          "                and self._decode_sized(batch.num_rows))",
          ("tests/kernels/test_native_stages.py::test_decode_layers_declines_what_it_cannot_run",)),
    Plant("one-call-embeds-the-next-id", "the one-call decode step embeds each row's id + 1",
          "cext/decode_layers.c",
          "(const char *)dm->embed + (size_t)input_ids[r] * H * esz;",
          "(const char *)dm->embed + (size_t)(input_ids[r] + 1) * H * esz;",
          ("tests/kernels/test_native_stages.py::"
           "test_decode_logits_embeds_as_pre_layer_and_refuses_a_bad_id",)),
    Plant("one-call-id-bound-off-by-one", "the one-call decode step takes the id one past "
          "the embedding", "cext/decode_layers.c",
          "input_ids[r] >= dm->embed_rows) return -7;",
          "input_ids[r] > dm->embed_rows) return -7;",
          ("tests/kernels/test_native_stages.py::"
           "test_decode_logits_embeds_as_pre_layer_and_refuses_a_bad_id",)),
    Plant("one-call-greedy-last-row-only", "the one-call decode step's argmax covers the "
          "first row only", "cext/decode_layers.c",
          "return dp_argmax_rows(logits, T, dm->vocab, greedy, isa, nt);",
          "return dp_argmax_rows(logits, 1, dm->vocab, greedy, isa, nt);",
          ("tests/kernels/test_native_stages.py::"
           "test_decode_logits_is_decode_layers_then_post_layer_in_one_call",)),
    Plant("given-argmax-despite-temperature", "argmaxes handed to the sampler are taken for "
          "rows that sample at a temperature", "dualpace/sampling/sampler.py",
          "    return all(r.temperature <= 0.0 and r.penalties is None for r in rows)",
          "    return all(r.penalties is None for r in rows)",
          ("tests/sampling/test_sampler.py",)),
    Plant("gpu-step-head-apart", "the GPU worker's decode step runs its LM head in a call "
          "of its own again", "dualpace/runtime/gpu_worker.py",
          "            if (all(s.sample and s.next_token == -2 for s in seqs)\n",
          "            if (False and all(s.sample and s.next_token == -2 for s in seqs)\n",
          ("tests/runtime/test_one_call_decode.py",)),
    Plant("cpu-step-head-apart", "the CPU worker's Full-CPU step runs its LM head in a call "
          "of its own again", "dualpace/runtime/cpu_worker.py",
          "            if route == FULL_CPU else None",
          "            if False else None",
          ("tests/runtime/test_one_call_decode.py",)),
    Plant("team-gated-on-own-word", "the decode team's idle wait reads its own tier's "
          "occupancy word instead of the other's", "dualpace/runtime/worker_main.py",
          "                team.set_gate(peer.address)",
          "                team.set_gate(mine.address)",
          ("tests/runtime/test_thread_share.py::"
           "test_a_served_run_uses_every_core_while_one_tier_works",)),
    Plant("team-ignores-gate", "the team's helpers spin the long budget out whatever the "
          "other tier does", "cext/team.c",
          "    const int other_busy = g && __atomic_load_n(g, __ATOMIC_RELAXED);",
          "    const int other_busy = 0 && g;", ("tests/kernels/test_team.py",)),
    Plant("team-spins-without-yielding", "the team's helpers spin out the long budget "
          "without giving way to other threads on their core", "cext/team.c",
          "            if (next == SPIN_YIELDING) sched_yield();", "",
          ("tests/kernels/test_team.py",)),
    Plant("team-parks-at-once", "the team's helpers sleep right after each call, gate or not",
          "cext/team.c",
          "    if (ns < __atomic_load_n(&T.short_ns, __ATOMIC_RELAXED)) return SPIN;",
          "    return PARK;", ("tests/kernels/test_team.py",)),
    Plant("gated-waits-on-full-host", "the gated selection has no liveness rule: with the host "
          "KV full of waiting decodes and no GPU work it waits for ever",
          "dualpace/engine/llm_engine.py",
          "        if not sel.cpu and gpu.tokens == 0:\n            sel = self._gated_liveness(",
          "        if False:\n            sel = self._gated_liveness(",
          ("tests/sim/test_simulator.py::"
           "test_gated_runs_on_when_waiting_decodes_fill_the_host_pool",)),
    Plant("cpu-head-without-room", "the CPU round's progress guarantee preempts nobody",
          "dualpace/engine/cpu_round.py", "    for victim in victims:\n        if over <= 0:",
          "    for victim in victims[:0]:\n        if over <= 0:",
          ("tests/engine/test_scheduler_rounds.py::"
           "test_recompute_preemption_voids_the_mark",)),
    Plant("population-order-differs", "the round ranks its swap-ins before its admissions "
          "(Eq. 2's reserve) while step 7 commits the admissions first",
          "dualpace/engine/gpu_round.py",
          "    pop += [q for r, _ in plan.prefills for q in r.group() if q not in pop]\n"
          "    pop += [m.req for m in plan.swap_in]\n",
          "    pop += [m.req for m in plan.swap_in]\n"
          "    pop += [q for r, _ in plan.prefills for q in r.group() if q not in pop]\n",
          ("tests/sim/test_simulator.py::"
           "test_a_round_commits_the_gpu_population_in_the_order_it_checked_eq2_with",
           "tests/sim/test_simulator.py::test_small_pools_under_load_keep_every_invariant",
           "tests/engine/test_scheduler_properties.py")),
    Plant("cpu-rows-one-slope", "the simulator prices a CPU step's rows past the knee at the "
          "first slope", "dualpace/sim/costs.py",
          '+ c.get("batch_past_knee", c["batch"]) * (batch - below)',
          '+ c["batch"] * (batch - below)',
          ("tests/sim/test_simulator.py::test_cpu_rows_are_priced_on_two_slopes",)),
    Plant("cpu-context-free", "the CPU fit prices context freely instead of as the worker's "
          "attention timings do", "dualpace/sim/costs.py",
          '        if att["context"] > 0 and not contention:',
          "        if False:",
          ("tests/sim/test_simulator.py::test_cpu_rows_are_priced_on_two_slopes",)),
    Plant("workload-always-the-trace", "compare_policies names the trace path as its workload "
          "where it replayed random jobs", "bench/compare_policies.py",
          '    return args.trace if os.path.exists(args.trace) else "random"',
          "    return args.trace",
          ("tests/bench/test_compare_repeat.py::"
           "test_a_missing_trace_is_said_and_recorded_as_random_jobs",)),
    Plant("cpu-fit-weighted", "CPU steps are fitted weighted and rescaled, as GPU steps are, "
          "not to each batch size's mean", "dualpace/sim/costs.py",
          "            coefs, pred, size = fit(rows, (\"batch\", \"batch_past_knee\"), y - ctx,\n"
          "                                    weighted=False)",
          "            coefs, pred, size = fit(rows, (\"batch\", \"batch_past_knee\"), y - ctx,\n"
          "                                    weighted=True)",
          ("tests/sim/test_simulator.py::test_cpu_steps_are_priced_at_each_batch_sizes_mean",)),
    Plant("grid-row-first-pass", "the kernel grid reports each row's first pass, not its "
          "median one", "bench/cpu_attention.py",
          "    return {**ranked[len(ranked) // 2],", "    return {**samples[0],",
          ("tests/bench/test_grid_passes.py",)),
    Plant("cpu-knee-not-recorded", "a profile fitted at one knee is priced at whatever knee "
          "the code has now", "dualpace/sim/costs.py",
          '    below = min(batch, int(c.get("batch_knee", LEGACY_BATCH_KNEE)))',
          "    below = min(batch, CPU_BATCH_KNEE)",
          ("tests/sim/test_simulator.py::test_cpu_rows_are_priced_on_two_slopes",)),
    Plant("cpu-contended-fit-weighted", "with the contention term, CPU steps are fitted "
          "weighted again", "dualpace/sim/costs.py",
          "        coef, c = fit_contended(x, y, frac, weighted)",
          "        coef, c = fit_contended(x, y, frac)",
          ("tests/sim/test_contention.py::"
           "test_contended_cpu_steps_are_priced_at_each_batch_sizes_mean",)),
    Plant("jitter-span-4", "a jitter bin is split only where its sizes span 4x, so 12-row CPU "
          "steps draw the 2-row ones' tail", "dualpace/sim/costs.py",
          "JITTER_SPAN = 2.0", "JITTER_SPAN = 4.0", ("tests/sim/test_jitter.py",)),
    Plant("delivery-out-of-order", "simulated tokens reach the client out of order when a "
          "later one draws a shorter delay (negative gaps)", "dualpace/sim/delivery.py",
          "out.append(np.maximum.accumulate(got) if len(got) else got)", "out.append(got)",
          ("tests/sim/test_delivery.py",)),
    Plant("delivery-no-admission", "the simulated client's TTFT leaves out the front end's "
          "admission delay", "dualpace/sim/run.py",
          "await asyncio.sleep(delivery.admission_delay(len(engine.requests) + 1))",
          "delivery.admission_delay(len(engine.requests) + 1)",
          ("tests/sim/test_delivery.py",)),
    Plant("delivery-request-record-absolute", "the engine's request records stamp tokens on "
          "the clock instead of after arrival, so the join reads them as hours late",
          "dualpace/engine/llm_engine.py",
          '"tokens": [round(t - r.arrival, 6) for t in r.token_times]',
          '"tokens": [round(t, 6) for t in r.token_times]',
          ("tests/sim/test_simulator.py::test_the_engine_logs_every_step_with_its_work",)),
    Plant("delivery-first-token-pooled", "the simulator draws a request's first token from "
          "the later tokens' table, as before the split", "dualpace/sim/delivery.py",
          '        self.first_token = (_Table.of(section["first_token"]) if "first_token" in '
          'section\n',
          '        self.first_token = (self.token if "first_token" in section\n',
          ("tests/sim/test_delivery.py",)),
    Plant("delivery-fit-first-in-later", "the fit keeps each request's first token in the "
          "later tokens' table too", "dualpace/sim/delivery.py",
          "    later = np.concatenate([d[1:] for d in tok])",
          "    later = np.concatenate([d for d in tok])",
          ("tests/sim/test_delivery.py",)),
    Plant("delivery-pooled-only", "every policy is simulated with the delivery pooled over "
          "all three, so gpu-only draws gated's busier front end", "dualpace/sim/delivery.py",
          'own = (profile.get("delivery_by_policy") or {}).get(policy)', "own = None",
          ("tests/sim/test_delivery.py",)),
    Plant("delivery-concurrency-drops-last-token", "a request stops counting toward the "
          "concurrency at its last token's stamp", "dualpace/sim/delivery.py",
          'np.searchsorted(finishes, times, "left"))', 'np.searchsorted(finishes, times, "right"))',
          ("tests/sim/test_delivery.py::test_concurrency_by_hand",)),
    Plant("delivery-join-reuses-records", "two clients of the same prompt length are joined "
          "to one engine record", "dualpace/sim/delivery.py",
          "if (i not in taken and r[\"prompt_tokens\"]", "if (r[\"prompt_tokens\"]",
          ("tests/sim/test_delivery.py::test_join_pairs_each_client_with_its_own_record",)),
    Plant("delivery-small-bins-kept", "a concurrency bin with a handful of samples keeps its "
          "own table", "dualpace/sim/delivery.py",
          "if n >= MIN_SAMPLES or not kept:", "if n > 0 or not kept:",
          ("tests/sim/test_delivery.py::test_fit_tabulates_delays_by_concurrency",)),
    Plant("delivery-bin-off-by-one", "a concurrency at a bin's upper edge draws from the bin "
          "above", "dualpace/sim/delivery.py",
          'b = np.minimum(np.searchsorted(self.upper, conc, "left")',
          'b = np.minimum(np.searchsorted(self.upper, conc, "right")',
          ("tests/sim/test_delivery.py::test_draws_follow_the_bins_and_the_seed",)),
    Plant("delivery-own-tables-pooled", "each policy's delivery tables are fitted to every "
          "policy's requests", "bench/compare_policies.py",
          "own = {p: d for p in both if (d := fitted(served[p], clients[p])) is not None}",
          "own = {p: d for p in both if (d := fitted(sum(served.values(), []), "
          "sum(clients.values(), []))) is not None}",
          ("tests/bench/test_compare_repeat.py::"
           "test_the_profile_gets_a_delivery_model_where_the_sweep_kept_client_times",)),
    Plant("delivery-table-unchecked", "a delivery table of the wrong shape is read as it "
          "is", "dualpace/sim/delivery.py",
          "if q.ndim != 2 or q.shape[1] != len(LEVELS)", "if False and q.ndim != 2",
          ("tests/sim/test_delivery.py::test_a_malformed_table_is_refused",)),
    Plant("delivery-no-match-unexplained", "a fit where no client joined fails deep in numpy "
          "instead of saying why", "dualpace/sim/delivery.py",
          "    if not pairs:\n        raise ValueError(\"fit_delivery: no client",
          "    if False:\n        raise ValueError(\"fit_delivery: no client",
          ("tests/sim/test_delivery.py::test_fit_without_any_match_says_so",)),
    Plant("reference-warning-always", "--simulate warns of a single real sweep whatever the "
          "reference holds", "bench/compare_policies.py",
          'if real.get("sweeps") != 1:', "if False:",
          ("tests/bench/test_compare_repeat.py::"
           "test_a_validation_against_a_single_real_sweep_says_its_reference_is_noisy",)),
    Plant("amx-q-no-lo", "the AMX attention puts an fp32 q in as its bf16 part alone",
          "cext/attention_amx.c", "_mm512_mask_i32scatter_epi32(col + G + g, live, rows, pr, 4);",
          "_mm512_mask_i32scatter_epi32(col + G + g, live, rows, _mm512_setzero_si512(), 4);",
          (ATTN_TEST + "test_amx_tiles_keep_an_fp32_query_to_fp32_precision",)),
    Plant("amx-p-no-lo", "the AMX attention rounds an fp32 q's probabilities to bf16",
          "cext/attention_amx.c", "if (two) _tile_dpbf16ps(3, 6, 5);", "",
          (ATTN_TEST + "test_amx_tiles_keep_an_fp32_query_to_fp32_precision",)),
    Plant("amx-v-tail-read", "the AMX repack of V reads the slots past a sequence",
          "cext/attention_amx.c", "const __m512i r1 = tb < n ?", "const __m512i r1 = 1 ?",
          (ATTN_TEST + "test_amx_tiles_never_read_past_a_sequence",)),
    Plant("amx-p-tail-unmasked", "the AMX P tile takes the scores past the block's tokens",
          "cext/attention_amx.c", "lanes_below(live), idx", "lanes_below(AMX_T), idx",
          (ATTN_TEST + "test_amx_tiles_never_read_past_a_sequence",)),
    Plant("amx-no-rescale-tiles", "the AMX PV adds a block's products to accumulators it "
          "never loaded", "cext/attention_amx.c", "    _tile_loadd(3, ac, D * 4);",
          "    _tile_zero(3);",
          (ATTN_TEST + "test_amx_tiles_on_ragged_batches",)),
    Plant("softmax-periodic-wrong-head", "the periodic softmax gives each lane the next head's "
          "maximum", "cext/attention_simd.h", "per[j] = mn[j % G];", "per[j] = mn[(j + 1) % G];",
          (ATTN_TEST + "test_groups_that_do_not_divide_the_vector_width",)),
    Plant("softmax-periodic-sums-shifted", "the periodic softmax folds a head's sum from the "
          "next head's lanes", "cext/attention_simd.h",
          "for (int j = g; j < P * VW; j += G) t += sums[j];",
          "for (int j = (g + 1) % G; j < P * VW; j += G) t += sums[j];",
          (ATTN_TEST + "test_groups_that_do_not_divide_the_vector_width",)),
    Plant("qk-rest-slice-dropped", "QK leaves out a group's last slice when it is 1 head",
          "cext/attention_simd.h", "    DP_QK_REST(1) DP_QK_REST(2)", "    DP_QK_REST(2)",
          (ATTN_TEST + "test_groups_that_do_not_divide_the_vector_width",)),
    Plant("pv-slices-only-the-first", "a bf16 group of 8 runs PV over its first slice of 4 "
          "heads only", "cext/attention_simd.h",
          "        for (int g0 = 0; g0 < G; g0 += gs)",
          "        for (int g0 = 0; g0 < gs; g0 += gs)",
          (ATTN_TEST + "test_every_listed_head_dim_group_and_block_size",)),
    Plant("pv-pairs-left-in-pair-order", "PV's accumulators stay in the even/odd order where "
          "only PV took the pairs (bf16 G 4-8)", "cext/attention_body.h",
          "    if (pv_pairs)  /* the accumulators back", "    if (pairs)  /* the accumulators back",
          (ATTN_TEST + "test_every_listed_head_dim_group_and_block_size",)),
    Plant("qk-rest-capped-at-4", "an fp32 group of 5-8 heads, whole in one QK tile, gets no "
          "scores (the rest capped at the bf16 slice)", "cext/attention_simd.h",
          "        if ((r) <= QK_GT_KV(dtype)) qk_slice(",
          "        if ((r) <= 4) qk_slice(",
          (ATTN_TEST + "test_groups_that_do_not_divide_the_vector_width",)),
    Plant("attention-bench-dtype-traceback", "cpu_attention's --dtypes dies with a traceback "
          "on an unknown name", "bench/cpu_attention.py", "        ap.error(str(e))",
          "        raise",
          ("tests/bench/test_attention_dtypes.py::"
           "test_an_unknown_dtype_is_a_usage_error_naming_the_choices",)),
    Plant("attention-bench-bf16-is-half", "cpu_attention's --dtypes bf16 measures float16",
          "bench/cpu_attention.py", '"bf16": torch.bfloat16,', '"bf16": torch.float16,',
          ("tests/bench/test_attention_dtypes.py::test_kv_dtype_names",)),
    Plant("amx-tiles-from-g4", "the AMX tiles take groups of 4, where they measured no faster",
          "cext/dp_internal.h", "#define DP_AMX_ATTN_MIN_G 8", "#define DP_AMX_ATTN_MIN_G 4",
          (ATTN_TEST + "test_amx_tiles_where_they_apply",)),
    Plant("amx-q-tiles-first-head", "every KV head of an AMX item takes the first head's q",
          "cext/attention_amx.c", "qb + (int64_t)h * D * N, a->scale,", "qb, a->scale,",
          (ATTN_TEST + "test_amx_tiles_over_head_ranges_and_segments",)),
    Plant("grid-groups-accept-zero", "cpu_attention's --grid-groups takes a group of 0",
          "bench/cpu_attention.py", "any(g < 1 for g in groups)", "any(g < 0 for g in groups)",
          ("tests/bench/test_grid_passes.py::test_grid_groups_are_checked_positive_integers",)),
    Plant("grid-context-in-tokens", "a grid row's context is not a whole number of blocks",
          "bench/cpu_attention.py", "    return -(-ctx // block_size) * block_size",
          "    return ctx", ("tests/bench/test_grid_passes.py::"
                            "test_grid_rows_reach_the_asked_kv_bytes_in_whole_blocks",)),
    Plant("llc-smallest-cache", "the last-level cache read as the smallest cache",
          "bench/common.py", "    return max(sizes) if sizes else None",
          "    return min(sizes) if sizes else None",
          ("tests/bench/test_grid_passes.py::test_cache_sizes_read_as_sysfs_writes_them",)),
    Plant("past-llc-layers-floor", "the past-the-cache bench model rounds its layers down",
          "bench/common.py", "    return max(1, -(-need // PAST_LLC_LAYER_PARAMS))",
          "    return max(1, need // PAST_LLC_LAYER_PARAMS)",
          ("tests/bench/test_grid_passes.py::"
           "test_the_past_llc_model_streams_at_least_the_asked_bytes",)),
    Plant("amx-head-dims-of-8", "the AMX tiles take head dims that are a multiple of 8",
          "cext/attention_amx.c", "D % AMX_TAIL == 0 && BS % AMX_T == 0",
          "D % 8 == 0 && BS % AMX_T == 0", (ATTN_TEST + "test_amx_tiles_where_they_apply",)),
    Plant("amx-tail-dropped", "the AMX QK leaves out the last 16 d of head dim 80",
          "cext/attention_amx.c",
          "    if (tail) {  /* the last 16 d: 32 bytes of each row, the q tile's 8 pairs */",
          "    if (0) {", (ATTN_TEST + "test_amx_tiles_on_ragged_batches",)),
    Plant("amx-pv-order-last-chunk", "the AMX item leaves a row's last whole chunk in the "
          "repack's order", "cext/attention_amx.c", "D / AMX_CH * AMX_CH);",
          "(D / AMX_CH - 1) * AMX_CH);", (ATTN_TEST + "test_amx_tiles_on_ragged_batches",)),
    Plant("amx-tail-v-pairs-swapped", "the AMX repack of head dim 80's last 16 d swaps the two "
          "tokens of a pair", "cext/attention_amx.c",
          "_mm512_cvtepu16_epi32(r0), _mm512_slli_epi32(_mm512_cvtepu16_epi32(r1), 16)));",
          "_mm512_cvtepu16_epi32(r1), _mm512_slli_epi32(_mm512_cvtepu16_epi32(r0), 16)));",
          (ATTN_TEST + "test_amx_tiles_on_ragged_batches",)),
    Plant("amx-tail-v-read", "the AMX repack of V's last 16 d reads the slots past a sequence",
          "cext/attention_amx.c", "const __m256i r1 = tb < n ?", "const __m256i r1 = 1 ?",
          (ATTN_TEST + "test_amx_tiles_never_read_past_a_sequence",)),
    Plant("amx-tail-q-lo-dropped", "the AMX q tile of head dim 80's last 16 d has no lo parts",
          "cext/attention_amx.c", "_mm512_mask_i32scatter_epi32(col + G + g, live, rows, pr, 4);",
          "_mm512_mask_i32scatter_epi32(col + G + g, live & (c * AMX_CH + AMX_TAIL < D ? "
          "0xFFFF : 0), rows, pr, 4);",
          (ATTN_TEST + "test_amx_tiles_keep_an_fp32_query_to_fp32_precision",)),
    Plant("per-sweep-pooled-fit", "compare_policies --per-sweep fits every sweep's profile to "
          "all the sweeps' steps", "bench/compare_policies.py",
          "[(Path(rep_args.out), runs)])",
          "[(out / f\"rep{j}\", r) for j, r in enumerate(reps, 1)])",
          ("tests/bench/test_compare_per_sweep.py",)),
    Plant("per-sweep-count-unchecked", "compare_policies --per-sweep validates a median of "
          "other sweeps than the directory holds", "bench/compare_policies.py",
          "    if sweeps != len(reps):", "    if False:",
          ("tests/bench/test_compare_per_sweep.py",)),
    Plant("per-sweep-takes-sim-profile", "compare_policies --per-sweep with --sim-profile "
          "goes on as if it were not given", "bench/compare_policies.py",
          "    if args.per_sweep and args.sim_profile:", "    if False:",
          ("tests/bench/test_compare_per_sweep.py",)),
    Plant("per-sweep-first-sweep", "compare_policies --per-sweep reports the first sweep's "
          "simulation instead of the median", "bench/compare_policies.py",
          "    median = {p: [median_run([s[p][k] for s in sims])",
          "    median = {p: [median_run([s[p][k] for s in sims[:1]])",
          ("tests/bench/test_compare_per_sweep.py",)),
    Plant("targets-ttft-in-seconds", "simulate --targets takes the P99 TTFT target in s "
          "where the summary compares ms", "dualpace/sim/cli.py",
          '"p99_ttft_ms": 1000 * vals[1]', '"p99_ttft_ms": vals[1]',
          ("tests/sim/test_targets.py",)),
    Plant("targets-ignored", "simulate --targets is parsed and then left unused",
          "dualpace/sim/cli.py",
          "    targets = targets or sweep_targets(",
          "    targets = sweep_targets(", ("tests/sim/test_simulator.py::"
                                          "test_cli_hardware_mode_json",)),
    Plant("gains-normalized-only", "simulate's gains leave out the P99 TTFT and ITL rates",
          "dualpace/sim/cli.py", "        for key, suffix in GAIN_RATES.items():",
          "        for key, suffix in list(GAIN_RATES.items())[:1]:",
          ("tests/sim/test_targets.py",)),
    Plant("one-sided-edge-swapped", "a rate on one side only is explained at the wrong edge "
          "of the sweep", "bench/compare_policies.py",
          "    k = 0 if where == \"below\" else len(runs) - 1",
          "    k = len(runs) - 1 if where == \"below\" else 0",
          ("tests/bench/test_histogram_quantile.py",)),
    Plant("stage-wait-ignored", "an assist call on a busy GPU is served at once, not at its "
          "step's next stage boundary", "dualpace/sim/workers.py",
          "            wait = r.to_boundary() / self._pace(r)", "            wait = 0.0",
          ("tests/sim/test_stage_boundary.py",)),
    Plant("assist-leaves-gpu-step", "an assist call served at a stage boundary does not "
          "lengthen the GPU step", "dualpace/sim/workers.py",
          "            r.work += call.gpu", "            r.work += 0.0",
          ("tests/sim/test_stage_boundary.py",)),
    Plant("idle-assist-free", "a GPU step issued while an idle GPU serves an assist call "
          "starts at once", "dualpace/sim/workers.py",
          "max(self.assist_until, self._now()) + call.gpu",
          "max(self.assist_until, self._now())",
          ("tests/sim/test_stage_boundary.py",)),
    Plant("stages-count-pre-post", "the GPU step's stage boundaries counted over N + 2 "
          "stages where the model folds them into N", "dualpace/sim/workers.py",
          "        stage = self.main / self.stages",
          "        stage = self.main / (self.stages + 2)",
          ("tests/sim/test_stage_boundary.py",)),
    Plant("fused-n-plus-one-calls", "Fused-Assist makes N post-attention calls plus a "
          "post-layer one (Eq. 7 has N - 1 and a fused final)", "dualpace/sim/costs.py",
          "            calls = (*[AssistCall(local / n, wait, gpu)] * (n - 1),",
          "            calls = (*[AssistCall(local / n, wait, gpu)] * n,",
          ("tests/sim/test_simulator.py::test_cpu_roofline_by_hand",)),
    Plant("scores-without-stage-wait", "Algorithm 1's roofline scores leave out q_x",
          "dualpace/sim/costs.py", "len(c.calls) * stage_wait", "0 * stage_wait",
          ("tests/sim/test_stage_boundary.py",)),
    Plant("calibration-meets-prefill", "calls may be issued during a population's last "
          "decode step, so they can wait behind the next prefill",
          "dualpace/profiler/run.py", "if k == self.steps - 1:", "if k == self.steps:",
          ("tests/profiler/test_calibration_load.py",)),
    Plant("calibration-back-to-back", "calibration calls follow each other at once",
          "dualpace/profiler/run.py",
          "pause = rng.uniform(0.0, step_s)", "pause = 0.0",
          ("tests/profiler/test_calibration_load.py",)),
    Plant("calibration-fixed-spacing", "calibration calls are spaced by a fixed pause",
          "dualpace/profiler/run.py",
          "pause = rng.uniform(0.0, step_s)", "pause = step_s / 2",
          ("tests/profiler/test_calibration_load.py",)),
    Plant("calibration-ready-before-pause", "the decoding check comes before the pause, so "
          "a call may follow a window that closed meanwhile",
          "dualpace/profiler/run.py",
          "        sleep(pause)\n        if not ready():\n"
          "            raise RuntimeError(\"calibration: GPU-main stopped decoding\")\n",
          "        if not ready():\n"
          "            raise RuntimeError(\"calibration: GPU-main stopped decoding\")\n"
          "        sleep(pause)\n",
          ("tests/profiler/test_calibration_load.py",)),
    Plant("rounds-case-by-case", "the decode-throughput cases are measured one after the "
          "other, every round of a case before the next case",
          "dualpace/profiler/run.py",
          "    for _ in range(s.repeats):\n        for key, fns in cases.items():\n",
          "    for key, fns in cases.items():\n        for _ in range(s.repeats):\n",
          ("tests/profiler/test_profile_run.py",)),
    Plant("rounds-fastest-rank", "a round's latency is the fastest rank's",
          "dualpace/profiler/run.py", "rounds[key].append(max(row) / s.iters)",
          "rounds[key].append(min(row) / s.iters)", ("tests/profiler/test_profile_run.py",)),
    Plant("rounds-unsynced", "a round's timing ends before the device finished its calls",
          "dualpace/profiler/run.py",
          "                    fn()\n                sync()\n                row.append",
          "                    fn()\n                row.append",
          ("tests/profiler/test_profile_run.py",)),
    Plant("primitives-one-after-the-other", "each (batch, primitive) has all its repeats "
          "before the next is timed",
          "dualpace/profiler/run.py",
          "    with torch.inference_mode():\n        rounds = interleaved_rounds(cases, s)\n"
          "    out: dict[int, dict[str, float]]",
          "    with torch.inference_mode():\n        rounds = {key: interleaved_rounds("
          "{key: fns}, s)[key] for key, fns in cases.items()}\n"
          "    out: dict[int, dict[str, float]]",
          ("tests/profiler/test_profile_run.py",)),
    Plant("decode-rounds-mean", "the CPU decode throughput takes the mean of its rounds",
          "dualpace/profiler/run.py",
          "latency = {key: statistics.median(r) for key, r in interleaved_rounds(cases, s)",
          "latency = {key: statistics.fmean(r) for key, r in interleaved_rounds(cases, s)",
          ("tests/profiler/test_profile_run.py",)),
    Plant("prefill-first-round", "the prefill throughput keeps only its first round",
          "dualpace/profiler/run.py",
          "b * n / statistics.median(rounds[(b, n)])", "b * n / rounds[(b, n)][0]",
          ("tests/profiler/test_profile_run.py",)),
    Plant("calibration-window-left-open", "a stopped load leaves calls let through",
          "dualpace/profiler/run.py",
          "                self.decoding.clear()\n                self.rt.gpu.send(P.Release",
          "                self.rt.gpu.send(P.Release",
          ("tests/profiler/test_calibration_load.py",)),
    Plant("half-stage-of-whole-step", "the profile's half stage forgets the N layers",
          "dualpace/profiler/run.py", "main_step / mc.num_layers / 2", "main_step / 2",
          ("tests/profiler/test_profile_run.py",)),
    Plant("back-to-back-at-boundary", "a call that follows its predecessor at once is "
          "taken as landing on a boundary",
          "dualpace/sim/workers.py", "        done = self.main - self.work\n",
          "        done = self.main - self.work\n        done = stage * round(done / stage)\n",
          ("tests/sim/test_stage_boundary.py",)),
    Plant("boundary-waits-a-whole-stage", "a call at a stage boundary waits a stage more",
          "dualpace/sim/workers.py", "return 0.0 if into <= DONE_EPS else stage - into",
          "return stage - into", ("tests/sim/test_stage_boundary.py",)),
    Plant("load-rows-overflow-pool", "the calibration load keeps more rows than the pool",
          "dualpace/profiler/run.py", "if self.per_req * rows > cfg.gpu_kv_blocks:",
          "if self.per_req * rows > 2 * cfg.gpu_kv_blocks:",
          ("tests/profiler/test_calibration_load.py",)),
    Plant("t_p-one-layer", "the post-attention primitive times layer 0 over and over",
          "dualpace/profiler/run.py", "m.post_attention(layer(), h, a)",
          "m.post_attention(0, h, a)", ("tests/profiler/test_profile_run.py",)),
    Plant("decode-sweep-one-layer", "the CPU decode sweep times layer 0 over and over",
          "dualpace/profiler/run.py", "                               m.layer(layer(), h, fb, kv)",
          "                               m.layer(0, h, fb, kv)",
          ("tests/profiler/test_profile_run.py",)),
    Plant("prefill-sweep-one-layer", "the prefill sweep times layer 0 over and over",
          "dualpace/profiler/run.py", "model.layer(layer(), h, fb, kv)",
          "model.layer(0, h, fb, kv)", ("tests/profiler/test_profile_run.py",)),
    Plant("sweep-kv-every-layer", "the one-layer sweeps allocate every layer's KV",
          "dualpace/profiler/run.py",
          "    kv.k, kv.v = kv.k * num_layers, kv.v * num_layers\n    return kv",
          "    return KVCache(num_layers, num_blocks, num_kv_heads, block_size, head_dim, "
          "dtype, device)", ("tests/profiler/test_profile_run.py",)),
    Plant("profile-assist-one-layer", "ProfileAssist's calls all run its first layer",
          "dualpace/runtime/gpu_worker.py",
          "self._run_assist(leader, self.assist, msg.op, next(turns), msg.rows)",
          "self._run_assist(leader, self.assist, msg.op, msg.layer, msg.rows)",
          ("tests/profiler/test_profile_run.py",)),
    Plant("slices-rows-never", "a bf16 model never slices its rows, whatever the CPU",
          "dualpace/model/native_stages.py",
          "self.slices_rows = self.mixed and torch_gemm_lacks_arithmetic(self.act_dtype)",
          "self.slices_rows = False", ("tests/kernels/test_native_stages.py",)),
    Plant("slices-rows-ignore-bf16-arithmetic", "bf16 slices even with AVX512_BF16",
          "dualpace/model/native_stages.py", "        return not feats[\"avx512_bf16\"]\n",
          "        return True\n", ("tests/kernels/test_native_stages.py",)),
    Plant("pre-rows-first-slots", "every slice of pre_rows appends at the first slots",
          "dualpace/model/native_stages.py",
          "positions[r:r + n], slots[r:r + n],", "positions[r:r + n], slots[:n],",
          ("tests/kernels/test_native_stages.py",)),
    Plant("head-rows-torch", "a sliced model's head over many rows stays torch's",
          "dualpace/model/stages.py",
          "self.native.final, chunk,\n"
          "                                      self.native.final_rows)",
          "self.native.final, chunk,\n                                      None)",
          ("tests/kernels/test_native_stages.py",)),
    Plant("mixed-chunks-always-sliced", "a mixed model slices its chunks on every CPU",
          "dualpace/model/stages.py",
          "        if not self.native.slices_rows:\n            return None\n", "",
          ("tests/kernels/test_native_stages.py",)),
    Plant("fp16-follows-bf16", "fp16 is sliced by the bf16 rule",
          "dualpace/model/native_stages.py", "    return not feats[\"amx_bf16\"]\n",
          "    return not feats[\"avx512_bf16\"]\n", ("tests/kernels/test_native_stages.py",)),
    Plant("profile-assist-layers-unchecked", "ProfileAssist takes layers = 0",
          "dualpace/runtime/gpu_worker.py",
          "        if msg.layers < 1:\n            raise ValueError(",
          "        if msg.layers < 0:\n            raise ValueError(",
          ("tests/profiler/test_profile_run.py",)),
    Plant("profile-assist-default-layers", "ProfileAssist walks two layers by default",
          "dualpace/runtime/protocol.py", "    layers: int = 1\n", "    layers: int = 2\n",
          ("tests/profiler/test_profile_run.py",)),
    Plant("g_x-one-layer", "the GPU microbenchmarks ask for one layer",
          "dualpace/profiler/run.py", "layer=0, layers=num_layers,", "layer=0, layers=1,",
          ("tests/profiler/test_profile_run.py",)),
    Plant("g_x-one-after-the-other", "each (batch, path)'s g_x has all its repeats before "
          "the next is timed",
          "dualpace/profiler/run.py",
          "    for _ in range(s.repeats):\n        for b, path, op in cases:\n"
          "            totals[(b, path)] += await run(b, op, 0, 1)\n",
          "    for b, path, op in cases:\n        for _ in range(s.repeats):\n"
          "            totals[(b, path)] += await run(b, op, 0, 1)\n",
          ("tests/profiler/test_profile_run.py",)),
    Plant("g_x-warmup-each-round", "every round of g_x warms up again",
          "dualpace/profiler/run.py", "totals[(b, path)] += await run(b, op, 0, 1)",
          "totals[(b, path)] += await run(b, op, s.warmup, 1)",
          ("tests/profiler/test_profile_run.py",)),
]


def _build_cext() -> None:
    """A plant in the C sources is a plant only once the module is rebuilt (and so is its
    removal)."""
    subprocess.run([sys.executable, "cext/build.py"], cwd=ROOT, check=True,
                   capture_output=True)


def run(plant: Plant) -> dict:
    path = ROOT / plant.file
    original = path.read_text()
    if original.count(plant.old) != 1:
        return {"id": plant.id, "error": f"plant text found {original.count(plant.old)} times"}
    t0 = time.monotonic()
    try:
        path.write_text(original.replace(plant.old, plant.new))
        if plant.file.startswith("cext/"):
            _build_cext()
        proc = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p",
                               "no:cacheprovider", *plant.tests], cwd=ROOT,
                              capture_output=True, text=True, timeout=900)
    finally:
        path.write_text(original)
        if plant.file.startswith("cext/"):
            _build_cext()
    tail = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-200:]
    return {"id": plant.id, "caught": proc.returncode == 1, "rc": proc.returncode,
            "summary": tail, "seconds": round(time.monotonic() - t0, 1)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    # SIGTERM (a killed job) unwinds like Ctrl-C, so the planted file is restored.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    results = []
    for p in PLANTS:
        if args.only and p.id not in args.only:
            continue
        r = run(p)
        results.append(r)
        if not args.json:
            print(f"{r['id']:28s} {'caught' if r.get('caught') else 'MISSED'}  "
                  f"{r.get('summary', r.get('error'))}", flush=True)
    if args.json:
        print(json.dumps({"plants": results}))
    return 0 if all(r.get("caught") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
