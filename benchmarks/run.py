"""``python -m benchmarks.run [--quick | --tiny] [--repeats N] [--write]``: the benchmark harness.

In one invocation, on the same model, data and batch size (benchmark data set, 512 examples per
rank, 4 local gloo workers), and interleaved ``--repeats`` times (the order rotates every repeat)
so that drift in machine load hits every contender alike:

- ``torch_reference``: the ranker in plain PyTorch (``benchmarks/torch_reference.py``:
  ``nn.EmbeddingBag`` replicated on every rank, DDP, sparse Adagrad + Adam)
- ``torchrec_ddp``: our pipeline without HDET in TorchRec's standard layout (one sharding group of
  4: the planner shards the tables over all ranks, DDP for the dense part). Every replica takes
  identical updates, which is what alpha = 0 means, and no HDET hook runs at all
- ``hdet_T1000``, ``hdet_T100``: the same with HDET on (conf/hdet/enabled.yaml's spread and
  controller, on from the first sync, with the training-loss signal) and converge every 1000 / 100 steps
- ``scaling_1``, ``scaling_2``: ``torchrec_ddp`` on 1 and 2 workers (4 is ``torchrec_ddp`` itself)
- ``checkpoint_every_100``: HDET on a 2 x 2 layout with a periodic checkpoint every 100 steps:
  seconds per checkpoint, its share of training time at the default interval (250 steps of
  ``torchrec_ddp``), and bytes written per byte of model state (every rank's own copy)
- ``hdet_probe_T100``: ``hdet_T100`` with the probe signal (every replica scores the same
  ``hdet.probe_rows`` rows at each sync; the HDET contenders above use the training-loss signal,
  the default controller otherwise); the difference
  in hook time from ``hdet_T100`` per sync is the probe's cost, reported as its share of training
  time at T = 1000 (per-sync cost / 1000 steps of ``torchrec_ddp``)

plus, outside the interleaving, the input pipeline alone (rank 0 of 4's ``ParquetBatchStream``:
rows per second delivered as ready batches, KeyedJaggedTensor included) and the converge step's
time against replicated bytes (``benchmarks/converge.py``).

Throughput is examples per second over the training loop (``summary.json``'s
``examples_per_sec``: the pass, data loading included, start-up and evaluation excluded). Every
figure in ``results.json`` is a median over the repeats; min..max spreads are kept beside it.
``--write`` records the table in ``BENCHMARKS.md``. ``--tiny`` runs everything on the tiny data
set with 2 workers in about a minute (the smoke test); its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
THROUGHPUT = ("torch_reference", "torchrec_ddp", "hdet_T1000", "hdet_T100")


def modes() -> Dict[str, Dict[str, Any]]:
    return {
        # ~1M examples per run (4 of the 8 training days): ~45 s of training per pipeline run.
        "full": {"data": "bench", "train_days": 4, "nproc": 4, "batch_size": 512, "repeats": 3,
                 "converge_sizes": [1, 4, 16, 64]},
        "quick": {"data": "bench", "train_days": 1, "nproc": 4, "batch_size": 512, "repeats": 1,
                  "converge_sizes": [1, 4, 16]},
        "tiny": {"data": "tiny", "train_days": None, "nproc": 2, "batch_size": 256, "repeats": 1,
                 "converge_sizes": [0.25, 1], "checkpoint_every": 10, "log_every": 10},
    }


def data_root(data: str) -> str:
    return os.path.join(os.environ.get("RECSYS_HDET_DATA", os.path.join(REPO, ".cache", "data")), data)


def ensure_data(mode: Dict[str, Any]) -> None:
    """Make sure the data set exists before timing anything (generated on first use, like training)."""
    subprocess.run([sys.executable, "-c", "from recsys_hdet.config import compose\n"
                    "from recsys_hdet.job_inputs import prepare_data\n"
                    f"prepare_data(compose('config', ['data={mode['data']}']))"],
                   cwd=REPO, check=True)


def pipeline_overrides(mode: Dict[str, Any], nproc: int) -> List[str]:
    o = ["+experiment=baseline_low", f"data={mode['data']}", f"data.batch_size={mode['batch_size']}",
         f"trainer.nproc={nproc}", f"trainer.sharding_group_size={nproc}", "trainer.checkpoint=false",
         # a periodic checkpoint falls on a divergence check (rollback): log_every divides checkpoint_every
         f"trainer.log_every={mode.get('log_every', 100)}", "trainer.periodic_checkpoint.every_steps=0",
         "trainer.tensorboard=false"]
    if mode["data"] == "bench":
        o.append("data.skip_days=2")
    if mode["train_days"] is not None:
        o.append(f"data.train_days={mode['train_days']}")
    return o


# The settings the profiling fixes replaced (BENCHMARKS.md, "Profiling"): measured side by side
# as torchrec_ddp_before with --before.
BEFORE = ["model.sharding_types=[table_wise,column_wise]", "optim.dense.fused=false"]


def contenders(mode: Dict[str, Any], before: bool = False) -> Dict[str, Callable[[str], Dict[str, Any]]]:
    n = mode["nproc"]

    def pipeline(extra: List[str], nproc: int = n):
        def run(workdir: str) -> Dict[str, Any]:
            from recsys_hdet.run_dir import RunDir

            run_dir = os.path.join(workdir, f"run_{time.time_ns()}")
            cmd = [sys.executable, "-m", "recsys_hdet.train", f"hydra.run.dir={run_dir}",
                   *pipeline_overrides(mode, nproc), *extra]
            _check(subprocess.run(cmd, cwd=REPO, capture_output=True, text=True), cmd)
            s = RunDir(run_dir).summary()
            return {"examples_per_sec": s["examples_per_sec"], "train_seconds": s["train_seconds"],
                    "steps": s["steps"], "peak_rss_mb": s["peak_rss_mb"],
                    "peak_rss_mb_per_worker": s.get("peak_rss_mb_per_worker"),
                    "hdet_hook_seconds": s.get("hdet", {}).get("seconds"), "syncs": s.get("hdet", {}).get("syncs"),
                    "train_loss": s["train_loss"]["avg"],
                    "data_wait_fraction": s.get("data_wait_fraction"),
                    "checkpoints": s.get("periodic_checkpoints")}
        return run

    def reference(workdir: str) -> Dict[str, Any]:
        out = os.path.join(workdir, f"ref_{time.time_ns()}.json")
        cmd = [sys.executable, "-m", "benchmarks.torch_reference", "--data", data_root(mode["data"]),
               "--nproc", str(n), "--batch-size", str(mode["batch_size"]), "--out", out,
               "--skip-days", "2" if mode["data"] == "bench" else "0"]
        if mode["train_days"] is not None:
            cmd += ["--train-days", str(mode["train_days"])]
        _check(subprocess.run(cmd, cwd=REPO, capture_output=True, text=True), cmd)
        with open(out) as f:
            r = json.load(f)
        r["train_loss"] = r.pop("train_loss_avg")
        return r

    # The engine's own cost is measured with the training-loss signal (no probe); hdet_probe_T100 is the
    # same with the default probe signal, so their difference in hook time is the probe's cost.
    hdet = ["hdet=enabled", "hdet.controller_start=0", "hdet.signal=train"]
    runs: Dict[str, Callable[[str], Dict[str, Any]]] = {
        "torch_reference": reference,
        "torchrec_ddp": pipeline([]),
        "hdet_T1000": pipeline([*hdet, "hdet.sync_every=1000"]),
        "hdet_T100": pipeline([*hdet, "hdet.sync_every=100"]),
        "hdet_probe_T100": pipeline([*hdet, "hdet.sync_every=100", "hdet.signal=probe"]),
    }
    # The periodic checkpoint's stall and size: torchrec_ddp with HDET's 2 x 2 replicas (every rank
    # writes its own state), a checkpoint every 100 steps.
    runs["checkpoint_every_100"] = pipeline([*hdet, "hdet.sync_every=100", f"trainer.sharding_group_size={max(1, n // 2)}",
                                             f"trainer.periodic_checkpoint.every_steps={mode.get('checkpoint_every', 100)}"])
    for k in (1, 2):
        if k < n:
            runs[f"scaling_{k}"] = pipeline([], nproc=k)
    # One worker with one thread beside scaling_1's default (the usable cores: two here).
    runs["scaling_1_1thread"] = pipeline(["trainer.threads_per_worker=1"], nproc=1)
    if before:
        runs["torchrec_ddp_before"] = pipeline(BEFORE)
    return runs


def _check(proc: subprocess.CompletedProcess, cmd: List[str]) -> None:
    if proc.returncode != 0:
        raise SystemExit(f"benchmark run failed ({proc.returncode}): {' '.join(cmd)}\n"
                         f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")


def loader_rows_per_sec(mode: Dict[str, Any]) -> float:
    """Rank 0 of ``nproc``'s training stream over the same days: rows delivered per second."""
    from recsys_hdet.components.dataset import DatasetMeta, DenseNormalization, split_days
    from recsys_hdet.components.dataloader import ParquetBatchStream

    meta = DatasetMeta.load(data_root(mode["data"]))
    skip = 2 if mode["data"] == "bench" else 0
    days, _ = split_days(meta, 1, mode["train_days"], skip)
    stream = ParquetBatchStream(meta, days, mode["batch_size"], 0, mode["nproc"], 0, shuffle_within_day=True,
                                normalization=DenseNormalization.from_days(meta, days))
    start = time.perf_counter()
    rows = sum(b.labels.shape[0] for b in stream)
    return rows / (time.perf_counter() - start)


