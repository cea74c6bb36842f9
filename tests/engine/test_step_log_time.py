"""serve --step-log: each record is stamped with the host's monotonic clock, the clock a
benchmark's runs are timed by in its own process (compare_policies --max-steal picks the
steps of its quiet points by it)."""

import io
import json
import time

from dualpace.engine.serving import ServingEngine


def test_each_logged_step_carries_the_time_it_was_logged():
    serving = ServingEngine.__new__(ServingEngine)  # the log writer alone, no workers
    serving._step_file = io.StringIO()
    record = {"kind": "gpu", "seconds": 0.01}
    t0 = time.monotonic()
    serving._log_step(record)
    serving._log_step(record)
    t1 = time.monotonic()
    lines = [json.loads(x) for x in serving._step_file.getvalue().splitlines()]
    assert [x["kind"] for x in lines] == ["gpu", "gpu"] and "t" not in record
    assert t0 - 1e-4 <= lines[0]["t"] <= lines[1]["t"] <= t1 + 1e-4
