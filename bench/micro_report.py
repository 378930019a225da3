"""The microbenchmark grid's result as text and as a plot: the table of rows, the goals, a one-line
header, and latency against V per (op, dtype) and batch."""

from __future__ import annotations

import math
from pathlib import Path

from .harness import report
from .harness.report import fmt
from .micro import DTYPES, FILTERS


def format_table(doc: dict) -> str:
    head = f"{'op':6s} {'B':>4s} {'K':>2s} {'V':>6s} {'dtype':5s} {'filt':4s} {'backend':12s} {'median_us':>10s} {'floor_us':>9s} {'x_floor':>8s} {'GB/s':>7s} {'%copy':>6s} {'extraMiB':>9s} {'vs_base':>8s} {'vs_eager':>8s}"
    lines = [head, "-" * len(head)]
    for r in doc["results"]:
        filt = ("on" if r["filters"] else "off") + ("+c" if r["check"] else "")
        extra = None if r.get("peak_extra_bytes") is None else r["peak_extra_bytes"] / 2**20
        if r.get("median_us") is None:
            lines.append(f"{r['op']:6s} {r['batch']:4d} {r['k']:2d} {r['vocab']:6d} {r['dtype']:5s} {filt:4s} {r['backend']:12s} {r.get('error', 'not run')}")
            continue
        pct = None if r.get("fraction_of_copy_bw") is None else 100 * r["fraction_of_copy_bw"]
        lines.append(
            f"{r['op']:6s} {r['batch']:4d} {r['k']:2d} {r['vocab']:6d} {r['dtype']:5s} {filt:4s} {r['backend']:12s} "
            f"{r['median_us']:10.1f} {fmt(r.get('floor_us'), '9.1f')} {fmt(r.get('x_floor'), '8.1f')} {fmt(r.get('achieved_gbs'), '7.1f')} "
            f"{fmt(pct, '5.1f')}% {fmt(extra, '9.2f', 'n/a')} {fmt(r.get('speedup_vs_baseline'), '7.1f')}x {fmt(r.get('speedup_vs_eager'), '7.1f')}x"
        )
    return "\n".join(lines)


def format_goals(doc: dict) -> str:
    width = max((len(g["goal"]) for g in doc["goals"]), default=0)
    return "\n".join(f"{g['goal']:{width}s}  {g['status']:6s}  {g['measured']}" for g in doc["goals"])


def format_header(doc: dict) -> str:
    v = doc["versions"]
    bw = doc["copy_bandwidth"].get("used_gbs")
    state = "complete" if doc["complete"] else f"INCOMPLETE ({doc['skipped_cases']} cases skipped)"
    return (
        f"{doc['device']} | torch {v['torch']} triton {v['triton']} transformers {v['transformers']} | {doc['date']} | "
        f"copy bandwidth {fmt(bw, '.1f')} GB/s | {doc['settings']['grid']} grid, {doc['elapsed_s']} s, {state}"
    )


def output_paths(doc: dict, out_dir: Path, tag: str | None = None) -> tuple[Path, Path]:
    """``<device>-<date>[-tag]``: .json and .png."""
    json_path = report.result_path(out_dir, None, doc["date"], doc["device_slug"], tag)
    return json_path, json_path.with_suffix(".png")


def write_plot(doc: dict, path: Path) -> bool:
    """Latency against V, one panel per (op, dtype) and batch, one line per backend; the floor dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    rows = [r for r in doc["results"] if r.get("median_us") and not r["check"]]
    if not rows:
        return False
    axes_of_grid = doc["settings"].get("grid_axes") or {}
    # The grid's batches only: a lone reference point would get a panel of its own.
    batches = sorted({r["batch"] for r in rows} & set(axes_of_grid.get("batch", ()))) or sorted({r["batch"] for r in rows})
    panels = [(op, dtype) for op in ("verify", "sample") for dtype in DTYPES if any(r["op"] == op and r["dtype"] == dtype for r in rows)]
    verify_ks = sorted({r["k"] for r in rows if r["op"] == "verify"})
    # One K per plot keeps the lines readable; the reference K (4) when the grid has it.
    k_shown = 4 if 4 in verify_ks else (verify_ks[-1] if verify_ks else 0)
    backends = list(dict.fromkeys(r["backend"] for r in rows))
    colors = {b: f"C{i}" for i, b in enumerate(backends)}
    fig, axes = plt.subplots(len(panels), len(batches), figsize=(3.6 * len(batches), 2.9 * len(panels)), squeeze=False)
    for i, (op, dtype) in enumerate(panels):
        for j, batch in enumerate(batches):
            ax = axes[i][j]
            chosen = [r for r in rows if r["op"] == op and r["dtype"] == dtype and r["batch"] == batch and (op == "sample" or r["k"] == k_shown)]
            for backend in backends:
                for filters, style, marker in ((False, "-", "o"), (True, ":", "^")):
                    pts = sorted((r["vocab"], r["median_us"]) for r in chosen if r["backend"] == backend and r["filters"] == filters)
                    if pts:
                        ax.plot([v for v, _ in pts], [t for _, t in pts], style, marker=marker, ms=4, color=colors[backend])
            floor = sorted({(r["vocab"], r["floor_us"]) for r in chosen if r.get("floor_us")})
            if floor:
                ax.plot([v for v, _ in floor], [t for _, t in floor], "--", marker="_", ms=12, color="black", lw=1)
            ax.set_xscale("log")
            ax.set_yscale("log")
            vocabs = sorted({r["vocab"] for r in chosen})
            if vocabs:
                ax.set_xticks(vocabs, [f"{round(v / 1000)}k" for v in vocabs])
                ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
            ax.set_title(f"{op} B={batch}" + (f" K={k_shown}" if op == "verify" else "") + f" {dtype}", fontsize=9)
            ax.tick_params(labelsize=7)
            ax.grid(True, which="both", alpha=0.3)
            if j == 0:
                ax.set_ylabel("median latency (us)", fontsize=8)
            if i == len(panels) - 1:
                ax.set_xlabel("vocabulary V", fontsize=8)
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=colors[b], marker="o", ms=3, label=b) for b in backends]
    handles += [
        Line2D([], [], color="gray", ls="-", marker="o", ms=4, label="filters off"),
        Line2D([], [], color="gray", ls=":", marker="^", ms=4, label=f"filters on (T={FILTERS['temperature']}, k={FILTERS['top_k']}, p={FILTERS['top_p']})"),
        Line2D([], [], color="black", ls="--", label="memory-traffic floor at copy bandwidth"),
    ]
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 4), fontsize=8, frameon=False)
    fig.suptitle(f"{doc['device']} ({doc['date'][:10]})", fontsize=10)
    fig.tight_layout(rect=(0, 0.04 + 0.02 * math.ceil(len(handles) / 4), 1, 0.97))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
