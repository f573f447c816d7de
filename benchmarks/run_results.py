""":mod:`benchmarks.run`'s results: the medians, spreads, ratios and shares over the repeats'
samples (:func:`summarize`, the format of ``results.json``), their table (:func:`table`), and where
they are recorded: ``results.json`` (:func:`write_results`, other benchmarks' keys kept) and the
section of ``BENCHMARKS.md`` (:func:`write_benchmarks_md`)."""

from __future__ import annotations

import json
import os
import statistics
import time
from typing import Any, Dict, List

from benchmarks.recording import machine, replace_benchmarks_section
from data_tools.fileio import write_json_atomic

THROUGHPUT = ("torch_reference", "torchrec_ddp", "hdet_T1000", "hdet_T100")
# results.json keys written by other benchmarks (benchmarks/scaling.py, benchmarks/contender_cost.py): a run of this
# one keeps them
OTHER_BENCHMARKS_KEYS = ("data_scaling", "contender_cost")


def summarize(samples: Dict[str, List[Dict[str, Any]]], loader: List[float], conv: Dict[str, Any],
              mode_name: str, mode: Dict[str, Any], command: str, peaks: Dict[str, List[Dict[str, Any]]] = None,
              arithmetic: Dict[str, Any] = None, loader_one_core: List[float] = ()) -> Dict[str, Any]:
    med = lambda name, key: statistics.median(s[key] for s in samples[name])
    span = lambda name, key: [min(s[key] for s in samples[name]), max(s[key] for s in samples[name])]
    tput = {n: med(n, "examples_per_sec") for n in samples}
    per_rank_consumption = tput["torchrec_ddp"] / mode["nproc"]
    hooks = {n: statistics.median(s["hdet_hook_seconds"] / s["train_seconds"] for s in samples[n])
             for n in ("hdet_T1000", "hdet_T100")}
    # The probe's cost per sync: hook time beyond hdet_T100's (same syncs), then its share of
    # 1000 steps of torchrec_ddp, i.e. of training at T = 1000.
    syncs_t100 = samples["hdet_T100"][0]["syncs"]
    probe_per_sync = (med("hdet_probe_T100", "hdet_hook_seconds") - med("hdet_T100", "hdet_hook_seconds")) / syncs_t100
    step_seconds = med("torchrec_ddp", "train_seconds") / samples["torchrec_ddp"][0]["steps"]
    # The periodic checkpoint: seconds per checkpoint (rank 0's view of the collective save), its
    # share of training at the default interval, and bytes written per byte of model state.
    ck = [s["checkpoints"] for s in samples["checkpoint_every_100"] if s.get("checkpoints") and s["checkpoints"]["saved"]]
    checkpoint = None
    if ck:
        per = statistics.median(c["seconds"] / c["saved"] for c in ck)
        checkpoint = {"seconds_per_checkpoint": per, "saved": ck[0]["saved"], "bytes": ck[0]["bytes"],
                      "state_bytes": ck[0]["state_bytes"], "bytes_per_state_byte": ck[0]["bytes"] / ck[0]["state_bytes"],
                      "fraction_of_train_at_default_interval": per / (250 * step_seconds)}
    scaling = {str(k): tput[f"scaling_{k}"] for k in (1, 2) if f"scaling_{k}" in tput}
    scaling[str(mode["nproc"])] = tput["torchrec_ddp"]
    # The trainer's FLOP rate over the machine's practical GEMM peak measured in the same run (at the
    # worker's threads): one worker (scaling_1: the usable cores as threads; the 1-thread variant
    # against the 1-thread peak) and every worker together (torchrec_ddp against the peak at all cores).
    compute: Dict[str, Any] = {}
    if peaks and arithmetic:
        flops = arithmetic["flops_per_example"]
        peak = {t: statistics.median(p["gflops"] for p in ps) * 1e9 for t, ps in peaks.items()}
        compute = {"flops_per_example": flops, "gemm_peak_gflops": {t: v / 1e9 for t, v in peak.items()},
                   "gemm_peak_gflops_min_max": {t: [min(p["gflops"] for p in ps), max(p["gflops"] for p in ps)]
                                                for t, ps in peaks.items()},
                   "model_gemm_shapes": arithmetic["gemm_shapes"]}
        cores = max(int(t) for t in peak)
        if "scaling_1" in tput:
            compute["peak_fraction_1worker"] = tput["scaling_1"] * flops / peak[str(cores)]
        if "scaling_1_1thread" in tput and "1" in peak:
            compute["peak_fraction_1worker_1thread"] = tput["scaling_1_1thread"] * flops / peak["1"]
        compute["peak_fraction_all_workers"] = tput["torchrec_ddp"] * flops / peak[str(cores)]
    waits = [x["data_wait_fraction"] for x in samples["torchrec_ddp"] if x.get("data_wait_fraction") is not None]
    return {
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d"),
        "command": command,
        "mode": mode_name,
        "runs": len(next(iter(samples.values()))),
        "setup": {"data": mode["data"], "train_days": mode["train_days"], "nproc": mode["nproc"],
                  "batch_size_per_rank": mode["batch_size"], "steps": samples["torchrec_ddp"][0]["steps"]},
        "throughput": {n: tput[n] for n in THROUGHPUT},
        "throughput_all": tput,
        "throughput_min_max": {n: span(n, "examples_per_sec") for n in samples},
        "train_seconds": {n: med(n, "train_seconds") for n in samples},
        "ratios": {
            "torchrec_ddp_over_torch_reference": tput["torchrec_ddp"] / tput["torch_reference"],
            "hdet_T1000_cost_over_torchrec_ddp": tput["torchrec_ddp"] / tput["hdet_T1000"] - 1,
            "hdet_T100_cost_over_torchrec_ddp": tput["torchrec_ddp"] / tput["hdet_T100"] - 1,
            "loader_over_per_rank_consumption": statistics.median(loader) / per_rank_consumption,
        },
        "hdet_hooks_fraction_of_train": hooks,
        "probe": {"seconds_per_sync": probe_per_sync, "step_seconds": step_seconds,
                  "fraction_of_train_at_T1000": probe_per_sync / (1000 * step_seconds)},
        "checkpoint": checkpoint,
        "syncs": {n: samples[n][0]["syncs"] for n in ("hdet_T1000", "hdet_T100")},
        **compute,
        "data_wait_fraction": statistics.median(waits) if waits else None,
        "loader_rows_per_sec_one_core": statistics.median(loader_one_core) if loader_one_core else None,
        "loader_rows_per_sec": statistics.median(loader),
        "loader_rows_per_sec_min_max": [min(loader), max(loader)],
        "trainer_rows_per_sec_per_rank": per_rank_consumption,
        "scaling": scaling,
        "peak_rss_mb": {n: med(n, "peak_rss_mb") for n in samples},
        "peak_rss_mb_per_worker": {n: samples[n][0].get("peak_rss_mb_per_worker") for n in samples},
        "train_loss": {n: med(n, "train_loss") for n in samples},
        "converge": conv,
        "samples": samples,
    }


