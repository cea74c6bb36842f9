"""The simulator's delivery model (dualpace/sim/delivery.py): the concurrency count, the
join of client and engine times, the fitted tables, the draws, and a simulated run whose
client times carry them."""

from __future__ import annotations

import numpy as np
import pytest

from dualpace.sim.delivery import LEVELS, MIN_SAMPLES, Delivery, concurrency, fit_delivery, join
from dualpace.sim.run import simulate
from dualpace.workload import Job

from .test_simulator import _Costs, _small_setup


def test_concurrency_by_hand():
    # requests [0, 1.5], [1, 3], [2, 4]: a request counts from its arrival through its last
    # token, both ends included
    arr, fin = np.array([0.0, 1.0, 2.0]), np.array([1.5, 3.0, 4.0])
    got = concurrency(arr, fin, np.array([0.5, 1.0, 1.5, 2.5, 4.0, 5.0]))
    assert got.tolist() == [1, 2, 2, 2, 1, 0]


def _request(arrival: float, prompt: int, n: int, step: float, send_gap: float,
             delay: float) -> tuple[dict, dict]:
    """An engine record and its client's view: sent ``send_gap`` before arrival, each of
    ``n`` tokens ``step`` apart, received ``delay`` after the engine stamped it."""
    tokens = [step * (k + 1) for k in range(n)]
    client_times = [arrival + t + delay for t in tokens]
    start = arrival - send_gap
    rec = {"kind": "request", "arrival": arrival, "prompt_tokens": prompt, "tokens": tokens}
    cli = {"start": start, "input_len": prompt, "ttft": client_times[0] - start,
           "itl": list(np.diff(client_times)), "ok": True}
    return rec, cli


def test_join_pairs_each_client_with_its_own_record():
    a_rec, a_cli = _request(10.000, 50, 5, 0.01, 0.002, 0.001)
    b_rec, b_cli = _request(10.001, 50, 5, 0.01, 0.002, 0.001)  # same length, 1 ms later
    early = {"kind": "request", "arrival": 9.0, "prompt_tokens": 50, "tokens": [0.01] * 5}
    short = {"kind": "request", "arrival": 9.9995, "prompt_tokens": 50, "tokens": [0.01]}
    failed = dict(a_cli, ok=False)
    pairs = join([b_rec, early, short, a_rec], [b_cli, a_cli, failed])
    assert [(c["start"], r["arrival"]) for c, r in pairs] == [(a_cli["start"], 10.000),
                                                              (b_cli["start"], 10.001)]


def test_fit_tabulates_delays_by_concurrency():
    # alone, each token arrives 0.5 ms late and the request 1 ms after its send; two at a
    # time, 2 ms and 3 ms: the two bins hold exactly those values
    recs, clis = [], []
    for k in range(3):  # alone: 3 x 100 tokens, 3 admissions
        r, c = _request(100.0 * k, 10, 100, 0.01, 0.001, 0.0005)
        recs.append(r)
        clis.append(c)
    for k in range(2):  # in pairs: arriving together, their tokens side by side
        for j in range(2):
            r, c = _request(1000.0 + 100 * k, 20 + j, 100, 0.01, 0.003, 0.002)
            recs.append(r)
            clis.append(c)
    fit = fit_delivery(recs, clis)
    assert fit["matched_requests"] == 7
    tok = fit["token"]
    assert tok["concurrency_upper"] == [1, 2]  # 300 and 400 samples: both bins kept
    assert np.allclose(tok["quantiles_ms"][0], 0.5) and np.allclose(tok["quantiles_ms"][1], 2.0)
    # 7 admissions, fewer than MIN_SAMPLES: one bin, its quantiles spanning both values
    adm = fit["admission"]
    assert adm["concurrency_upper"] == [2] and MIN_SAMPLES > 7
    assert adm["quantiles_ms"][0][0] == pytest.approx(1.0)
    assert adm["quantiles_ms"][0][-1] == pytest.approx(3.0)


def test_fit_tabulates_the_first_token_apart():
    # the first token of each request 1.5 ms late (its chunk opens the response), every later
    # one 0.25 ms: two tables, each exactly its own value
    recs, clis = [], []
    for k in range(MIN_SAMPLES):
        r, c = _request(10.0 * k, 10, 8, 0.01, 0.001, 0.00025)
        c["ttft"] += 0.00125
        c["itl"][0] -= 0.00125
        recs.append(r)
        clis.append(c)
    fit = fit_delivery(recs, clis)
    assert fit["first_token"]["concurrency_upper"] == [1]
    assert np.allclose(fit["first_token"]["quantiles_ms"][0], 1.5)
    assert np.allclose(fit["token"]["quantiles_ms"][0], 0.25)
    # one-token requests: no later tokens, so the later table is the first one's
    one = [_request(10.0 * k, 10, 1, 0.01, 0.001, 0.0005) for k in range(3)]
    fit1 = fit_delivery([r for r, _ in one], [c for _, c in one])
    assert fit1["token"] == fit1["first_token"]
    assert np.allclose(fit1["token"]["quantiles_ms"][0], 0.5)


