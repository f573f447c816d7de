"""The scaling benchmark's arithmetic (:mod:`benchmarks.scaling`): each figure as a series over the sizes
(:func:`series`), its least-squares line against rows (:func:`fit`), the targets (:func:`targets`), the
growth with distinct ids (:func:`id_growth`) and the projection for KuaiRand-27K's full log
(:func:`projection`)."""

from __future__ import annotations

import statistics
from typing import Any, Dict, List, Optional

# KuaiRand-27K's standard log (docs/data.md): 322M interactions over 31 days (2022-04-08..05-08).
KUAIRAND_27K = {"rows": 322_000_000, "days": 31, "videos": 32_000_000, "users": 27_285}


def fit(rows: List[int], values: List[float]) -> Dict[str, float]:
    """Least-squares line against millions of rows, and the growth from the smallest to the largest size."""
    import numpy as np

    x, y = np.asarray(rows, dtype=np.float64) / 1e6, np.asarray(values, dtype=np.float64)
    slope, intercept = np.polyfit(x, y, 1)
    ss_tot = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float(((y - (intercept + slope * x)) ** 2).sum()) / ss_tot if ss_tot > 0 else float("nan")
    return {"intercept": float(intercept), "slope_per_million_rows": float(slope), "r2": r2,
            "growth_smallest_to_largest": float(y[-1] / y[0] - 1.0)}


def series(sizes: List[Dict[str, Any]], nprocs: List[int]) -> Dict[str, List[float]]:
    """Each figure as a list over the sizes (the primary keys: rank 0 of 4, the first nproc)."""
    first = str(nprocs[0])
    out = {"convert_seconds": [s["convert_seconds"] for s in sizes],
           "convert_peak_rss_mb": [s["convert_peak_rss_mb"] for s in sizes],
           "loader_rows_per_sec_one_core": [s["loader"]["0/4"]["rows_per_sec"] for s in sizes],
           "loader_rows_per_cpu_second_one_core": [s["loader"]["0/4"]["rows_per_cpu_second"] for s in sizes],
           "loader_rows_per_sec_one_core_rank0_of_1": [s["loader"]["0/1"]["rows_per_sec"] for s in sizes],
           "loader_rows_per_sec_one_core_whole_day": [s["loader"]["0/4 whole_day"]["rows_per_sec"] for s in sizes],
           "loader_peak_rss_mb": [s["loader"]["0/4"]["peak_rss_mb"] for s in sizes],
           "train_examples_per_sec": [s["train"][first]["examples_per_sec"] for s in sizes],
           "train_steady_examples_per_sec": [s["train"][first]["steady_examples_per_sec"] for s in sizes],
           "train_peak_rss_mb_per_worker": [s["train"][first]["peak_rss_mb_per_worker"] for s in sizes]}
    for n in nprocs[1:]:
        out[f"train_examples_per_sec_nproc{n}"] = [s["train"][str(n)]["examples_per_sec"] for s in sizes]
        out[f"train_peak_rss_mb_per_worker_nproc{n}"] = [s["train"][str(n)]["peak_rss_mb_per_worker"] for s in sizes]
    return out


def targets(figures: Dict[str, List[float]], fits: Dict[str, Dict[str, float]]) -> Dict[str, Dict[str, Any]]:
    convert_growth = fits["convert_peak_rss_mb"]["growth_smallest_to_largest"]
    train_growth = fits["train_peak_rss_mb_per_worker"]["growth_smallest_to_largest"]
    loader = min(figures["loader_rows_per_sec_one_core"])
    return {"convert_peak_rss_growth": {"value": convert_growth, "target": "< 10%", "met": convert_growth < 0.10},
            "loader_rank0_of_4_one_core_rows_per_sec_lowest": {"value": loader, "target": ">= 1M",
                                                                  "met": loader >= 1e6},
            "train_peak_rss_per_worker_growth": {"value": train_growth, "target": "within 10%",
                                                 "met": abs(train_growth) <= 0.10}}


def id_growth(base: Dict[str, Any], ids: Dict[str, Any], nproc: int) -> Dict[str, Any]:
    """MB per million more videos between the smallest size and the same rows with a bigger catalog,
    counted two ways: per distinct video in the log and per video in the catalog (the feature file).
    Which one memory follows is not separable from one pair, so the projection gives both."""
    per = {"distinct": (ids["distinct_videos"] - base["distinct_videos"]) / 1e6,
           "catalog": (ids["n_videos"] - base["n_videos"]) / 1e6}
    if per["distinct"] <= 0:
        raise SystemExit(f"the ids row has {ids['distinct_videos']:,} distinct videos, the smallest size "
                         f"{base['distinct_videos']:,}: no growth with ids to measure (raise --ids-factor)")
    n = str(nproc)
    extra_mb = {"convert_peak_rss_mb": ids["convert_peak_rss_mb"] - base["convert_peak_rss_mb"],
                "train_peak_rss_mb_per_worker": (ids["train"][n]["peak_rss_mb_per_worker"]
                                                 - base["train"][n]["peak_rss_mb_per_worker"])}
    return {"extra_videos_millions": per, "extra_mb": extra_mb,
            "mb_per_million_videos": {fig: {k: mb / d for k, d in per.items()} for fig, mb in extra_mb.items()}}


