"""`slashrt bench report`: the weak-scaling and skew sweeps of the multi-executor benchmarks.

Runs every query (YSB, RO, CM, NEXMark Q7) on 1..N executors in slash and uppar mode, then
YSB and RO under Zipf skew at N executors in both modes, each run checked against its
reference. Writes `report.json` (every run's JSON object) and two plots into `out`:

* ``scaling.png``: throughput per query and executor count, slash beside uppar;
* ``skew.png``: throughput against the Zipf exponent, slash beside uppar;
* ``ro_keys.png``: RO's throughput against its key range (distinct keys per epoch from a
  small fraction of the records to all of them), 1 executor, N slash, N uppar.

The returned summary holds the ratios the targets are stated in, from this one run.
"""

from __future__ import annotations

import json
from pathlib import Path

import structlog

from slashrt.bench import scaling

__all__ = ["run", "PARAMS"]

log = structlog.get_logger("slashrt.report")

# per query: its parameters in the sweeps (RO over a million keys so that its Zipf sampling
# stays cheap; the paper's RO point is state as large as the distinct keys, which this keeps)
PARAMS = {
    "ysb": {"campaigns": 1000},
    "ro": {"key_range": 1_000_000, "window_ms": 1000},
    "cm": {"jobs": 10_000},
    "nexmark": {},
}
DEFAULT_ZIPF = {"ysb": 0.0, "ro": 0.0, "cm": 1.1, "nexmark": 0.0}
SKEW_QUERIES = ("ysb", "ro")
RO_KEY_RANGES = (10_000, 1_000_000, 100_000_000)


def _one(query: str, executors: int, mode: str, zipf: float, events: int, params=None, **options) -> dict:
    params = PARAMS[query] if params is None else params
    result = scaling.bench(query, events=events, executors=executors, mode=mode, zipf=zipf, params=params, **options)
    log.info("report run", query=query, executors=executors, mode=mode, zipf=zipf,
             records_per_s=result["records_per_s"], correct=result["correct"])
    return result


def run(*, events: int, max_executors: int = 2, zipfs: list[float], out: str | Path, **options) -> dict:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    runs = []
    for query in PARAMS:
        for n in range(1, max_executors + 1):
            for mode in ("slash", "uppar") if n > 1 else ("slash",):
                runs.append(_one(query, n, mode, DEFAULT_ZIPF[query], events, **options))
    for query in SKEW_QUERIES:
        for zipf in zipfs:
            for mode in ("slash", "uppar"):
                runs.append(_one(query, max_executors, mode, zipf, events, **options))
    key_runs = []
    for keys in RO_KEY_RANGES:
        for n, mode in ((1, "slash"), (max_executors, "slash"), (max_executors, "uppar")):
            params = dict(PARAMS["ro"], key_range=keys)
            key_runs.append(_one("ro", n, mode, 0.0, events, params=params, **options))
    (out / "report.json").write_text(json.dumps(runs + key_runs, indent=1))

    def rate(query, n, mode, zipf=None, keys=None):
        zipf = DEFAULT_ZIPF[query] if zipf is None else zipf
        for r in runs if keys is None else key_runs:
            if (r["query"], r["executors"], r["mode"], r["zipf"]) == (query, n, mode, zipf):
                if keys is None or r["key_range"] == keys:
                    return r["records_per_s"]
        return None

    summary = {"query": "report", "events_per_executor": events, "max_executors": max_executors,
               "runs": len(runs) + len(key_runs), "correct": all(r["correct"] for r in runs + key_runs), "out": str(out)}
    for query in PARAMS:
        one, slash, uppar = rate(query, 1, "slash"), rate(query, max_executors, "slash"), rate(query, max_executors, "uppar")
        summary[f"{query}_scaling_{max_executors}x"] = round(slash / one, 3)
        summary[f"{query}_slash_over_uppar"] = round(slash / uppar, 3)
    for query in SKEW_QUERIES:
        summary[f"{query}_slash_by_zipf"] = [round(rate(query, max_executors, "slash", z) / 1e6, 2) for z in zipfs]
        summary[f"{query}_uppar_by_zipf"] = [round(rate(query, max_executors, "uppar", z) / 1e6, 2) for z in zipfs]
    for keys in RO_KEY_RANGES:
        one = rate("ro", 1, "slash", keys=keys)
        summary[f"ro_{keys}_keys_scaling_{max_executors}x"] = round(rate("ro", max_executors, "slash", keys=keys) / one, 3)
        summary[f"ro_{keys}_keys_slash_over_uppar"] = round(
            rate("ro", max_executors, "slash", keys=keys) / rate("ro", max_executors, "uppar", keys=keys), 3
        )
    _plot(runs, max_executors, zipfs, out, rate)
    return summary


def _plot(runs, max_executors: int, zipfs: list[float], out: Path, rate) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    queries = list(PARAMS)
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / (2 * max_executors - 1)
    bars = [(1, "slash")] + [(n, m) for n in range(2, max_executors + 1) for m in ("slash", "uppar")]
    for b, (n, mode) in enumerate(bars):
        xs = [q + b * width for q in range(len(queries))]
        ys = [rate(query, n, mode) / 1e6 for query in queries]
        ax.bar(xs, ys, width, label=f"{n} executor{'s' if n > 1 else ''}, {mode}",
               hatch="//" if mode == "uppar" else None)
    ax.set_xticks([q + width * (len(bars) - 1) / 2 for q in range(len(queries))], [q.upper() for q in queries])
    ax.set_ylabel("million records/s")
    ax.set_title("Weak scaling: each executor reads its own stream")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "scaling.png", dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(1, len(SKEW_QUERIES), figsize=(8, 3.5), squeeze=False)
    for ax, query in zip(axes[0], SKEW_QUERIES):
        for mode, style in (("slash", "o-"), ("uppar", "s--")):
            ax.plot(zipfs, [rate(query, max_executors, mode, z) / 1e6 for z in zipfs], style, label=mode)
        ax.set_title(f"{query.upper()}, {max_executors} executors")
        ax.set_xlabel("Zipf exponent of the keys")
        ax.set_ylabel("million records/s")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "skew.png", dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for (n, mode), style in (((1, "slash"), "^:"), ((max_executors, "slash"), "o-"), ((max_executors, "uppar"), "s--")):
        label = "1 executor" if n == 1 else f"{n} executors, {mode}"
        ax.plot(RO_KEY_RANGES, [rate("ro", n, mode, keys=k) / 1e6 for k in RO_KEY_RANGES], style, label=label)
    ax.set_xscale("log")
    ax.set_xlabel("RO key range (uniform keys)")
    ax.set_ylabel("million records/s")
    ax.set_ylim(bottom=0)
    ax.set_title("RO: state shipped grows with the distinct keys")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "ro_keys.png", dpi=110)
    plt.close(fig)
