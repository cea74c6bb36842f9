"""The decode kernels' thread team (cext/team.c, dualpace/kernels/team.py): the same bits on
any team size, from concurrent callers and in a forked child; the idle wait that spins on
while the gate word reads 0 and sleeps soon after it reads 1; its settings' validation."""

from __future__ import annotations

import mmap
import os
import threading
import time

import pytest
import torch

from dualpace.kernels import cpu as cpu_kernels

from .test_linear import tile_rows

pytestmark = pytest.mark.skipif(not cpu_kernels.available(), reason="cext not built")

if cpu_kernels.available():
    from dualpace.kernels import team
    from dualpace.kernels.futex import FutexWord


@pytest.fixture
def spin_settings():
    """Restores the team's defaults (its settings are the process's)."""
    yield
    team.set_gate(None)
    team.set_spin()


def _problem(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    # 200 rows: 13 claim units of 16, so every team size splits them unevenly
    return torch.randn(5, 96, generator=g), torch.randn(200, 96, generator=g).bfloat16()


def _linear(x, w, threads: int, monkeypatch) -> torch.Tensor:
    monkeypatch.setattr(cpu_kernels, "_threads_override", threads)
    return cpu_kernels.linear(x, w)


def test_results_do_not_depend_on_the_team_size(monkeypatch):
    x, w = _problem()
    want = _linear(x, w, 1, monkeypatch)
    # On an AMX host the default path computes the whole 16-column tiles from x in bf16
    # (test_linear's rule; this assertion failed there until it said so).
    tiles = tile_rows(cpu_kernels.resolve_isa(None), w.dtype, x.shape[0], w.shape[0], x.shape[1])
    ref = x @ w.float().T
    ref[:, :tiles] = (x.bfloat16().float() @ w.float().T)[:, :tiles]
    torch.testing.assert_close(want, ref, rtol=1e-5, atol=1e-4)
    for threads in (2, 3, 4, 7):
        assert torch.equal(_linear(x, w, threads, monkeypatch), want), threads
    assert team.helpers() >= 6  # the team grew to the largest size asked


def test_concurrent_callers_get_their_own_results(monkeypatch):
    """A call made while another thread holds the team runs on its caller alone."""
    monkeypatch.setattr(cpu_kernels, "_threads_override", 2)
    problems = [_problem(seed) for seed in range(4)]
    wants = [cpu_kernels.linear(x, w) for x, w in problems]
    wrong = []

    def caller(i: int) -> None:
        x, w = problems[i]
        for _ in range(200):
            if not torch.equal(cpu_kernels.linear(x, w), wants[i]):
                wrong.append(i)

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []


def test_a_forked_child_builds_a_team_of_its_own(monkeypatch):
    x, w = _problem(1)
    want = _linear(x, w, 2, monkeypatch)  # the parent's team has a helper now
    pid = os.fork()
    if pid == 0:  # the child: a team call must neither hang nor differ
        ok = torch.equal(cpu_kernels.linear(x, w), want) and team.helpers() == 1
        os._exit(0 if ok else 1)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.01)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    pytest.fail("the forked child's team call hung")


def _parks_over(x, w, calls: int, gap_s: float) -> int:
    before = team.parks()
    for _ in range(calls):
        cpu_kernels.linear(x, w)
        time.sleep(gap_s)
    return team.parks() - before


def test_an_open_gate_keeps_the_helper_spinning(spin_settings, monkeypatch):
    x, w = _problem()
    monkeypatch.setattr(cpu_kernels, "_threads_override", 2)
    cpu_kernels.linear(x, w)
    buf = mmap.mmap(-1, 64)
    word = FutexWord(buf, 0)
    team.set_gate(word.address)
    # a long budget so that a descheduled helper on a busy machine does not run it out, and
    # one far beyond the wait below, so that only the gate can make the helper sleep there
    team.set_spin(short_ns=20_000, long_ns=30_000_000_000)
    time.sleep(0.01)  # a helper that parked under the old settings wakes on the next call
    cpu_kernels.linear(x, w)
    assert _parks_over(x, w, calls=20, gap_s=0.003) == 0
    # the other tier in a step: the helper sleeps once its short spin is over
    word.store(1)
    before = team.parks()
    cpu_kernels.linear(x, w)
    deadline = time.monotonic() + 5
    while team.parks() == before and time.monotonic() < deadline:
        time.sleep(0.002)
    assert team.parks() > before
    team.set_gate(None)
    word.close()
    buf.close()


def test_without_a_gate_the_long_budget_decides(spin_settings, monkeypatch):
    x, w = _problem()
    monkeypatch.setattr(cpu_kernels, "_threads_override", 2)
    team.set_gate(None)
    team.set_spin(short_ns=20_000, long_ns=2_000_000_000)
    cpu_kernels.linear(x, w)
    assert _parks_over(x, w, calls=20, gap_s=0.003) == 0
    team.set_spin(short_ns=0, long_ns=100_000)  # 0.1 ms, far below the 3 ms gaps
    cpu_kernels.linear(x, w)
    assert _parks_over(x, w, calls=10, gap_s=0.003) >= 5


@pytest.mark.parametrize("short_ns,long_ns", [(-1, 10), (10, 5), (0, -1)])
def test_bad_spin_budgets_are_refused(short_ns, long_ns, spin_settings):
    with pytest.raises(ValueError, match="short_ns <= long_ns"):
        team.set_spin(short_ns, long_ns)



def _child_cpu_share(x, w) -> float:
    """In a forked child pinned to one core: the share of that core a busy main thread gets
    while the team's helper (started there, so on the same core) spins out its long budget
    after a call, with no gate (so nothing but the budget stops it)."""
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    cpu_kernels.set_num_threads(2)
    team.set_gate(None)
    team.set_spin(short_ns=20_000, long_ns=30_000_000_000)
    cpu_kernels.linear(x, w)  # the helper now spins, for up to 30 s
    wall0, cpu0 = time.perf_counter(), time.thread_time()
    n = 0
    while time.thread_time() - cpu0 < 0.2:
        n += 1
    return (time.thread_time() - cpu0) / (time.perf_counter() - wall0)


def test_a_long_spin_gives_way_to_other_threads_on_its_core():
    """Past the short budget a spinning helper yields the core at every check: sharing one
    core with it, a busy thread gets nearly all of it (a plain spin would take half, and a
    thread woken on that core would wait out the spinner's time slice)."""
    x, w = _problem()
    r, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.write(wfd, f"{_child_cpu_share(x, w):.4f}".encode())
        finally:
            os._exit(0)
    os.close(wfd)
    try:
        with os.fdopen(r) as f:
            share = float(f.read() or "nan")
    finally:
        os.kill(pid, 9)  # its helper may still be spinning
        os.waitpid(pid, 0)
    assert share > 0.8, share
