"""Figure 9's shape for a policy sweep: normalized latency, P99 TTFT and P99 ITL against the
offered rate, one line per policy, the targets dashed (matplotlib, a dev/bench extra)."""

from __future__ import annotations

from pathlib import Path

METRICS = [("mean_normalized_latency_s", "Normalized latency (s/token)"),
           ("p99_ttft_ms", "P99 TTFT (ms)"), ("p99_itl_ms", "P99 ITL (ms)")]


def plot_sweep(results: dict[str, list[dict]], targets: dict, path: Path) -> Path:
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("plots need matplotlib (pip install matplotlib), or leave out "
                         "--out") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for ax, (m, title) in zip(axes, METRICS):
        for policy, runs in results.items():
            ax.plot([r["request_rate"] for r in runs], [r[m] for r in runs], marker="o",
                    label=policy)
        if m in targets:
            ax.axhline(targets[m], linestyle="--", color="gray")
        ax.set_title(title)
        ax.set_xlabel("request rate (req/s)")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
