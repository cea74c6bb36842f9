"""What the HTTP front end adds between the engine and a client (the simulator's delivery model).

The engine stamps a token when it applies a step's result; a client sees it after the
front end has turned it into an SSE chunk and the client has read and parsed it. A request
likewise reaches the engine after the front end has parsed and tokenized it. On the box
where the simulator is validated, the front end, the client and both workers share two
cores, and these delays grow with the number of streams in flight (2026-12-05, 200 Azure
requests, dualpace: the per-token delay's 99th percentile was 1.4 ms with at most 2
requests in the engine and 4.5 ms with 17-32). Unmodelled, they left the simulated client
P99 ITL 15-23% short of the real one at 4-16 req/s while the engine's own P99 ITL agreed
within 8%.

The model is measured, not derived: ``fit_delivery`` joins a real run's client times
(bench/compare_policies.py keeps them) with the engine's per-request records
(``serve --step-log``, kind "request") on the host's monotonic clock, which both
processes read, and tabulates three distributions by the engine's concurrency (requests
between arrival and last token) at the moment: the admission delay (client send to engine
arrival), the first token's delivery delay (engine stamp to client receipt) and every
later token's, for each policy and pooled (``policy_delivery`` picks). The first token is
apart because its SSE chunk also opens the response (headers, the stream's start): on a
2-core Emerald Rapids VM (2026-12-07, 200 Azure requests a sweep, two sweeps alike) it took
0.73 ms at the median under gpu-only against 0.22 for the tokens after it (dualpace 0.46
against 0.25; gated, whose busier cores dwarf it, 1.3 against 1.2), and pooled with ~100
later tokens a request it was drawn at their size: gpu-only's simulated TTFT came out
~0.5 ms early (its P99 TTFT errors at 2 / 4 req/s -6.5 / -7.4% pooled, -5.4 / -4.9% apart,
the same sweeps and seeds). A profile fitted before the split has one pooled ``token`` table,
which then serves the first token too. The simulator
draws from them independently per request and per token (``Delivery``). Independence is a
simplification: the differences of consecutive tokens' measured delays spread 1.9x as
wide as the delays themselves (10th to 90th percentile, 2 req/s), more than independent
draws' sqrt(2), so there is no positive correlation that independent draws lose; a
stream stays in order (a token is never received before the one ahead of it). The
engine's timing is left as it is: the front end shares the engine's process, so its CPU
time is already inside the measured step costs. A concurrency beyond the largest
tabulated bin takes that bin: the table is not extrapolated.
"""

from __future__ import annotations

import bisect
import zlib
from dataclasses import dataclass

import numpy as np

# Quantile levels the tables keep: every 0.25%, so a P99 of per-token draws (what ITL's
# P99 reads) rests on measured points, not on the table's interpolation.
LEVELS = np.linspace(0.0, 1.0, 401)
MIN_SAMPLES = 200  # a bin with fewer samples than this merges into the bin below it
MATCH_WINDOW_S = 1.0  # a client send and its engine arrival are at most this far apart


def concurrency(arrivals: np.ndarray, finishes: np.ndarray, times: np.ndarray) -> np.ndarray:
    """Requests in the engine at each of ``times``: arrived at or before it, last token
    not before it (``arrivals`` and ``finishes`` sorted)."""
    return (np.searchsorted(arrivals, times, "right")
            - np.searchsorted(finishes, times, "left"))


def _bin_edges(max_concurrency: int) -> list[int]:
    """Upper edges of the concurrency bins: 1, 2, 4, 8, ... up to the largest seen."""
    edges = [1]
    while edges[-1] < max_concurrency:
        edges.append(edges[-1] * 2)
    return edges


def _tabulate(conc: np.ndarray, values_ms: np.ndarray) -> dict:
    """Quantile tables of ``values_ms`` per concurrency bin (bins with fewer than
    MIN_SAMPLES merged downward, so every table rests on enough samples)."""
    if len(values_ms) == 0:
        raise ValueError("fit_delivery: no samples to tabulate")
    edges = _bin_edges(int(conc.max()))
    kept: list[int] = []
    for upper in edges:
        lower = kept[-1] if kept else 0
        n = int(np.count_nonzero((conc > lower) & (conc <= upper)))
        if n >= MIN_SAMPLES or not kept:
            kept.append(upper)
        else:
            kept[-1] = upper  # too few: widen the previous bin
    tables, lower = [], 0
    for upper in kept:
        x = values_ms[(conc > lower) & (conc <= upper)]
        if len(x) == 0:  # the first bin's range held nothing: take the samples above it
            x = values_ms[conc > lower]
        tables.append([round(float(v), 4) for v in np.quantile(x, LEVELS)])
        lower = upper
    return {"concurrency_upper": kept, "quantiles_ms": tables}


def join(records: list[dict], clients: list[dict]) -> list[tuple[dict, dict]]:
    """Pairs each client request with the engine's record of it: the same prompt length,
    the first engine arrival at or after the client's send and within MATCH_WINDOW_S that
    no other client took, and as many tokens. Unmatched client requests are left out (a
    failed one has no engine record with all its tokens)."""
    recs = sorted(records, key=lambda r: r["arrival"])
    arrivals = [r["arrival"] for r in recs]
    taken: set[int] = set()
    pairs = []
    for c in sorted(clients, key=lambda c: c["start"]):
        if not c.get("ok") or c.get("ttft") is None:
            continue
        i = bisect.bisect_left(arrivals, c["start"])
        while i < len(recs) and recs[i]["arrival"] - c["start"] <= MATCH_WINDOW_S:
            r = recs[i]
            if (i not in taken and r["prompt_tokens"] == c["input_len"]
                    and len(r["tokens"]) == len(c["itl"]) + 1):
                taken.add(i)
                pairs.append((c, r))
                break
            i += 1
    return pairs