def loader_rows_per_sec_one_core(mode: Dict[str, Any]) -> float:
    """:func:`loader_rows_per_sec` in a subprocess pinned to one core with one thread (the day reader
    thread shares that core)."""
    code = ("import os, json, sys\nos.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\nimport torch\n"
            "torch.set_num_threads(1)\nfrom benchmarks.run import loader_rows_per_sec\n"
            "print(loader_rows_per_sec(json.loads(sys.argv[1])))")
    cmd = [sys.executable, "-c", code, json.dumps(mode)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    _check(proc, cmd[:2])
    return float(proc.stdout.strip().splitlines()[-1])


def converge(mode: Dict[str, Any], workdir: str) -> Dict[str, Any]:
    out = os.path.join(workdir, "converge.json")
    cmd = [sys.executable, "-m", "benchmarks.converge", "--nproc", str(mode["nproc"]), "--out", out,
           "--sizes", *map(str, mode["converge_sizes"])]
    _check(subprocess.run(cmd, cwd=REPO, capture_output=True, text=True), cmd)
    with open(out) as f:
        return json.load(f)


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
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}, "
                   f"torch {__import__('torch').__version__}",
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


def replace_benchmarks_section(heading: str, section: str) -> None:
    """Writes ``section`` (starting with ``heading``) into BENCHMARKS.md, in place of the section with
    that heading, or at the end."""
    path = os.path.join(REPO, "BENCHMARKS.md")
    text = open(path).read() if os.path.exists(path) else "# Benchmarks\n\nEvery table here is produced by the script named in its heading.\n"
    start = text.find(heading)
    if start >= 0:
        end = text.find("\n## ", start + 1)
        text = text[:start] + section + ("\n" + text[end + 1:] if end >= 0 else "")  # a blank line before the next heading
    else:
        text = text.rstrip() + "\n\n" + section
    with open(path, "w") as f:
        f.write(text)


