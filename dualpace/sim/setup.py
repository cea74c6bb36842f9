"""The engine's shape for a simulation: the limits, pools and thresholds ``dualpace serve``
would resolve from the same options (profile mode), or what a hardware description sizes
(hardware mode), and the model shape from a checkpoint directory or a shipped name."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from dualpace.engine.state import Limits
from dualpace.kv.block_pool import blocks_for_tokens
from dualpace.profiler.fitting import choose_thresholds
from dualpace.runtime import protocol as P
from dualpace.runtime.step_work import gpu_step_work
from dualpace.sim.costs import RooflineCosts
from dualpace.sim.hardware import SETUPS, Hardware
from dualpace.sim.shape import ModelShape

ROUTE_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)  # the profiler's batch sizes
EPS = 0.0025  # Algorithm 1's tolerance (the paper's 0.25%)


@dataclass(frozen=True)
class SimSetup:
    gpu_blocks: int
    host_blocks: int
    block_size: int
    limits: Limits
    thresholds: tuple[int, int]
    num_layers: int
    stage_wait_s: float = 0.0  # hardware mode: the q_x Algorithm 1's scores charged a call


def setup_from_config(config) -> SimSetup:
    """The shape ``dualpace serve`` runs with for these options (dualpace/resolved.py)."""
    from dualpace.model.config import load_model_config
    from dualpace.resolved import resolve

    rc = resolve(config)
    limits = Limits(max_num_seqs=rc.max_num_seqs, gpu_token_limit=rc.max_num_batched_tokens,
                    cpu_batch_limit=rc.cpu_batch_limit, max_model_len=rc.max_model_len,
                    staging_blocks=rc.staging_blocks)
    return SimSetup(rc.gpu_kv_blocks, rc.host_kv_blocks, rc.block_size, limits,
                    tuple(rc.thresholds), load_model_config(config.model).num_layers)


def load_shape(model: str) -> ModelShape:
    """A checkpoint directory (its config.json) or a shipped name (sim/models.json)."""
    if Path(model).is_dir():
        from dualpace.model.config import load_model_config

        return ModelShape.of(load_model_config(model))
    table = json.loads((SETUPS.parent / "models.json").read_text())
    if model not in table or model.startswith("_"):
        names = ", ".join(k for k in table if not k.startswith("_"))
        raise ValueError(f"model: {model} is neither a checkpoint directory nor a shipped "
                         f"shape ({names})")
    return ModelShape(**table[model])


def setup_from_hardware(hw: Hardware, shape: ModelShape, *, block_size: int = 16,
                        max_num_seqs: int = 256, max_num_batched_tokens: int = 1024,
                        cpu_batch_limit: int = 256, max_model_len: int = 32768,
                        host_kv_gib: float | None = None,
                        thresholds: tuple[int, int] | None = None) -> SimSetup:
    """Pools from the box's memory; (P, F) from Algorithm 1 over the modeled routes (the
    profiler's rule on the roofline's Eq. 6 scores) unless given. Defaults: the paper's
    evaluation settings (C = 256, a 1,024-token GPU limit on the RTX 4090 box).

    The scores charge each assist call the stage-boundary wait q_x (Eq. 14) of a GPU-main
    step filled to the batched-token limit with one prompt chunk (``limit_step_wait``)."""
    block_bytes = block_size * shape.kv_bytes_per_token
    staging = blocks_for_tokens(max(max_num_batched_tokens, max_model_len),
                                block_size) + max_num_seqs
    costs = RooflineCosts(hw, shape)
    q = limit_step_wait(costs, max_num_batched_tokens)
    if thresholds is None:
        scores = costs.route_scores(
            [b for b in ROUTE_BATCHES if b <= cpu_batch_limit], stage_wait=q)
        thresholds = choose_thresholds(scores, shape.num_layers, EPS)
    limits = Limits(max_num_seqs=max_num_seqs, gpu_token_limit=max_num_batched_tokens,
                    cpu_batch_limit=cpu_batch_limit, max_model_len=max_model_len,
                    staging_blocks=staging)
    return SimSetup(hw.gpu_kv_blocks(shape.weight_bytes, block_bytes),
                    hw.host_kv_blocks(block_bytes, host_kv_gib), block_size, limits,
                    tuple(thresholds), shape.num_layers, q)


def limit_step_wait(costs: RooflineCosts, limit: int) -> float:
    """q_x for Algorithm 1 on a modeled box: the mean stage-boundary wait of a call during a
    GPU-main step of ``limit`` prompt tokens (one chunk from position 0). The paper's q_x
    comes from end-to-end calibration runs on the box (Appendix B, Eq. 12); a roofline has
    no such run, and the thresholds matter at the sustainable rate, where queued prompts
    keep the GPU's steps filled to the limit. A decode-only step would make q_x several
    times smaller (a 256-row decode step is ~20 ms on the RTX 4090 against ~150 ms here)."""
    chunk = P.SeqStep(req_id=0, token_ids=[0] * limit, start_pos=0)
    return costs.stage_wait(gpu_step_work(P.GpuBatch(step_id=0, seqs=[chunk])))