def fit_delivery(records: list[dict], clients: list[dict]) -> dict:
    """The profile's ``delivery`` section from a real run: ``records``, the engine's
    request records (kind "request"); ``clients``, the client's per-request ``start``
    (send time on the monotonic clock), ``input_len``, ``ttft``, ``itl`` and ``ok``."""
    pairs = join(records, clients)
    if not pairs:
        raise ValueError("fit_delivery: no client request matched an engine record (were "
                         "they logged on the same clock, in the same run?)")
    arr = np.sort([r["arrival"] for r in records])
    fin = np.sort([r["arrival"] + r["tokens"][-1] for r in records])
    adm_t, adm, tok_t, tok = [], [], [], []
    for c, r in pairs:
        adm_t.append(r["arrival"])
        adm.append(r["arrival"] - c["start"])
        engine = r["arrival"] + np.asarray(r["tokens"])
        client = c["start"] + c["ttft"] + np.concatenate(([0.0], np.cumsum(c["itl"])))
        tok_t.append(engine)
        tok.append(client - engine)
    first_t = np.array([t[0] for t in tok_t])
    first = np.array([d[0] for d in tok])
    later_t = np.concatenate([t[1:] for t in tok_t])
    later = np.concatenate([d[1:] for d in tok])
    if len(later) == 0:  # one-token requests only: their first tokens are all there is
        later_t, later = first_t, first
    return {"admission": _tabulate(concurrency(arr, fin, np.asarray(adm_t)),
                                   np.asarray(adm) * 1e3),
            "first_token": _tabulate(concurrency(arr, fin, first_t), first * 1e3),
            "token": _tabulate(concurrency(arr, fin, later_t), later * 1e3),
            "matched_requests": len(pairs), "client_requests": len(clients)}


def policy_delivery(profile: dict, policy: str) -> dict | None:
    """The delivery section a ``policy`` is simulated with: its own where the profile has
    one (``delivery_by_policy``), else the pooled one, else None. The front end's delay at a
    given concurrency depends on the policy: on the 2-core validation box (2026-12-05) the
    per-token P99 with 5-8 requests in the engine was 1.0 ms under gpu-only, 3.5 under
    dualpace and 2.8 under gated, whose CPU rows keep the cores busier; pooled, gpu-only's
    simulated client P99 ITL came out 31% long at 16 req/s."""
    own = (profile.get("delivery_by_policy") or {}).get(policy)
    return own or profile.get("delivery")


@dataclass
class _Table:
    upper: list[int]
    quantiles: np.ndarray  # bins x LEVELS, milliseconds

    @classmethod
    def of(cls, d: dict) -> _Table:
        q = np.asarray(d["quantiles_ms"], dtype=float)
        if q.ndim != 2 or q.shape[1] != len(LEVELS) or len(d["concurrency_upper"]) != len(q):
            raise ValueError(f"delivery table: {len(d['concurrency_upper'])} bins, quantiles "
                             f"of shape {q.shape}; expected one row of {len(LEVELS)} per bin")
        return cls(list(d["concurrency_upper"]), q)

    def draw(self, conc: np.ndarray, u: np.ndarray) -> np.ndarray:
        """Seconds: the inverse CDF of each one's bin at the uniform draws ``u``."""
        b = np.minimum(np.searchsorted(self.upper, conc, "left"), len(self.upper) - 1)
        out = np.empty(len(u))
        for k in np.unique(b):
            m = b == k
            out[m] = np.interp(u[m], LEVELS, self.quantiles[k])
        return out * 1e-3


class Delivery:
    """Draws admission and per-token delivery delays (``fit_delivery``'s tables), seeded:
    the same seed gives the same draws. A section without ``first_token`` (fitted before
    the first token was tabulated apart) draws the first token from ``token``."""

    def __init__(self, section: dict, seed: str = "0"):
        self.admission = _Table.of(section["admission"])
        self.token = _Table.of(section["token"])
        self.first_token = (_Table.of(section["first_token"]) if "first_token" in section
                            else self.token)
        self.rng = np.random.default_rng(zlib.crc32(seed.encode()))

    def admission_delay(self, conc: int) -> float:
        return float(self.admission.draw(np.array([conc]), self.rng.random(1))[0])

    def token_delays(self, conc: np.ndarray) -> np.ndarray:
        """Delays of a request's tokens in order, the first from ``first_token``."""
        conc = np.asarray(conc)
        u = self.rng.random(len(conc))
        return np.concatenate((self.first_token.draw(conc[:1], u[:1]),
                               self.token.draw(conc[1:], u[1:])))

    def client_times(self, engine_times: list[list[float]], arrivals: list[float]
                     ) -> list[np.ndarray]:
        """Each request's token receipts: its engine stamps plus a delay drawn at the
        engine's concurrency then (requests between arrival and last token, as fitted),
        kept in order as a stream is."""
        finishes = np.sort([t[-1] for t in engine_times if t])
        starts = np.sort(np.asarray(arrivals, dtype=float))
        out = []
        for times in engine_times:
            t = np.asarray(times, dtype=float)
            got = t + self.token_delays(concurrency(starts, finishes, t)) if len(t) else t
            out.append(np.maximum.accumulate(got) if len(got) else got)
        return out