def write_benchmarks_md(r: Dict[str, Any], body: str) -> None:
    heading = "## Throughput, HDET overhead and scaling (benchmarks/run.py)"
    replace_benchmarks_section(heading, (
        f"{heading}\n\n`{r['command']}` on {r['date']}, {r['machine']}; {r['runs']} interleaved repeat(s), "
        f"medians; {r['setup']['nproc']} local gloo workers, {r['setup']['batch_size_per_rank']} examples "
        f"per rank per step, data set `{r['setup']['data']}` ({r['setup']['steps']} steps per run). "
        f"Raw numbers: `benchmarks/results.json`.\n\n{body}\n"))


# results.json keys written by other benchmarks (benchmarks/scaling.py): a run of this one keeps them
OTHER_BENCHMARKS_KEYS = ("data_scaling",)


def main(argv=None) -> int:
    from benchmarks import peak
    from data_tools.fileio import write_json_atomic
    from recsys_hdet.distributed import usable_cores

    ap = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.split("\n\n")[0])
    group = ap.add_mutually_exclusive_group()
    group.add_argument("--quick", action="store_true", help="one training day, one repeat (a few minutes)")
    group.add_argument("--tiny", action="store_true", help="the tiny data set, 2 workers (smoke test; numbers mean nothing)")
    ap.add_argument("--repeats", type=int, default=None, help="interleaved repeats (default: 3 full, 1 quick)")
    ap.add_argument("--out", default=None,
                    help="where results.json goes (default: benchmarks/results.json, the committed figures, for the "
                         "full mode; outputs/benchmarks/results-<mode>.json for --quick and --tiny, so a trial never "
                         "replaces them)")
    ap.add_argument("--write", action="store_true", help="record the table in BENCHMARKS.md")
    ap.add_argument("--before", action="store_true",
                    help="also run torchrec_ddp with the settings the profiling fixes replaced (" + " ".join(BEFORE) + ")")
    args = ap.parse_args(argv)
    mode_name = "tiny" if args.tiny else "quick" if args.quick else "full"
    mode = modes()[mode_name]
    if args.out is None:
        args.out = os.path.join(REPO, "benchmarks", "results.json") if mode_name == "full" else \
            os.path.join(REPO, "outputs", "benchmarks", f"results-{mode_name}.json")
    repeats = args.repeats or mode["repeats"]
    command = "python -m benchmarks.run" + "".join(f" {a}" for a in (sys.argv[1:] if argv is None else argv))
    ensure_data(mode)
    runs = contenders(mode, args.before)
    samples: Dict[str, List[Dict[str, Any]]] = {n: [] for n in runs}
    loader: List[float] = []
    loader_one_core: List[float] = []
    peaks: Dict[str, List[Dict[str, Any]]] = {}
    retries: List[str] = []
    names = list(runs)
    with tempfile.TemporaryDirectory() as workdir:
        for rep in range(repeats):
            order = names[rep % len(names):] + names[:rep % len(names)]  # rotate: no fixed position
            for name in order:
                try:
                    s = runs[name](workdir)
                except SystemExit as failure:  # one retry (a teardown crash was seen once); a second failure stops the run
                    print(f"[{rep + 1}/{repeats}] {name} failed, retrying once:\n{str(failure)[-1500:]}", flush=True)
                    retries.append(f"{name} (repeat {rep + 1}): {str(failure).splitlines()[0]}")
                    s = runs[name](workdir)
                samples[name].append(s)
                print(f"[{rep + 1}/{repeats}] {name}: {s['examples_per_sec']:,.0f} ex/s, {s['train_seconds']:.1f} s, "
                      f"peak RSS {s['peak_rss_mb']:.0f} MB", flush=True)
            loader.append(loader_rows_per_sec(mode))
            loader_one_core.append(loader_rows_per_sec_one_core(mode))
            print(f"[{rep + 1}/{repeats}] loader: {loader[-1]:,.0f} rows/s; on one core {loader_one_core[-1]:,.0f}", flush=True)
            for threads in sorted({1, usable_cores()}):
                peaks.setdefault(str(threads), []).append(peak.measure("peak", threads))
            print(f"[{rep + 1}/{repeats}] GEMM peak: " + ", ".join(
                f"{t} thread(s) {ps[-1]['gflops']:.1f} GFLOP/s" for t, ps in peaks.items()), flush=True)
        conv = converge(mode, workdir)
    arithmetic = peak.measure("model", usable_cores(), data=mode["data"], batch=mode["batch_size"])
    result = summarize(samples, loader, conv, mode_name, mode, command, peaks, arithmetic, loader_one_core)
    result["retried_after_failure"] = retries
    body = table(result)
    print("\n" + body)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    if os.path.isfile(args.out):  # keys other benchmarks record in the same file stay
        with open(args.out) as f:
            result = {**{k: v for k, v in json.load(f).items() if k in OTHER_BENCHMARKS_KEYS}, **result}
    write_json_atomic(args.out, result)
    print(f"\nwrote {args.out}")
    if args.write:
        write_benchmarks_md(result, body)
        print("recorded the table in BENCHMARKS.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
