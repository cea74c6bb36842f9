"""Drives the real worker processes without a scheduler: the test plays the engine, owning
both block pools and deciding every step, migration and route."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from dualpace.kv.block_pool import BlockPool, blocks_for_tokens
from dualpace.runtime import protocol as P
from dualpace.runtime.supervisor import Runtime


@dataclass
class Req:
    rid: int
    prompt: list[int]
    out: list[int] = field(default_factory=list)
    where: str = "gpu"
    blocks: list[int] = field(default_factory=list)
    known: dict[str, int] = field(default_factory=lambda: {"gpu": 0, "cpu": 0})

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.out


class Driver:
    def __init__(self, rt: Runtime):
        self.rt = rt
        self.gpu_pool = BlockPool(rt.config.gpu_kv_blocks, rt.config.block_size)
        self.host_pool = BlockPool(rt.config.host_kv.num_blocks, rt.config.block_size)
        self.bs = rt.config.block_size
        self.steps = itertools.count(1)
        self.routes: list[str] = []
        self.assist_calls = 0
        self._ids = itertools.count(1)

    def new(self, prompt: list[int]) -> Req:
        r = Req(next(self._ids), list(prompt))
        spec = P.SamplingSpec(temperature=0.0, top_p=1.0, top_k=-1, seed=0)
        self.rt.gpu.send(P.NewRequest(req_id=r.rid, sampling=spec))
        self.rt.cpu.send(P.NewRequest(req_id=r.rid, sampling=spec))
        return r

    def _pool(self, where: str) -> BlockPool:
        return self.gpu_pool if where == "gpu" else self.host_pool

    def _grow(self, r: Req, total_tokens: int) -> list[int]:
        need = blocks_for_tokens(total_tokens, self.bs) - len(r.blocks)
        new = self._pool(r.where).allocate(need) if need > 0 else []
        r.blocks += new
        return new

    def _step_for(self, r: Req, where: str) -> P.SeqStep:
        if r.known[where] == 0 and not r.out:  # prefill
            ids, start = r.prompt, 0
        else:
            ids, start = [r.tokens[-1]], len(r.tokens) - 1
        self._grow(r, start + len(ids))
        reset = r.known[where] == -1  # first step in this pool since a migration
        new = r.blocks if reset else r.blocks[r.known[where]:]
        r.known[where] = len(r.blocks)
        return P.SeqStep(req_id=r.rid, token_ids=ids, start_pos=start, new_blocks=new,
                         reset=reset, out_index=len(r.out))

    async def gpu_step(self, reqs: list[Req]) -> None:
        batch = P.GpuBatch(step_id=next(self.steps), seqs=[self._step_for(r, "gpu") for r in reqs])
        done = await self.rt.gpu.step(batch)
        for r, t in zip(reqs, done.tokens):
            r.out.append(t)

    async def cpu_step(self, reqs: list[Req], route: str = "", split: int = 0) -> P.StepDone:
        batch = P.CpuBatch(step_id=next(self.steps), seqs=[self._step_for(r, "cpu") for r in reqs],
                           route=route, split=split)
        done = await self.rt.cpu.step(batch)
        for r, t in zip(reqs, done.tokens):
            r.out.append(t)
        self.routes.append(done.route)
        self.assist_calls += done.assist_calls
        return done

    async def prefill_to_cpu(self, reqs: list[Req]) -> None:
        seqs = []
        for r in reqs:
            r.where = "cpu"
            r.blocks = self.host_pool.allocate(blocks_for_tokens(len(r.prompt), self.bs))
            r.known["cpu"] = -1
            seqs.append(P.SeqStep(req_id=r.rid, token_ids=r.prompt, start_pos=0,
                                  host_blocks=r.blocks))
        done = await self.rt.gpu.step(P.GpuBatch(step_id=next(self.steps), seqs=seqs))
        assert sorted(done.ready) == sorted(r.rid for r in reqs)
        for r, t in zip(reqs, done.tokens):
            r.out.append(t)

    async def _migrate(self, reqs: list[Req], dest: str) -> None:
        """Swap-out (dest "cpu") or swap-in (dest "gpu") of every token's KV but the last
        sampled one's, as one migration-only GPU step."""
        src_pool, dst_pool = self._pool(reqs[0].where), self._pool(dest)
        migs = []
        for r in reqs:
            n = len(r.tokens) - 1
            dst = dst_pool.allocate(blocks_for_tokens(n, self.bs))
            migs.append(P.Migration(req_id=r.rid, src_blocks=r.blocks, dst_blocks=dst,
                                    num_tokens=n))
        kind = {"swap_out": migs} if dest == "cpu" else {"swap_in": migs}
        done = await self.rt.gpu.step(P.GpuBatch(step_id=next(self.steps), **kind))
        assert sorted(done.ready) == sorted(r.rid for r in reqs)
        for r, m in zip(reqs, migs):
            src_pool.free(r.blocks)
            r.where, r.blocks = dest, m.dst_blocks
            # A swap-in hands the GPU worker the whole table; the CPU worker needs a reset.
            r.known[dest] = len(r.blocks) if dest == "gpu" else -1

    async def swap_out(self, reqs: list[Req]) -> None:
        await self._migrate(reqs, "cpu")

    async def swap_in(self, reqs: list[Req]) -> None:
        await self._migrate(reqs, "gpu")

    def release(self, reqs: list[Req]) -> None:
        for r in reqs:
            self._pool(r.where).free(r.blocks)
            r.blocks = []
        ids = [r.rid for r in reqs]
        self.rt.gpu.send(P.Release(req_ids=ids))
        self.rt.cpu.send(P.Release(req_ids=ids))
