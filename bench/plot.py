#!/usr/bin/env python3
"""Draws the headline benchmark figures from sundial-load's JSON lines.

    python3 -m pip install -r bench/requirements.txt
    python3 bench/plot.py results.jsonl [--out DIR]

Each line of the input is one scenario's JSON (`sundial-load --json-out results.jsonl ...`).
Writes, per store (embedded, postgres):
  lateness-vs-pending-<store>.png  lateness p50/p90/p99/max against the pending count
  lateness-vs-rate-<store>.png     lateness p50/p90/p99/max against the fire rate
  drain-vs-workers-<store>.png     drain rate against the number of workers
Repeated runs of one setting are drawn as their median with the spread (min..max) as error bars.
"""

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(path):
    rows = []
    for line in Path(path).read_text().splitlines():
        line = line.strip()
        if line.startswith("{"):
            rows.append(json.loads(line))
    return rows


def spread(values):
    med = statistics.median(values)
    return med, med - min(values), max(values) - med


def series(rows, x_key, y_of):
    by_x = defaultdict(list)
    for r in rows:
        by_x[r[x_key]].append(y_of(r))
    xs = sorted(by_x)
    meds, lo, hi = zip(*(spread(by_x[x]) for x in xs)) if xs else ((), (), ())
    return xs, meds, lo, hi


def lateness_plot(rows, x_key, xlabel, title, out, log_x=False):
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for q in ("p50", "p90", "p99", "max"):
        xs, meds, lo, hi = series(rows, x_key, lambda r, q=q: r["lateness_ms"][q])
        if xs:
            ax.errorbar(xs, meds, yerr=[lo, hi], marker="o", capsize=3, label=q)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("lateness (ms): worker receipt - run_at")
    if log_x:
        ax.set_xscale("symlog")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    print(f"wrote {out}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("input", help="JSON lines written by sundial-load --json-out")
    p.add_argument("--out", default=".", help="directory for the PNGs")
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = load(a.input)
    for store in sorted({r.get("store", "?") for r in rows}):
        mine = [r for r in rows if r.get("store") == store]
        late = [r for r in mine if r["scenario"] == "lateness"]
        if late:
            lateness_plot(
                late,
                "pending",
                "tasks pending a day ahead",
                f"lateness vs pending count ({store})",
                out / f"lateness-vs-pending-{store}.png",
                log_x=True,
            )
            lateness_plot(
                late,
                "fire_rate_per_s",
                "fire rate (tasks/s)",
                f"lateness vs fire rate ({store})",
                out / f"lateness-vs-rate-{store}.png",
            )
        drains = [r for r in mine if r["scenario"] == "drain"]
        if drains:
            xs, meds, lo, hi = series(drains, "workers", lambda r: r["rate_per_s"])
            fig, ax = plt.subplots(figsize=(7, 4.5))
            ax.errorbar(xs, meds, yerr=[lo, hi], marker="o", capsize=3)
            ax.set_xlabel("workers (one task per poll)")
            ax.set_ylabel("drain rate (tasks/s)")
            ax.set_title(f"drain rate vs workers ({store})")
            ax.grid(True, alpha=0.3)
            fig.tight_layout()
            target = out / f"drain-vs-workers-{store}.png"
            fig.savefig(target, dpi=120)
            plt.close(fig)
            print(f"wrote {target}")


if __name__ == "__main__":
    main()