def _const(ms: float) -> dict:
    return {"concurrency_upper": [1], "quantiles_ms": [[ms] * len(LEVELS)]}


def test_the_first_token_draws_from_its_own_table():
    engine = [list(0.01 * np.arange(1, 6)), list(0.5 + 0.01 * np.arange(1, 4))]
    d = Delivery({"admission": _const(1.0), "first_token": _const(4.0), "token": _const(1.0)})
    for t, got in zip(engine, d.client_times(engine, [0.0, 0.5])):
        assert (got - np.asarray(t)) * 1e3 == pytest.approx([4.0] + [1.0] * (len(t) - 1))
    # a profile fitted before the split: the first token draws from the one table
    old = Delivery({"admission": _const(1.0), "token": _const(2.0)})
    got = old.client_times(engine[:1], [0.0])[0]
    assert (got - np.asarray(engine[0])) * 1e3 == pytest.approx([2.0] * 5)


def test_fit_without_any_match_says_so():
    r, c = _request(5.0, 10, 3, 0.01, 0.001, 0.0)
    with pytest.raises(ValueError, match="no client request matched"):
        fit_delivery([r], [dict(c, input_len=11)])


def _linear(bins, scale=1.0) -> dict:
    """A table whose quantile at level u is u * scale * (bin index + 1) milliseconds."""
    return {"concurrency_upper": bins,
            "quantiles_ms": [list(LEVELS * scale * (i + 1)) for i in range(len(bins))]}


def test_draws_follow_the_bins_and_the_seed():
    d = Delivery({"admission": _linear([4]), "token": _linear([1, 2, 4])}, seed="s")
    u = np.array([0.0, 0.5, 1.0, 0.25])
    got = d.token.draw(np.array([1, 2, 3, 99]), u)  # 99: beyond the table, its last bin
    assert got * 1e3 == pytest.approx([0.0, 1.0, 3.0, 0.75])
    a = Delivery({"admission": _linear([4]), "token": _linear([1, 2, 4])}, seed="s")
    b = Delivery({"admission": _linear([4]), "token": _linear([1, 2, 4])}, seed="t")
    conc = np.full(50, 3)
    assert np.array_equal(a.token_delays(conc), d.token_delays(conc))
    assert not np.array_equal(a.token_delays(conc), b.token_delays(conc))


def test_a_stream_stays_in_order():
    d = Delivery({"admission": _linear([1]), "token": _linear([1], scale=50.0)}, seed="0")
    times = [list(np.arange(200) * 1e-3)]  # 1 ms apart, delays up to 50 ms
    got = d.client_times(times, [0.0])[0]
    assert np.all(np.diff(got) >= 0) and np.all(got >= np.asarray(times[0]))
    assert np.any(np.diff(got) == 0)  # some tokens queued behind a later-drawn one


def test_a_malformed_table_is_refused():
    with pytest.raises(ValueError, match="expected one row of 401"):
        Delivery({"admission": _linear([1]), "token": {"concurrency_upper": [1],
                                                       "quantiles_ms": [[0.0, 1.0]]}})


def test_simulated_client_times_carry_the_delays():
    # constant delays: admission 5 ms, every token 2 ms; one request alone: the engine's
    # timing is unchanged, the client's TTFT is later by both, its gaps unchanged
    const = {"admission": _const(5.0), "token": _const(2.0)}
    job = [Job([1] * 100, 4)]
    plain = simulate(_small_setup(), _Costs(), "dualpace", job, rate=1.0)
    late = simulate(_small_setup(), _Costs(), "dualpace", job, rate=1.0, delivery=const)
    assert late["mean_ttft_ms"] == pytest.approx(plain["mean_ttft_ms"] + 7.0)
    assert late["mean_itl_ms"] == pytest.approx(plain["mean_itl_ms"])
    assert late["engine_p99_itl_ms"] == plain["engine_p99_itl_ms"]
    assert late["mean_e2el_ms"] == pytest.approx(plain["mean_e2el_ms"] + 7.0)
    # the first token 3 ms late where the later ones are 2: the TTFT carries the 3, the
    # last token still the 2
    first = simulate(_small_setup(), _Costs(), "dualpace", job, rate=1.0,
                     delivery=dict(const, first_token=_const(3.0)))
    assert first["mean_ttft_ms"] == pytest.approx(plain["mean_ttft_ms"] + 8.0)
    assert first["mean_e2el_ms"] == pytest.approx(plain["mean_e2el_ms"] + 7.0)


def test_a_policy_is_simulated_with_its_own_delivery_where_the_profile_has_one():
    from dualpace.sim.delivery import policy_delivery

    pooled, own = {"admission": "pooled"}, {"admission": "gated's"}
    profile = {"delivery": pooled, "delivery_by_policy": {"gated": own}}
    assert policy_delivery(profile, "gated") is own
    assert policy_delivery(profile, "gpu-only") is pooled  # none of its own: the pooled one
    assert policy_delivery({"delivery": pooled}, "gated") is pooled  # an older profile
    assert policy_delivery({}, "gated") is None  # a hardware file, or --no-delivery