def table(r: Dict[str, Any]) -> str:
    t, secs = r["throughput_min_max"], r["train_seconds"]
    base = r["throughput"]["torchrec_ddp"]
    all_tput = {**r["throughput"], **{f"scaling_{k}": v for k, v in r["scaling"].items() if k != str(r['setup']['nproc'])}}
    if "scaling_1_1thread" in r["throughput_all"]:
        all_tput["scaling_1_1thread"] = r["throughput_all"]["scaling_1_1thread"]
    if "torchrec_ddp_before" in r["train_seconds"]:
        all_tput["torchrec_ddp_before"] = r["throughput_all"]["torchrec_ddp_before"]
    lines = [
        "| contender | examples/s (median) | min..max | vs torchrec_ddp | train s | peak RSS per worker, MB (largest) | train loss |",
        "|---|---|---|---|---|---|---|",
    ]
    for n, v in all_tput.items():
        lines.append(f"| {n} | {v:,.0f} | {t[n][0]:,.0f}..{t[n][1]:,.0f} | {v / base:.3f}x | {secs[n]:.1f} | "
                     f"{r['peak_rss_mb'][n]:.0f} | {r['train_loss'][n]:.4f} |")
    ratios, conv, hooks = r["ratios"], r["converge"], r["hdet_hooks_fraction_of_train"]
    lines += [
        "",
        "| measure | value | target |",
        "|---|---|---|",
        f"| torchrec_ddp / torch_reference examples/s | {ratios['torchrec_ddp_over_torch_reference']:.2f}x | ≥ 1.5x |",
        f"| HDET T=1000 cost over torchrec_ddp (end to end, medians) | {ratios['hdet_T1000_cost_over_torchrec_ddp'] * 100:+.2f}% "
        f"({r['syncs']['hdet_T1000']} sync(s)) | ≤ 0.5% |",
        f"| HDET T=1000: time in HDET hooks / train time (rank 0) | {hooks['hdet_T1000'] * 100:.2f}% | |",
        f"| HDET T=100 cost over torchrec_ddp (end to end, medians) | {ratios['hdet_T100_cost_over_torchrec_ddp'] * 100:+.2f}% "
        f"({r['syncs']['hdet_T100']} syncs) | report |",
        f"| HDET T=100: time in HDET hooks / train time (rank 0) | {hooks['hdet_T100'] * 100:.2f}% | |",
        f"| probe signal: seconds per sync (hdet_probe_T100 hooks - hdet_T100 hooks) / its share of training "
        f"at T=1000 | {r['probe']['seconds_per_sync']:.3f} s / {r['probe']['fraction_of_train_at_T1000'] * 100:.2f}% "
        f"| ≤ 1% |",
        (f"| periodic checkpoint (2 x 2 HDET, every rank's own state): seconds per checkpoint / share of training at "
         f"every 250 steps / MB written (per MB of model state) | {r['checkpoint']['seconds_per_checkpoint']:.2f} s / "
         f"{r['checkpoint']['fraction_of_train_at_default_interval'] * 100:.2f}% / {r['checkpoint']['bytes'] / 1e6:.1f} MB "
         f"({r['checkpoint']['bytes_per_state_byte']:.2f}) | report |" if r.get("checkpoint") else
         "| periodic checkpoint | not measured (no checkpoint written: too few steps) | report |"),
        f"| input pipeline rows/s (rank 0's stream) / rows/s one rank consumes | {r['loader_rows_per_sec']:,.0f} / "
        f"{r['trainer_rows_per_sec_per_rank']:,.0f} = {ratios['loader_over_per_rank_consumption']:.1f}x | ≥ 5x |",
        *([f"| trainer FLOP rate / same-run GEMM peak: 1 worker ({max(map(int, r['gemm_peak_gflops']))} threads) / "
           f"1 worker, 1 thread / all workers | {r['peak_fraction_1worker'] * 100:.1f}% / "
           f"{r.get('peak_fraction_1worker_1thread', float('nan')) * 100:.1f}% / {r['peak_fraction_all_workers'] * 100:.1f}% "
           f"(peak " + ", ".join(f"{t} thread(s) {g:.1f}" for t, g in r["gemm_peak_gflops"].items())
           + f" GFLOP/s; model {r['flops_per_example'] / 1e6:.3f} MFLOP per example) | 1 worker ≥ 30% |"]
          if r.get("peak_fraction_1worker") is not None else []),
        *([f"| input pipeline alone on one core (rows/s) | {r['loader_rows_per_sec_one_core']:,.0f} | ≥ 1M |"]
          if r.get("loader_rows_per_sec_one_core") else []),
        *([f"| training thread waiting for data / train time (torchrec_ddp, rank 0) | {r['data_wait_fraction'] * 100:.2f}% | < 2% |"]
          if r.get("data_wait_fraction") is not None else []),
        "| scaling, torchrec_ddp examples/s at 1 / 2 / 4 workers | "
        + " / ".join(f"{r['scaling'][k]:,.0f}" for k in sorted(r["scaling"], key=int)) + " | |",
        f"| converge (average_) time per replicated MB, {conv['nproc']} ranks | {conv['seconds_per_mb'] * 1e3:.2f} ms/MB "
        f"({conv['intercept_seconds'] * 1e3:+.2f} ms fixed, R² {conv['r2']:.4f}; sizes "
        + ", ".join(f"{s:g} MB: {x * 1e3:.1f} ms" for s, x in zip(conv["sizes_mb"], conv["seconds"])) + ") | linear |",
    ]
    return "\n".join(lines)


def write_benchmarks_md(r: Dict[str, Any], body: str) -> None:
    heading = "## Throughput, HDET overhead and scaling (benchmarks/run.py)"
    replace_benchmarks_section(heading, (
        f"{heading}\n\n`{r['command']}` on {r['date']}, {r['machine']}; {r['runs']} interleaved repeat(s), "
        f"medians; {r['setup']['nproc']} local gloo workers, {r['setup']['batch_size_per_rank']} examples "
        f"per rank per step, data set `{r['setup']['data']}` ({r['setup']['steps']} steps per run). "
        f"Raw numbers: `benchmarks/results.json`.\n\n{body}\n"))


def write_results(result: Dict[str, Any], path: str) -> None:
    """``result`` into ``path``; the keys other benchmarks record in the same file stay."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    if os.path.isfile(path):
        with open(path) as f:
            result = {**{k: v for k, v in json.load(f).items() if k in OTHER_BENCHMARKS_KEYS}, **result}
    write_json_atomic(path, result)