def projection(sizes: List[Dict[str, Any]], figures: Dict[str, List[float]], fits: Dict[str, Dict[str, float]],
               growth: Optional[Dict[str, float]], nprocs: List[int], table: Dict[str, Any]) -> Dict[str, Any]:
    """KuaiRand-27K's full log from the fits: each figure with its arithmetic, and what is not measured.
    Memory never projects below what was measured: a line's slope in rows or ids that came out
    negative (noise around a flat figure) counts as flat."""
    k = KUAIRAND_27K
    m = k["rows"] / 1e6
    last = sizes[-1]
    lines: Dict[str, Any] = {}

    def line(name: str, value: float, arithmetic: str) -> None:
        lines[name] = {"value": value, "arithmetic": arithmetic}

    f = fits["convert_seconds"]
    v = f["intercept"] + f["slope_per_million_rows"] * m
    line("convert_seconds", v, f"{f['intercept']:,.1f} + {f['slope_per_million_rows']:,.3f} s per million rows x "
                               f"{m:,.0f} = {v:,.0f} s ({v / 3600:.2f} h)")
    for figure in ("convert_peak_rss_mb", "train_peak_rss_mb_per_worker"):
        f, measured = fits[figure], max(figures[figure])
        at_rows = max(f["intercept"] + f["slope_per_million_rows"] * m, measured)
        text = (f"max({f['intercept']:,.1f} + {f['slope_per_million_rows']:,.3f} MB per million rows x {m:,.0f}, "
                f"{measured:,.0f} measured) = {at_rows:,.0f} MB")
        if growth is None:
            line(figure, at_rows, text + " (no ids row: growth with ids not included)")
            continue
        bounds, parts = {}, []
        for kind, have in (("catalog", last["n_videos"]), ("distinct", last["distinct_videos"])):
            rate, more = growth["mb_per_million_videos"][figure][kind], (k["videos"] - have) / 1e6
            bounds[kind] = at_rows + max(rate, 0.0) * more
            parts.append(f"per {kind} video: + max({rate:,.1f}, 0) MB per million x {more:,.2f}M more "
                         f"= {bounds[kind]:,.0f} MB")
        line(figure, max(bounds.values()), f"{text}; with ids, {'; '.join(parts)} (the larger is the value)")
    table_gb = k["videos"] * table["bytes_per_row"] / 1e9
    line("video_table_gb", table_gb, f"{k['videos']:,} rows x {table['bytes_per_row']} bytes ({table['dim']} float32 "
                                     f"weights + {table['optimizer']} state) = {table_gb:,.2f} GB, on one rank "
                                     "(table_wise): the arithmetic check of the ids line above")
    loader = statistics.median(figures["loader_rows_per_sec_one_core"])
    hours = k["rows"] / 4 / loader / 3600
    line("loader_pass_hours_4_ranks", hours, f"{k['rows']:,} rows / 4 ranks / {loader:,.0f} rows/s per rank (one core "
                                             f"each, median over sizes) / 3600 = {hours:.2f} h")
    for n in nprocs:
        key = "train_examples_per_sec" if n == nprocs[0] else f"train_examples_per_sec_nproc{n}"
        rate = statistics.median(figures[key])
        h = k["rows"] / rate / 3600
        line(f"train_pass_hours_nproc{n}", h, f"{k['rows']:,} examples / {rate:,.0f} examples/s (nproc {n}, "
                                                f"median over sizes) / 3600 = {h:.1f} h ({h / 24:.1f} days)")
    gb = k["rows"] * last["processed_bytes_per_row"] / 1e9
    line("processed_disk_gb", gb, f"{k['rows']:,} rows x {last['processed_bytes_per_row']:.1f} bytes per row "
                                  f"(largest size, oracle columns included) = {gb:,.1f} GB")
    rows_per_day = last["rows"] / last["days"]
    return {"kuairand_27k": k, "figures": lines, "not_projected": [
        f"rows per day: measured at {rows_per_day:,.0f}, KuaiRand-27K has ~{k['rows'] / k['days']:,.0f}; a rank holds "
        "its share of a day, so the loader's and each worker's memory grow with the day's size (not measured: rerun with "
        "another --rows-per-day)",
        "ids: the line through two catalog sizes (the ids row) is extrapolated to 32M videos; a 32M-row video "
        "feature file and 32M-row vocabularies were not measured" if growth else
        "ids: no ids row (--ids-factor 0): memory growth with distinct ids not measured",
        "the machine: measured beside other work on a shared machine; rates scale with free cores, not measured"]}


def embedding_row(cfg) -> Dict[str, Any]:
    """Bytes per embedding row of the training config: float32 weights and the embedding optimizer's state."""
    dim, optimizer = int(cfg.model.embedding_dim), str(cfg.optim.embedding.type)
    state = {"rowwise_adagrad": 1, "adagrad": dim, "adam": 2 * dim, "sgd": 0}[optimizer]
    return {"dim": dim, "optimizer": optimizer, "bytes_per_row": 4 * (dim + state)}
