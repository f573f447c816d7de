"""``python -m benchmarks.scaling_catalog [--videos 3e5,3e6,3.2e7] [--k27-rows-per-day 1e7] [--k27-days 3]
[--no-k27] [--no-record]``: how conversion and one rank's loader scale with the video catalog, and one
KuaiRand-27K-shaped conversion end to end.

The row axis (:mod:`benchmarks.scaling`) holds the catalog at 300,000 videos; KuaiRand-27K's is about
32M. Here the rows are fixed (3 days of 1M, ``--rows-per-day``, ``--days``) and the catalog grows
(``--videos``: the generator's ``n_videos``; the other ids are :data:`benchmarks.scaling_data.FIXED_IDS`),
then one data set shaped like KuaiRand-27K's days is converted: the largest catalog, ``--k27-days`` days of
``--k27-rows-per-day`` rows (27K: ~10.4M a day). Raw pieces are generated once under ``--out-dir`` (shared
with :mod:`benchmarks.scaling`) and reused.

Per data set: the converter's command (``python -m data_tools.convert``) into a fresh directory, its wall
time, its peak RSS and each phase's time and peak RSS as it prints them (:mod:`data_tools.phase_log`:
the per-phase high-water mark); the log's distinct videos; rank 0 of 4's loader (``own_row_groups``) on
one core, rows per wall and per CPU second (:func:`benchmarks.scaling_measure.loader_one_core`).

The 27K-shaped data set is then trained ``--k27-train-steps`` steps on the 2 x 2 layout (4 workers, sharding
groups of 2: each group's planner places the video table, as many rows as the log's distinct videos), no
checkpoints, for the peak RSS per worker (:func:`benchmarks.scaling_measure.train`).

The row axis' second point (``--row-days``, default 30: 30M rows) holds the smallest catalog and grows the days:
conversion peak RSS from 3M to 30M rows (target < 10%), as :mod:`benchmarks.scaling` measures it with training.

Judged: conversion peak RSS from the smallest to the largest catalog (target < 2x); the 27K-shaped
conversion's peak (target < 8 GB); the loader (target >= 1M rows per CPU second). The projection to the
whole release (322M rows over 31 days) is a line through the two measured row counts at the largest
catalog (3M rows at 1M a day, the 27K-shaped rows at 10M a day), written out; it mixes rows per day with
days (what the two points differ in), which the text says.

Output: tables on stdout and ``outputs/benchmarks/scaling-catalog.json``; unless ``--no-record``,
``data_scaling.catalog`` in ``benchmarks/results.json`` (every other key kept) and the section "Data
scaling: the catalog axis" of ``BENCHMARKS.md``. Limits: one measurement per figure; the machine's load is
recorded, not controlled; synthetic data (the Zipf skew decides how many of the catalog's videos a log
touches).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Any, Dict, List

from benchmarks.recording import REPO, RESULTS, code_state, command_line, machine, replace_benchmarks_section
from benchmarks.scaling_data import (FIXED_IDS, convert, data_facts, data_key, ensure_pieces, processed_root,
                                     raw_inputs)
from benchmarks.scaling_fits import fit
from benchmarks.scaling_measure import LOG_EVERY, loader_one_core, train
from data_tools.fileio import write_json_atomic

HEADING = "## Data scaling: the catalog axis (benchmarks/scaling_catalog.py)"
K27 = {"rows": 322_000_000, "days": 31, "videos": 32_000_000}
TARGETS = {"catalog_growth": 2.0, "k27_peak_mb": 8 * 1024, "loader_rows_per_cpu_second": 1_000_000}


def parse_args(argv) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.scaling_catalog", description=__doc__.split("\n\n")[0])
    ap.add_argument("--videos", default="3e5,3e6,3.2e7", help="catalog sizes, comma-separated")
    ap.add_argument("--rows-per-day", type=float, default=1e6)
    ap.add_argument("--days", type=int, default=3, help="days of the catalog axis' data sets (at least 3: held-out, "
                                                        "the loader's warm-up and its timed day)")
    ap.add_argument("--k27-rows-per-day", type=float, default=1e7, help="at most 1e7 (the generator's limit)")
    ap.add_argument("--k27-days", type=int, default=3, help="at least 3")
    ap.add_argument("--row-days", type=int, default=30,
                    help="the row axis' second point: the smallest catalog with this many days (0: none)")
    ap.add_argument("--no-k27", action="store_true", help="the catalog axis only")
    ap.add_argument("--k27-train-steps", type=int, default=50,
                    help="train the 27K-shaped data set this many steps on the 2 x 2 layout (4 workers, sharding "
                         "groups of 2) for its peak RSS per worker (0: not trained)")
    ap.add_argument("--out-dir", default=os.path.join(REPO, ".cache", "scaling"))
    ap.add_argument("--no-record", action="store_true", help="leave results.json and BENCHMARKS.md alone")
    args = ap.parse_args(argv)
    args.videos = sorted(int(float(x)) for x in args.videos.split(","))
    args.rows_per_day, args.k27_rows_per_day = int(args.rows_per_day), int(args.k27_rows_per_day)
    if args.k27_train_steps and args.k27_train_steps < 2 * LOG_EVERY:
        ap.error(f"--k27-train-steps: 0 or at least {2 * LOG_EVERY} (two logging intervals)")
    if len(args.videos) < 2 or args.days < 3 or args.k27_days < 3:
        ap.error("at least two catalog sizes, and three days a data set (held-out, the loader's warm-up, timed)")
    args.out_dir = os.path.abspath(args.out_dir)
    return args


def measure_one(out_dir: str, n_videos: int, rows_per_day: int, days: int) -> Dict[str, Any]:
    """One data set: generated when missing, converted (time, peak, phases), its loader on one core."""
    pieces = ensure_pieces(os.path.join(out_dir, "raw", data_key(n_videos, rows_per_day)), n_videos, rows_per_day,
                           [days])
    root = processed_root(out_dir, n_videos, rows_per_day, days)
    print(f"{n_videos:,} videos, {days} days of {rows_per_day:,} rows: converting", flush=True)
    row: Dict[str, Any] = {"n_videos": n_videos, "rows_per_day": rows_per_day, **convert(raw_inputs(pieces), root)}
    row.update(data_facts(root))
    worst = max(row["convert_phases"].items(), key=lambda p: p[1]["peak_rss_mb"])
    print(f"  convert {row['convert_seconds']:.0f} s, peak RSS {row['convert_peak_rss_mb']:.0f} MB (largest "
          f"phase: {worst[0]}), {row['distinct_videos']:,} distinct videos", flush=True)
    row["loader_0_of_4"] = loader_one_core(root, 0, 4, [], "own_row_groups")  # the kuairand preset's batches
    print(f"  loader rank 0 of 4: {row['loader_0_of_4']['rows_per_cpu_second']:,.0f} rows per CPU second", flush=True)
    return row


def projection(catalog: List[Dict[str, Any]], k27: Dict[str, Any] | None) -> Dict[str, Any]:
    """KuaiRand-27K's conversion from the line through the largest catalog's two row counts."""
    if k27 is None:
        return {"note": "no 27K-shaped run (--no-k27): nothing to project from"}
    base = catalog[-1]
    rows = [base["rows"], k27["rows"]]
    out = {}
    for figure, unit in (("convert_seconds", "s"), ("convert_peak_rss_mb", "MB")):
        line = fit(rows, [base[figure], k27[figure]])
        value = max(line["intercept"] + line["slope_per_million_rows"] * K27["rows"] / 1e6, k27[figure])
        out[figure] = {"value": value, "arithmetic": (
            f"max({line['intercept']:,.1f} + {line['slope_per_million_rows']:,.3f} {unit} per million rows x "
            f"{K27['rows'] / 1e6:,.0f}, {k27[figure]:,.0f} measured) = {value:,.0f} {unit}")}
    return out


def tables(r: Dict[str, Any]) -> str:
    phase_names = list(r["catalog"][0]["convert_phases"])
    cols = (["videos in catalog", "rows (days x rows a day)", "distinct videos in the log", "convert s",
             "convert peak RSS MB"] + [f"{p} peak MB" for p in phase_names]
            + ["loader rank 0 of 4 rows per CPU second (per wall second)"])
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for s in r["catalog"] + [x for x in (r.get("rows"), r["k27"]) if x]:
        label = f"{s['n_videos']:,}" + (" (27K-shaped)" if s is r["k27"] else " (row axis)" if s is r.get("rows") else "")
        loader = s["loader_0_of_4"]
        cells = [label, f"{s['rows']:,} ({s['days']} x {s['rows_per_day']:,})", f"{s['distinct_videos']:,}",
                 f"{s['convert_seconds']:.0f}", f"{s['convert_peak_rss_mb']:.0f}"]
        cells += [f"{s['convert_phases'][p]['peak_rss_mb']:.0f}" if p in s["convert_phases"] else "-"
                  for p in phase_names]
        cells.append(f"{loader['rows_per_cpu_second']:,.0f} ({loader['rows_per_sec']:,.0f})")
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "| target | value | met |", "|---|---|---|"]
    for name, t in r["targets"].items():
        lines.append(f"| {name} {t['target']} | {t['shown']} | {'yes' if t['met'] else 'NO'} |")
    lines += ["", f"Projection for KuaiRand-27K ({K27['rows']:,} rows, {K27['days']} days, {K27['videos']:,} "
              "videos), a line through the largest catalog's two row counts (they differ in rows a day too):", ""]
    lines += [f"- {name}: {x['arithmetic']}" for name, x in r["projection"].items() if isinstance(x, dict)]
    return "\n".join(lines)


def targets(catalog: List[Dict[str, Any]], k27: Dict[str, Any] | None,
            rows: Dict[str, Any] | None = None) -> Dict[str, Dict[str, Any]]:
    growth = catalog[-1]["convert_peak_rss_mb"] / catalog[0]["convert_peak_rss_mb"]
    out = {"convert_peak_rss_catalog_growth": {
        "target": f"< {TARGETS['catalog_growth']:.0f}x ({catalog[0]['n_videos']:,} to {catalog[-1]['n_videos']:,} videos)",
        "value": growth, "shown": f"{growth:.2f}x", "met": growth < TARGETS["catalog_growth"]}}
    if rows:
        more = rows["convert_peak_rss_mb"] / catalog[0]["convert_peak_rss_mb"] - 1
        out["convert_peak_rss_row_growth"] = {
            "target": f"< 10% ({catalog[0]['rows']:,} to {rows['rows']:,} rows, {rows['n_videos']:,} videos)",
            "value": more, "shown": f"{more * 100:+.1f}%", "met": more < 0.10}
    if k27:
        out["k27_shaped_convert_peak_rss_mb"] = {"target": "< 8 GB", "value": k27["convert_peak_rss_mb"],
                                                 "shown": f"{k27['convert_peak_rss_mb']:,.0f} MB",
                                                 "met": k27["convert_peak_rss_mb"] < TARGETS["k27_peak_mb"]}
    if k27 and "train_2x2" in k27:
        peak = k27["train_2x2"]["peak_rss_mb_per_worker"]
        out["k27_shaped_train_2x2_peak_rss_mb_per_worker"] = {"target": "< 6 GB", "value": peak,
                                                             "shown": f"{peak:,.0f} MB", "met": peak < 6 * 1024}
    lowest = min(s["loader_0_of_4"]["rows_per_cpu_second"] for s in catalog + [x for x in (rows, k27) if x])
    out["loader_rank0_of_4_rows_per_cpu_second_lowest"] = {
        "target": ">= 1M", "value": lowest, "shown": f"{lowest:,.0f}",
        "met": lowest >= TARGETS["loader_rows_per_cpu_second"]}
    return out


def record(r: Dict[str, Any], body: str) -> None:
    """``data_scaling.catalog`` in benchmarks/results.json (every other key kept) and the BENCHMARKS.md section."""
    with open(RESULTS) as f:
        results = json.load(f)
    results.setdefault("data_scaling", {})["catalog"] = r
    write_json_atomic(RESULTS, results)
    load = r["load_average"]
    replace_benchmarks_section(HEADING, (
        f"{HEADING}\n\n`{r['command']}` on {r['date']}, {r['machine']}, at commit {r['commit']['commit'][:7]}"
        f"{'' if r['commit']['clean'] else ' (with uncommitted changes)'}; 1-minute load average "
        f"{load['start']:.1f} at the start, {load['end']:.1f} at the end (a shared machine: times are lowered by "
        "the contention, peaks and CPU-second rates much less). Synthetic data, "
        + ", ".join(f"{v:,} {k[2:]}" for k, v in FIXED_IDS.items()) + ". How each figure is measured: the "
        "docstring of `benchmarks/scaling_catalog.py`. Raw numbers, each phase's seconds included: "
        f"`benchmarks/results.json` (`data_scaling.catalog`).\n\n{body}\n"))


def main(argv=None) -> int:
    args = parse_args(argv)
    command, load_start = command_line("benchmarks.scaling_catalog", argv), os.getloadavg()[0]
    catalog = [measure_one(args.out_dir, n, args.rows_per_day, args.days) for n in args.videos]
    rows = measure_one(args.out_dir, args.videos[0], args.rows_per_day, args.row_days) if args.row_days else None
    k27 = None if args.no_k27 else measure_one(args.out_dir, args.videos[-1], args.k27_rows_per_day, args.k27_days)
    if k27 and args.k27_train_steps:
        root = processed_root(args.out_dir, args.videos[-1], args.k27_rows_per_day, args.k27_days)
        with tempfile.TemporaryDirectory(prefix="scaling_catalog_") as workdir:
            k27["train_2x2"] = train(root, 4, args.k27_train_steps, [], workdir, group=2)
        print(f"  train 2 x 2: peak RSS per worker {k27['train_2x2']['peak_rss_mb_per_worker']:.0f} MB", flush=True)
    result = {"machine": machine(), "date": time.strftime("%Y-%m-%d"), "command": command, "commit": code_state(),
              "load_average": {"start": load_start, "end": os.getloadavg()[0]},
              "catalog": catalog, "rows": rows, "k27": k27, "targets": targets(catalog, k27, rows),
              "projection": projection(catalog, k27)}
    body = tables(result)
    print("\n" + body)
    out = os.path.join(REPO, "outputs", "benchmarks", "scaling-catalog.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    write_json_atomic(out, result)
    print(f"\nwrote {out}")
    if not args.no_record:
        record(result, body)
        print("recorded data_scaling.catalog in benchmarks/results.json and the section in BENCHMARKS.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
