"""The operator's monitoring files: /metrics parses as Prometheus exposition (prometheus_client's
own parser), and every query of the Grafana dashboard parses as PromQL (promql-parser) and
names only series that DualPace exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from dualpace.engine.metrics import _HELP, Metrics

SYSTEMD = Path(__file__).resolve().parents[2] / "systemd"
SUFFIXES = ("_bucket", "_sum", "_count")


def _exported(name: str) -> bool:
    if name in _HELP:
        return True
    return any(name.endswith(s) and _HELP.get(name[: -len(s)], ("",))[0] == "histogram"
               for s in SUFFIXES)


def test_metrics_text_parses_as_prometheus_exposition():
    parser = pytest.importorskip("prometheus_client.parser")
    m = Metrics()
    m.inc("dualpace:generation_tokens_total", 3, engine="cpu")
    m.observe("dualpace:cpu_tier_stall_seconds", 0.03)
    m.observe("dualpace:cpu_tier_stall_seconds", 4.0)
    families = {f.name: f for f in parser.text_string_to_metric_families(m.render())}
    stall = families["dualpace:cpu_tier_stall_seconds"]
    assert stall.type == "histogram"
    got = {(s.name, s.labels.get("le")): s.value for s in stall.samples}
    assert got[("dualpace:cpu_tier_stall_seconds_bucket", "0.04")] == 1
    assert got[("dualpace:cpu_tier_stall_seconds_bucket", "5.0")] == 2
    assert got[("dualpace:cpu_tier_stall_seconds_count", None)] == 2
    assert got[("dualpace:cpu_tier_stall_seconds_sum", None)] == pytest.approx(4.03)
    assert families["dualpace:cpu_tier_longest_stall_seconds"].type == "gauge"


def _grafana_queries() -> list[str]:
    dash = json.loads((SYSTEMD / "grafana-dashboard.json").read_text())
    return [t["expr"] for p in dash["panels"] for t in p["targets"]] + [
        v["definition"] for v in dash["templating"]["list"]]


def test_grafana_dashboard_queries_parse_and_use_exported_series():
    promql = pytest.importorskip("promql_parser")
    queries = _grafana_queries()
    assert len(queries) >= 10
    for q in queries:
        names = re.findall(r"dualpace:[a-z_:]+", q)
        assert names, q
        for n in names:
            assert _exported(n), f"{n} in {q!r} is not a DualPace metric"
        if q.startswith("label_values"):
            continue  # a Grafana templating function, not PromQL
        # Grafana substitutes its variables before Prometheus sees the query.
        promql.parse(q.replace("$__rate_interval", "1m").replace("$instance", ".*"))
    every = " ".join(queries)
    for needed in ("dualpace:generation_tokens_total", "dualpace:kv_blocks_used",
                   "dualpace:num_requests_running", "dualpace:num_requests_waiting_by_engine",
                   "dualpace:dense_assist_calls_total", "dualpace:kv_migrations_total",
                   "dualpace:cpu_tier_stall_seconds_bucket"):
        assert needed in every, f"the Grafana dashboard does not show {needed}"


def test_a_broken_query_would_be_caught():
    promql = pytest.importorskip("promql_parser")
    with pytest.raises(Exception, match="paren"):
        promql.parse("sum(rate(dualpace:generation_tokens_total[1m])")
    assert not _exported("dualpace:generation_tokens")


def test_prometheus_scrape_config_targets_the_default_port():
    cfg = yaml.safe_load((SYSTEMD / "prometheus-scrape.yml").read_text())
    job, = cfg["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    assert job["static_configs"][0]["targets"] == ["127.0.0.1:8000"]
