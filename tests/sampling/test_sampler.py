"""Batched sampling: greedy, filters, seeds, batch independence, and the distribution."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from dualpace.kernels import cpu as cpu_kernels
from dualpace.sampling.logprobs import token_logprobs
from dualpace.sampling.params import SamplingParams
from dualpace.sampling.sampler import (
    SamplingRow,
    exponential_noise,
    exponential_race,
    plain_greedy,
    sample,
    sample_with_logprobs,
    step_seed,
)


def row(temperature=1.0, top_p=1.0, top_k=-1, seed=0, step=0):
    return SamplingRow(temperature, top_p, top_k, seed, step)


def test_greedy_and_top_k_1_take_the_argmax():
    logits = torch.randn(5, 50, generator=torch.Generator().manual_seed(0))
    best = logits.argmax(-1).tolist()
    assert sample(logits, [row(temperature=0.0)] * 5) == best
    assert sample(logits, [row(top_k=1, seed=s) for s in range(5)]) == best


def test_given_argmaxes_are_the_tokens_of_plain_greedy_rows_only():
    """sample_with_logprobs takes argmaxes computed already (the one-call decode step) as
    the tokens only where every row is greedy without penalties; otherwise, or when their
    count is not the rows', it samples the logits itself. Logprobs come from the logits
    either way."""
    from dualpace.sampling.penalties import Penalties

    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(4))
    marked = [7, 8, 9]  # not the argmaxes: shows which way the tokens came
    greedy = [row(temperature=0.0)] * 3
    assert plain_greedy(greedy) and plain_greedy([])
    toks, lps = sample_with_logprobs(logits, greedy, marked)
    assert toks == marked and lps == [None] * 3
    with_lp = [dataclasses.replace(r, logprobs=0) for r in greedy]
    toks, lps = sample_with_logprobs(logits, with_lp, marked)
    assert toks == marked and lps[1].logprob == pytest.approx(
        logits[1].log_softmax(-1)[8].item(), rel=1e-5)
    best = logits.argmax(-1).tolist()
    assert sample_with_logprobs(logits, greedy, marked[:2])[0] == best
    hot = [row(temperature=0.0), row(temperature=0.7, seed=3), row(temperature=0.0)]
    assert not plain_greedy(hot)
    assert sample_with_logprobs(logits, hot, marked)[0] == sample(logits, hot)
    pen = Penalties(repetition=1.3, prompt=(int(best[0]),))
    penalized = [dataclasses.replace(greedy[0], penalties=pen), *greedy[1:]]
    assert not plain_greedy(penalized)
    assert sample_with_logprobs(logits, penalized, marked)[0] == sample(logits, penalized)


def test_top_p_keeps_only_the_nucleus():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log().repeat(400, 1)
    got = sample(logits, [row(top_p=0.7, seed=s) for s in range(400)])
    assert set(got) == {0, 1}  # 0.5 + 0.3 covers 0.7; tokens 2 and 3 are cut


def test_top_k_keeps_only_k_tokens():
    logits = torch.tensor([3.0, 2.0, 1.0, 0.0]).repeat(300, 1)
    assert set(sample(logits, [row(top_k=2, seed=s) for s in range(300)])) == {0, 1}


def test_sampled_frequencies_follow_the_distribution():
    probs = torch.tensor([0.6, 0.25, 0.1, 0.05])
    n = 4000
    got = torch.tensor(sample(probs.log().repeat(n, 1), [row(seed=s) for s in range(n)]))
    freq = torch.bincount(got, minlength=4).float() / n
    # 4 standard deviations of a binomial proportion at n=4000 is < 0.031.
    assert torch.allclose(freq, probs, atol=0.031), freq


def test_temperature_sharpens():
    logits = torch.tensor([1.0, 0.0]).repeat(2000, 1)
    cold = sample(logits, [row(temperature=0.25, seed=s) for s in range(2000)])
    hot = sample(logits, [row(temperature=4.0, seed=s) for s in range(2000)])
    assert cold.count(0) > 1900 and 1050 < hot.count(0) < 1350


def test_same_seed_same_token_whatever_the_batch():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(6, 100, generator=g)
    alone = [sample(logits[i:i + 1], [row(seed=42 + i, step=3)])[0] for i in range(6)]
    mixed_rows = [row(seed=42 + i, step=3) for i in range(6)]
    mixed_rows[2] = row(temperature=0.0)  # a greedy neighbour changes nothing for others
    together = sample(logits, mixed_rows)
    for i in (0, 1, 3, 4, 5):
        assert together[i] == alone[i]
    # The step index changes the draw; the same (seed, step) repeats it.
    draws = {sample(logits[:1], [row(seed=9, step=s)])[0] for s in range(30)}
    assert len(draws) > 5
    assert sample(logits[:1], [row(seed=9, step=4)]) == sample(logits[:1], [row(seed=9, step=4)])


@pytest.mark.parametrize("field,value", [
    ("temperature", -0.1), ("temperature", "hot"), ("top_p", 0.0), ("top_p", 1.5),
    ("top_k", -2), ("top_k", 1.5), ("seed", -(2**63) - 1), ("seed", 2**63), ("max_tokens", 0),
    ("max_tokens", 2.0), ("n", 129), ("n", 0), ("stop", [1]), ("stop", [""]),
    ("stop_token_ids", [-1]), ("stop_token_ids", "x"), ("ignore_eos", "yes"),
])
def test_invalid_params_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


def test_params_normalise_stop_fields():
    p = SamplingParams(stop="###", stop_token_ids=[5, 6])
    assert p.stop == ("###",) and p.stop_token_ids == (5, 6)
    assert SamplingParams(temperature=0).greedy


def test_token_logprobs_hand_computed():
    # row 0: logits log(1), log(2), log(3), log(4) over 4 tokens -> probs 0.1 .. 0.4
    logits = torch.tensor([[0.0, math.log(2), math.log(3), math.log(4)], [5.0, 0.0, 0.0, 0.0],
                           [1.0, 2.0, 3.0, 4.0]])
    out = token_logprobs(logits, [1, 0, 3], [2, -1, 0])
    assert out[1] is None
    assert out[0].logprob == pytest.approx(math.log(0.2))
    assert out[0].top_ids == (3, 2)
    assert out[0].top_logprobs == pytest.approx((math.log(0.4), math.log(0.3)))
    assert out[2].top_ids == () and out[2].logprob == pytest.approx(
        4.0 - math.log(sum(math.exp(x) for x in (1.0, 2.0, 3.0, 4.0))))
    # the raw distribution: temperature and filters do not change them
    rows = [SamplingRow(0.5, 0.3, 1, 0, 0, 2)]
    toks, lps = sample_with_logprobs(logits[:1], rows)
    assert toks == [3] and lps[0].logprob == pytest.approx(math.log(0.4))


def _splitmix_ref(state: int, i: int) -> int:
    """SplitMix64's i-th output (1-based) from ``state``, in Python integers."""
    m = (1 << 64) - 1
    z = (state + i * 0x9E3779B97F4A7C15) & m
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
    return z ^ (z >> 31)


