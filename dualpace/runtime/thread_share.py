"""Thread counts that follow the other tier's occupancy, for a box without a GPU (issue 14).

With ``--gpu-device cpu`` the "GPU" worker and the CPU worker compute on the same cores. A
fixed split leaves half the machine idle whenever only one tier has work (a single stream
runs on the GPU tier alone). So by default both workers may use every allowed core: each
marks in shared memory whether it is in a step, and at each step and each layer it uses all
the cores while the other is idle and only its own share (the split) while the other works,
so two busy tiers do not oversubscribe the cores for longer than a layer.
"""

from __future__ import annotations

import torch

from dualpace.kernels import cpu as cpu_kernels
from dualpace.kernels.futex import FutexWord

OCCUPANCY_STRIDE = 64  # one cache line per tier's word
OCCUPANCY_SIZE = 2 * OCCUPANCY_STRIDE
TIER_INDEX = {"gpu": 0, "cpu": 1}


def occupancy_words(buf, kind: str) -> tuple[FutexWord, FutexWord]:
    """(this tier's word, the other tier's) in the occupancy segment."""
    mine = TIER_INDEX[kind]
    return (FutexWord(buf, mine * OCCUPANCY_STRIDE),
            FutexWord(buf, (1 - mine) * OCCUPANCY_STRIDE))


class ThreadShare:
    def __init__(self, own: int, total: int, mine: FutexWord, peer: FutexWord,
                 set_threads=None):
        """``own``: this worker's share of the cores; ``total``: all of them.
        ``set_threads(n)``: applies a thread count (default: torch's and the C kernels')."""
        if not 1 <= own <= total:
            raise ValueError(f"thread share: own {own} of total {total}")
        self.own, self.total = own, total
        self.mine, self.peer = mine, peer
        self.set_threads = set_threads or _set_threads
        self.current = 0
        self.switches = 0

    def check(self) -> int:
        """Pick the thread count for what comes next (a step, a layer); returns it."""
        n = self.own if self.peer.load() else self.total
        if n != self.current:
            self.set_threads(n)
            self.current = n
            self.switches += 1
        return n

    def native_args(self) -> tuple:
        """(the other tier's word, own, total): what ``check`` decides from, for the native
        decode step (StagedModel.decode_layers), which re-picks per layer in C."""
        return self.peer.address, self.own, self.total

    def begin(self) -> int:
        self.mine.store(1)
        return self.check()

    def end(self) -> None:
        self.mine.store(0)


def _set_threads(n: int) -> None:
    torch.set_num_threads(n)
    cpu_kernels.set_num_threads(n)
