"""A worker's side of async scheduling: a decode of ``PREVIOUS_TOKEN`` takes the token the
worker sampled for the request in the step before, and only that one."""

from __future__ import annotations

import pytest

from dualpace.runtime import protocol as P
from dualpace.runtime.worker_state import RequestTable


def _table() -> RequestTable:
    t = RequestTable()
    t.add(P.NewRequest(req_id=7, sampling=P.SamplingSpec(temperature=0.0, top_p=1.0,
                                                         top_k=0, seed=0)))
    return t


def _decode(out_index: int, tokens=None) -> P.SeqStep:
    return P.SeqStep(req_id=7, token_ids=tokens or [P.PREVIOUS_TOKEN], start_pos=10 + out_index,
                     out_index=out_index)


def test_the_previous_token_is_the_one_sampled_in_the_step_before():
    t = _table()
    first = P.SeqStep(req_id=7, token_ids=[1, 2, 3], start_pos=0, out_index=0)
    t.record_sampled([first], [42])
    s = _decode(1)
    t.resolve_previous([s])
    assert s.token_ids == [42]
    t.record_sampled([s], [43])
    s2 = _decode(2)
    t.resolve_previous([s2])
    assert s2.token_ids == [43]


def test_a_previous_token_the_worker_did_not_sample_is_an_error():
    t = _table()
    with pytest.raises(ValueError, match="did not sample"):
        t.resolve_previous([_decode(1)])  # nothing sampled yet
    t.record_sampled([P.SeqStep(req_id=7, token_ids=[1], start_pos=0, out_index=0)], [5])
    with pytest.raises(ValueError, match="did not sample"):
        t.resolve_previous([_decode(2)])  # output 1 never came (its step failed)
    not_sampled = P.SeqStep(req_id=7, token_ids=[1], start_pos=0, out_index=1, sample=False)
    t.record_sampled([not_sampled], [-1])  # a non-final prefill chunk samples nothing
    with pytest.raises(ValueError, match="did not sample"):
        t.resolve_previous([_decode(2)])
    with pytest.raises(ValueError, match="alone"):
        t.resolve_previous([_decode(1, tokens=[3, P.PREVIOUS_TOKEN])])