def test_noise_is_splitmix64_bit_for_bit():
    """The tensor generator equals SplitMix64 computed in Python integers (the device-free
    definition the CUDA test compares against), for keys that make the int64 ops wrap."""
    keys = [0, 1, (1 << 63) - 1, 0x0123456789ABCDEF, step_seed(7, 3)]
    vocab = 1000
    noise = exponential_noise(keys, vocab, "cpu")
    assert noise.dtype == torch.float64 and noise.shape == (len(keys), vocab)
    for r, key in enumerate(keys):
        for v in (0, 1, 2, 499, 999):
            u = ((_splitmix_ref(key, v + 1) >> 11) + 0.5) * 2.0 ** -53
            assert noise[r, v].item() == -math.log(u), (key, v)
    assert (noise > 0).all()
    # Exp(1): mean 1, and P(E > 1) = e^-1, over the 5000 draws.
    assert abs(noise.mean().item() - 1.0) < 0.06
    assert abs((noise > 1).double().mean().item() - math.exp(-1)) < 0.03


def test_noise_chunks_agree_with_one_pass(monkeypatch):
    from dualpace.sampling import sampler

    keys = list(range(40))
    whole = sampler.exponential_noise(keys, 300, "cpu")
    monkeypatch.setattr(sampler, "_NOISE_CHUNK", 1000)  # three rows a pass
    assert torch.equal(sampler.exponential_noise(keys, 300, "cpu"), whole)


def test_a_last_bit_difference_in_the_log_picks_the_same_tokens():
    """Each device takes its own float64 log of the same draws (CUDA's differed from the
    CPU's in the last bit on the H200); the race's token must not hang on that bit. Every
    element of the noise moved an ulp up or down at random, as another device's log might
    put it: the sampler's race here (the C kernel where built) picks the tokens of the
    moved noise, over peaked to flat distributions of a 128k vocabulary."""
    g = torch.Generator().manual_seed(3)
    keys = [step_seed(11, s) for s in range(64)]
    noise = exponential_noise(keys, 128256, "cpu")
    away = torch.where(torch.rand(noise.shape, generator=g, dtype=torch.float64) < 0.5,
                       torch.full_like(noise, math.inf), torch.zeros_like(noise))
    moved = torch.nextafter(noise, away)
    assert (moved != noise).all()
    for scale in (8.0, 3.0, 1.0, 0.3):
        probs = (torch.randn(len(keys), 128256, generator=g) * scale).softmax(-1)
        assert torch.equal(exponential_race(probs, keys),
                           (probs.double() / moved).argmax(-1)), scale


needs_cext = pytest.mark.skipif(not cpu_kernels.available(), reason="cext not built")


def _torch_race(probs: torch.Tensor, keys: list[int]) -> torch.Tensor:
    return (probs.double() / exponential_noise(keys, probs.shape[-1], "cpu")).argmax(dim=-1)


