"""The scaling benchmark's report (:mod:`benchmarks.scaling`): its tables (:func:`tables`) and their record,
``data_scaling`` in ``benchmarks/results.json`` and the section "Data scaling" of ``BENCHMARKS.md``
(:func:`record`)."""

from __future__ import annotations

import json
from typing import Any, Dict

from benchmarks.recording import RESULTS, replace_benchmarks_section
from data_tools.fileio import write_json_atomic

HEADING = "## Data scaling (benchmarks/scaling.py)"


def tables(r: Dict[str, Any]) -> str:
    nprocs = r["setup"]["nprocs"]
    columns = (["rows", "days", "distinct videos", "convert s", "convert peak RSS MB",
                "loader rows/s on 1 core, rank 0 of 4 (per CPU second)", "rank 0 of 4 whole_day", "rank 0 of 1",
                f"train examples/s, nproc {nprocs[0]} (steady)", "peak RSS per worker MB"]
               + [c for n in nprocs[1:] for c in (f"nproc {n} examples/s", f"nproc {n} peak RSS per worker MB")])
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for s in r["sizes"] + ([r["ids_row"]] if r["ids_row"] else []):
        t, loader = s["train"][str(nprocs[0])], s["loader"]
        label = f"{s['rows']:,}" + (f" (ids row: {s['n_videos']:,} videos)" if s is r["ids_row"] else "")
        cells = [label, s["days"], f"{s['distinct_videos']:,}", f"{s['convert_seconds']:.1f}",
                 f"{s['convert_peak_rss_mb']:.0f}",
                 f"{loader['0/4']['rows_per_sec']:,.0f} ({loader['0/4']['rows_per_cpu_second']:,.0f})",
                 f"{loader['0/4 whole_day']['rows_per_sec']:,.0f}", f"{loader['0/1']['rows_per_sec']:,.0f}",
                 f"{t['examples_per_sec']:,.0f} ({t['steady_examples_per_sec']:,.0f})",
                 f"{t['peak_rss_mb_per_worker']:.0f}"]
        for n in nprocs[1:]:
            tn = s["train"].get(str(n))
            cells += [f"{tn['examples_per_sec']:,.0f}", f"{tn['peak_rss_mb_per_worker']:.0f}"] if tn else ["-", "-"]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    lines += ["", "| figure | intercept | slope per million rows | R² | growth smallest to largest |",
              "|---|---|---|---|---|"]
    for name, ft in r["fits"].items():
        lines.append(f"| {name} | {ft['intercept']:,.1f} | {ft['slope_per_million_rows']:,.3f} | {ft['r2']:.3f} | "
                     f"{ft['growth_smallest_to_largest'] * 100:+.1f}% |")
    lines += ["", "| target | value | met |", "|---|---|---|"]
    for name, t in r["targets"].items():
        value = f"{t['value'] * 100:+.1f}%" if "growth" in name else f"{t['value']:,.0f} rows/s"
        lines.append(f"| {name} {t['target']} | {value} | {'yes' if t['met'] else 'NO'} |")
    lines += ["", f"Side by side at {r['sizes'][0]['rows']:,} rows, nproc {nprocs[0]}:", "",
              "| training setting | threads per worker | examples/s (steady) | peak RSS per worker MB |",
              "|---|---|---|---|"]
    for name, t in r["variants"].items():
        lines.append(f"| {name} | {t['threads_per_worker']} | {t['examples_per_sec']:,.0f} "
                     f"({t['steady_examples_per_sec']:,.0f}) | {t['peak_rss_mb_per_worker']:.0f} |")
    p, k = r["projection"], r["projection"]["kuairand_27k"]
    lines += ["", f"Projection for KuaiRand-27K ({k['rows']:,} rows, {k['days']} days, {k['videos']:,} videos):", ""]
    lines += [f"- {name}: {x['arithmetic']}" for name, x in p["figures"].items()]
    lines += ["", "Not projected by these fits:", ""] + [f"- {x}" for x in p["not_projected"]]
    return "\n".join(lines)


def record(r: Dict[str, Any], body: str) -> None:
    """``data_scaling`` in benchmarks/results.json (the other keys kept) and the BENCHMARKS.md section."""
    with open(RESULTS) as f:
        results = json.load(f)
    catalog = results.get("data_scaling", {}).get("catalog")  # benchmarks/scaling_catalog.py's, kept
    results["data_scaling"] = {**r, **({"catalog": catalog} if catalog else {})}
    write_json_atomic(RESULTS, results)
    s, load = r["setup"], r["load_average"]
    replace_benchmarks_section(HEADING, (
        f"{HEADING}\n\n`{r['command']}` on {r['date']}, {r['machine']}, at commit {r['commit']['commit'][:7]}"
        f"{'' if r['commit']['clean'] else ' (with uncommitted changes)'}. **Measured beside other work on this "
        f"shared machine** (1-minute load average {load['start']:.1f} at the start, {load['end']:.1f} at the end): one "
        f"measurement per figure; rates are lowered and made noisy by the contention (the loader's rows per CPU "
        f"second are not). Synthetic data, {s['rows_per_day']:,} rows a day, "
        + ", ".join(f"{v:,} {k[2:]}" for k, v in s["ids"].items()) + "; training "
        f"`data=kuairand`, {s['steps']} steps (`trainer.stop_at_step`), one sharding group"
        + (f", overrides {' '.join(s['train_overrides'])}" if s["train_overrides"] else "")
        + ". How each figure is measured: the docstring of `benchmarks/scaling.py`. Raw numbers: "
        f"`benchmarks/results.json` (`data_scaling`).\n\n{body}\n"))