@needs_cext
@pytest.mark.parametrize("threads", [1, 2, 5])
def test_c_race_picks_the_tensor_races_token(threads, monkeypatch):
    """The C race gives the token of the tensor formula, row for row: sharp and flat
    distributions, top-k zeros, a 128k vocabulary, 64-bit keys, one row split over the
    threads in uneven spans and many rows over them."""
    monkeypatch.setattr(cpu_kernels, "_threads_override", threads)
    g = torch.Generator().manual_seed(threads)
    for rows, vocab, scale in ((1, 32000, 3.0), (1, 128256, 1.0), (37, 1000, 8.0),
                               (64, 50, 0.1), (3, 1, 1.0), (2, 7, 30.0)):
        probs = (torch.randn(rows, vocab, generator=g) * scale).softmax(-1)
        if vocab > 50:
            keep = probs.topk(min(40, vocab), dim=-1).indices
            probs = torch.zeros_like(probs).scatter(1, keep, probs.gather(1, keep))
        keys = [int(x) for x in torch.randint(0, 1 << 62, (rows,), generator=g)]
        keys[0] = (1 << 64) - 1 - keys[0]  # a key with the top bit set
        assert torch.equal(cpu_kernels.exponential_race(probs, keys), _torch_race(probs, keys))


@needs_cext
def test_c_race_returns_the_first_nan_like_torchs_argmax():
    probs = torch.full((2, 300), 1 / 300)
    probs[0, 123] = probs[0, 201] = float("nan")
    probs[1, 299] = float("nan")
    keys = [5, 6]
    got = cpu_kernels.exponential_race(probs, keys)
    assert got.tolist() == [123, 299] == _torch_race(probs, keys).tolist()


@needs_cext
def test_c_race_refuses_bad_arguments():
    with pytest.raises(ValueError, match="keys"):
        cpu_kernels.exponential_race(torch.ones(1, 4), [1 << 64])
    with pytest.raises(ValueError, match="rows"):
        cpu_kernels.exponential_race(torch.ones(2, 4), [1])
    with pytest.raises(ValueError, match="dtype"):
        cpu_kernels.exponential_race(torch.ones(1, 4, dtype=torch.float64), [1])


def test_sample_takes_the_c_race_on_cpu_and_the_tensor_race_without_it(monkeypatch):
    """Both paths sample the same tokens: a request's seed gives one token whichever
    implementation (or tier) ran its step."""
    from dualpace.sampling import sampler

    logits = torch.randn(6, 500, generator=torch.Generator().manual_seed(4))
    rows = [row(temperature=0.8, top_k=50 * (i % 2), seed=i, step=3) for i in range(6)]
    calls = []
    have_c = cpu_kernels.available()
    race = sampler.cpu_kernels.exponential_race
    monkeypatch.setattr(sampler.cpu_kernels, "exponential_race",
                        lambda *a: calls.append(1) or race(*a))
    with_c = sample(logits, rows)
    assert len(calls) == (1 if have_c else 0)
    monkeypatch.setattr(sampler.cpu_kernels, "available", lambda: False)
    assert sample(logits, rows) == with_c
    assert len(calls) == (1 if have_c else 0)


def test_candidate_filter_keeps_what_the_sorted_definition_keeps():
    """top-k / top-p among the topk candidates keep exactly the tokens (and logits) the
    whole-vocabulary sort keeps: peaked rows finished among the candidates, flat rows whose
    nucleus is wider than the candidates (sorted whole), top-k beyond the candidates, and
    rows that asked for neither filter, which pass through whole."""
    from dualpace.sampling.sampler import _CANDIDATES, _filter_by_sort, _filter_top_k_top_p

    g = torch.Generator().manual_seed(9)
    for vocab in (500, 32000):
        for scale in (8.0, 3.0, 0.3):  # peaked .. flat (a 0.9 nucleus of ~27k tokens)
            top_k = torch.tensor([0, 5, 40, 0, 0, 2 * _CANDIDATES, 40, 0])
            top_p = torch.tensor([0.9, 1.0, 0.9, 0.5, 0.99, 0.95, 1.0, 1.0])
            logits = torch.randn(len(top_k), vocab, generator=g) * scale
            got = _filter_top_k_top_p(logits, top_k, top_p)
            want = _filter_by_sort(logits, top_k, top_p)
            plain = (top_k <= 0) & (top_p >= 1.0)
            assert torch.equal(got[plain], logits[plain])
            assert torch.equal(got[~plain], want[~plain]), (vocab, scale)
    # the flat rows above needed the whole sort: their nucleus is wider than the candidates
    probs = (torch.randn(1, 32000, generator=g) * 0.3).softmax(-1)
    assert probs.topk(_CANDIDATES).values.sum() < 0.9
    # one token at 1% over a flat tail: it might close among the candidates (1% x 1024 >
    # 0.9) but does not (they hold ~4%), so it is sorted whole after the candidate pass
    tail = torch.randn(2, 32000, generator=g) * 1e-3
    tail[:, 0] = math.log(0.01 * 31999 / 0.99)
    top_k, top_p = torch.tensor([0, 0]), torch.tensor([0.9, 0.02])
    assert torch.equal(_filter_top_k_top_p(tail, top_k, top_p), _filter_by_sort(tail, top_k, top_p))
