"""``python -m benchmarks.scaling [--quick] [--rows 3e6,10e6,30e6] [--rows-per-day 1e6] [--no-record]``:
how conversion, one rank's input pipeline and training scale with the number of rows.

Data. Synthetic KuaiRand-schema logs (:mod:`data_tools.synthetic`) at fixed id counts (27,000 users,
300,000 videos, 30,000 authors, 10,000 music ids, 1,000 tags; KuaiRand-27K has 27,285 users and
about 32M videos, KuaiRand-1K 1,000 users and about 4.37M videos) and a fixed number of rows a day
(1M): rows grow only through days (3, 10 and 30 days). The generator is prefix-stable in days (the
first N days and the user and video files are the same whatever ``days`` is), so the days are
generated once, as pieces ``[0, 3)``, ``[3, 10)``, ``[10, 30)`` (``generate(..., from_day=start)``:
a piece simulates the days before it without writing them, so the simulation costs what three
separate data sets would, with at most one piece's days in memory); a size's raw log is the pieces
up to its days, the very rows a separate generation would write, and the user and video files are
checked to be identical across pieces. Pieces are kept under ``--out-dir`` (default
``.cache/scaling``) and reused by a rerun (their ``generator_config.json`` must match, else the run
stops). One more data set, at the smallest row count with ``--ids-factor`` (10) times the videos,
measures growth with distinct ids, which a rows-only sweep cannot.

Per size:

- **convert**: ``python -m data_tools.convert --log ... --users ... --videos ... --out ...`` (its
  command line only, at its default settings and threads) into a fresh directory (an earlier output
  or resumable stage removed first); wall time, and peak RSS as the converter process's
  ``ru_maxrss`` from ``os.wait4`` (its own and its waited descendants', exact, no sampling).
- **loader**: one rank's ``ParquetBatchStream`` as training builds it (the training config's batch
  size, seed, shuffling, training days and their dense normalization) in a fresh process pinned to
  one core, ``torch.set_num_threads(1)`` and ``POLARS_MAX_THREADS=1``; the first training day is
  read once untimed (warm-up), then a new stream over the other training days is timed from its
  start to its last batch (on one core the day-reader thread's reads are inside that time). Rows/s =
  rows delivered to the rank / wall seconds (the target's figure), and rows per CPU second of the
  process (all its threads: what other processes on the core do not change); rank 0 of 4 with
  ``data.read=own_row_groups`` (the target: it reads only the row groups dealt to it), the same rank
  with ``whole_day`` (decoding every day whole, as layout 1 must) side by side, and rank 0 of 1.
- **train**: ``python -m recsys_hdet.train data=kuairand data.root=...`` (plus ``--train-override``)
  with ``trainer.nproc`` 1 and 2 (one sharding group), stopped at ``--steps``
  (``trainer.stop_at_step``), no checkpoints; examples/s is ``summary.json``'s (the pass, data
  loading and the first steps included) and the steady figure the median of ``metrics.jsonl``'s
  intervals after the first; peak RSS per worker is the largest of ``summary.json``'s
  ``peak_rss_mb_per_worker`` (each worker's ``ru_maxrss``). At the smallest size also
  ``model.compile_dense=true`` and ``trainer.threads_per_worker`` 1 and 2, side by side with the
  default run (compile time is inside the pass's figure, not the steady one).

Each figure gets a least-squares line against rows (intercept, slope per million rows) and its
growth from the smallest to the largest size, which the targets judge: convert peak RSS grows
< 10%, training peak RSS per worker stays within 10%, rank 0 of 4's loader on one core reads
>= 1M rows/s at every size. The projection for KuaiRand-27K's full log (322M rows, ~10.4M a day over
31 days, 32M videos) is that arithmetic written out: time from the lines; memory from the lines in
rows and in distinct videos, never below what was measured (a negative slope is noise around a flat
figure); the video table's bytes as the check of the ids line.

Output: the tables on stdout and ``outputs/benchmarks/scaling-<mode>.json``. A full run also
records ``data_scaling`` in ``benchmarks/results.json`` (other keys kept) and the section "Data
scaling" of ``BENCHMARKS.md``, unless ``--no-record``; ``--quick`` (0.3M and 1M rows at 100K a day,
30,000 videos, 50 steps: a test of the script, its figures mean nothing) never records there.

Limits: one measurement per figure (no repeats); the machine's load is recorded, not controlled.
Rows per day are fixed, so what grows with a day's size (a rank holds its share of a day: loader
and worker memory) is not measured; rerun with another ``--rows-per-day`` for that (the generator
allows at most 10M). Growth with ids is a line through two catalog sizes, extrapolated far beyond
them. The synthetic log's Zipf skew decides how many distinct videos appear; the real log's may differ.
"""

from __future__ import annotations

import argparse
import filecmp
import importlib.metadata
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from benchmarks.run import REPO, replace_benchmarks_section
from data_tools.contract import read_meta
from recsys_hdet.run_dir import RunDir

HEADING = "## Data scaling (benchmarks/scaling.py)"
LOG_EVERY = 25  # trainer.log_every: metrics.jsonl's intervals (the steady examples/s)
# (rank, world_size, data.read) of the one-core loader: the first is the target's (the kuairand preset's
# own_row_groups), the second the same rank decoding whole days (the layout-1 way), side by side
LOADER_RANKS = ((0, 4, "own_row_groups"), (0, 4, "whole_day"), (0, 1, "own_row_groups"))
LOADER_KEYS = {(0, 4, "own_row_groups"): "0/4", (0, 4, "whole_day"): "0/4 whole_day", (0, 1, "own_row_groups"): "0/1"}
# KuaiRand-27K's standard log (docs/data.md): 322M interactions over 31 days (2022-04-08..05-08).
KUAIRAND_27K = {"rows": 322_000_000, "days": 31, "videos": 32_000_000, "users": 27_285}
MODES = {
    "full": {"rows": [3_000_000, 10_000_000, 30_000_000], "rows_per_day": 1_000_000, "n_videos": 300_000,
             "steps": 200},
    "quick": {"rows": [300_000, 1_000_000], "rows_per_day": 100_000, "n_videos": 30_000, "steps": 50},
}
FIXED_IDS = {"n_users": 27_000, "n_authors": 30_000, "n_music": 10_000, "n_tags": 1_000}
TRAIN_VARIANTS = {  # side by side at the smallest size, beside the default run
    "compile_dense=true": ["model.compile_dense=true"],
    "threads_per_worker=1": ["trainer.threads_per_worker=1"],
    "threads_per_worker=2": ["trainer.threads_per_worker=2"],
}


# -- subprocesses ---------------------------------------------------------------------------------
@dataclass
class Measured:
    seconds: float
    peak_rss_mb: float  # ru_maxrss of the process and its waited descendants (the largest one)
    stdout: str


def run_measured(cmd: List[str], env: Optional[Dict[str, str]] = None) -> Measured:
    """Runs ``cmd`` from the repository root; its wall time and peak RSS (``os.wait4``'s rusage).
    A non-zero exit raises SystemExit with the command and the tail of its output."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=err, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if proc.returncode != 0:
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{stdout[-2000:]}\n{stderr[-3000:]}")
    return Measured(seconds, usage.ru_maxrss / 1024.0, stdout)


def python(code: str, *args: str, env: Optional[Dict[str, str]] = None) -> Measured:
    return run_measured([sys.executable, "-c", code, *args], env=env)


# -- data -----------------------------------------------------------------------------------------
def generator_fields(n_videos: int, rows_per_day: int, days: int) -> Dict[str, int]:
    return {**FIXED_IDS, "n_videos": n_videos, "impressions_per_day": rows_per_day, "days": days, "seed": 0}


def data_key(n_videos: int, rows_per_day: int) -> str:
    """A data set's folder name under --out-dir (the other ids are FIXED_IDS)."""
    return f"v{n_videos}_r{rows_per_day}"


def ensure_pieces(raw_dir: str, n_videos: int, rows_per_day: int, day_counts: List[int]) -> List[str]:
    """The raw pieces ``[0, d1), [d1, d2), ...`` for the sorted ``day_counts``, generated when missing."""
    pieces, start = [], 0
    for end in day_counts:
        path = os.path.join(raw_dir, f"days_{start:03d}-{end:03d}")
        expected = generator_fields(n_videos, rows_per_day, end)
        if not os.path.isdir(path):
            generate_piece(path, expected, start)
        with open(os.path.join(path, "generator_config.json")) as f:
            written = json.load(f)
        if {k: written[k] for k in expected} != expected:
            raise SystemExit(f"{path} was generated with {written}, not {expected}: delete it to regenerate")
        pieces.append(path)
        start = end
    return pieces


def generate_piece(path: str, fields: Dict[str, int], from_day: int) -> None:
    """Days ``[from_day, fields['days'])`` (the earlier ones simulated, not written) into ``path``,
    via a temporary directory renamed into place, so a piece that exists is complete."""
    tmp = path + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"generating {path} ({(fields['days'] - from_day) * fields['impressions_per_day']:,} rows)", flush=True)
    m = python("import json, sys\nfrom data_tools.synthetic import generate\n"
               "generate(json.loads(sys.argv[1]), sys.argv[2], from_day=int(sys.argv[3]))",
               json.dumps(fields), tmp, str(from_day))
    os.rename(tmp, path)
    print(f"  generated in {m.seconds:.0f} s", flush=True)


def raw_inputs(pieces: List[str]) -> Dict[str, Any]:
    """The converter's inputs for the days of ``pieces``: their logs, and the user and video files
    (the same in every piece: checked)."""
    from data_tools.synthetic import LOG_FILE, USER_FILE, VIDEO_FILE

    for name in (USER_FILE, VIDEO_FILE):
        for piece in pieces[1:]:
            if not filecmp.cmp(os.path.join(pieces[0], name), os.path.join(piece, name), shallow=False):
                raise SystemExit(f"{name} differs between {pieces[0]} and {piece}: the pieces are not one data set")
    return {"log": [os.path.join(p, LOG_FILE) for p in pieces], "users": os.path.join(pieces[0], USER_FILE),
            "videos": os.path.join(pieces[0], VIDEO_FILE)}


def convert(raw: Dict[str, Any], out: str) -> Dict[str, float]:
    """The converter's command into a fresh ``out`` (an earlier output or resumable stage removed)."""
    for old in (out, os.path.join(os.path.dirname(out), f".{os.path.basename(out)}.partial")):
        shutil.rmtree(old, ignore_errors=True)
    m = run_measured([sys.executable, "-m", "data_tools.convert", "--log", *raw["log"], "--users", raw["users"],
                      "--videos", raw["videos"], "--out", out])
    return {"convert_seconds": m.seconds, "convert_peak_rss_mb": m.peak_rss_mb}


def data_facts(root: str) -> Dict[str, Any]:
    meta = read_meta(root)
    size = sum(os.path.getsize(os.path.join(d, n)) for d, _, names in os.walk(root) for n in names)
    rows = sum(d["rows"] for d in meta["days"].values())
    return {"rows": rows, "days": len(meta["days"]), "distinct_videos": meta["ids"]["video_id"]["distinct_raw_ids"],
            "processed_bytes_per_row": size / rows}


# -- loader ---------------------------------------------------------------------------------------
def config_overrides(root: str, extra: List[str]) -> List[str]:
    """The Hydra overrides of every training run (and of the loader's config): the processed data set
    read as a converted one (no generator), then ``--train-override``'s."""
    return ["data=kuairand", f"data.root={root}", *extra]


def compose_config(overrides: List[str]):
    from recsys_hdet.config import compose

    return compose("config", overrides)


def loader_child(root: str, rank: str, world_size: str, extra: str, read: str) -> None:
    """In a fresh process (POLARS_MAX_THREADS=1 in its environment): pinned to one core, one torch
    thread; prints the timed stream's rows, wall seconds and CPU seconds (all its threads) as JSON."""
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    import torch

    from recsys_hdet.components.dataloader import ParquetBatchStream
    from recsys_hdet.components.dataset import DatasetMeta, DenseNormalization, split_for

    torch.set_num_threads(1)
    cfg = compose_config(config_overrides(root, json.loads(extra)))
    meta = DatasetMeta.load(root)
    days, _ = split_for(meta, cfg.data)
    normalization = DenseNormalization.from_days(meta, days)

    def stream(which: List[str]) -> ParquetBatchStream:
        return ParquetBatchStream(meta, which, int(cfg.data.batch_size), int(rank), int(world_size), int(cfg.seed),
                                  shuffle_within_day=bool(cfg.data.shuffle_within_day), normalization=normalization,
                                  reserve_rows=int(cfg.data.reserve_rows or 0), read=read)

    for _ in stream(days[:1]):
        pass
    start, cpu_start = time.perf_counter(), time.process_time()
    rows = sum(b.labels.shape[0] for b in stream(days[1:]))
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    print(json.dumps({"rows": rows, "seconds": seconds, "cpu_seconds": cpu_seconds}))


def loader_one_core(root: str, rank: int, world_size: int, extra: List[str], read: str) -> Dict[str, float]:
    """Rows/s over wall time (the target's figure) and per CPU second (what contention from other
    processes on the core does not change), and the process's peak RSS."""
    m = python("import sys\nfrom benchmarks.scaling import loader_child\nloader_child(*sys.argv[1:])",
               root, str(rank), str(world_size), json.dumps(extra), read,
               env={**os.environ, "POLARS_MAX_THREADS": "1", "OMP_NUM_THREADS": "1"})
    r = json.loads(m.stdout.strip().splitlines()[-1])
    return {"rows_per_sec": r["rows"] / r["seconds"], "rows_per_cpu_second": r["rows"] / r["cpu_seconds"],
            "peak_rss_mb": m.peak_rss_mb}


# -- training -------------------------------------------------------------------------------------
def train(root: str, nproc: int, steps: int, extra: List[str], workdir: str) -> Dict[str, float]:
    run_dir = os.path.join(workdir, f"run_{time.time_ns()}")
    cmd = [sys.executable, "-m", "recsys_hdet.train", f"hydra.run.dir={run_dir}", "experiment_name=scaling",
           f"trainer.nproc={nproc}", f"trainer.sharding_group_size={nproc}", f"trainer.stop_at_step={steps}",
           f"trainer.log_every={LOG_EVERY}", "trainer.checkpoint=false", "trainer.periodic_checkpoint.every_steps=0",
           "trainer.tensorboard=false", *config_overrides(root, extra)]
    run_measured(cmd)
    run = RunDir(run_dir)
    s = run.summary()
    if s["steps"] != steps:
        raise SystemExit(f"{' '.join(cmd)}: trained {s['steps']} steps, not {steps} (too few training rows?)")
    intervals = [r["examples_per_sec"] for r in run.metrics()]
    return {"examples_per_sec": s["examples_per_sec"], "steady_examples_per_sec": statistics.median(intervals[1:]),
            "peak_rss_mb_per_worker": max(s["peak_rss_mb_per_worker"]), "threads_per_worker": s["threads_per_worker"]}


# -- one data set ---------------------------------------------------------------------------------
def measure(raw: Dict[str, Any], root: str, nprocs: List[int], steps: int, extra: List[str],
            workdir: str) -> Dict[str, Any]:
    """Every figure of one data set: convert, the one-core loaders, training at each of ``nprocs``
    (``extra``: ``--train-override``'s)."""
    row: Dict[str, Any] = convert(raw, root)
    row.update(data_facts(root))
    print(f"  convert: {row['convert_seconds']:.1f} s, peak RSS {row['convert_peak_rss_mb']:.0f} MB; "
          f"{row['distinct_videos']:,} distinct videos", flush=True)
    row["loader"] = {LOADER_KEYS[r, w, read]: loader_one_core(root, r, w, extra, read) for r, w, read in LOADER_RANKS}
    print("  loader on one core: " + ", ".join(f"rank {k}: {v['rows_per_sec']:,.0f} rows/s "
                                                f"({v['rows_per_cpu_second']:,.0f} per CPU second)"
                                                for k, v in row["loader"].items()), flush=True)
    row["train"] = {}
    for n in nprocs:
        row["train"][str(n)] = t = train(root, n, steps, extra, workdir)
        print(f"  train nproc={n}: {t['examples_per_sec']:,.0f} examples/s "
              f"(steady {t['steady_examples_per_sec']:,.0f}), peak RSS per worker {t['peak_rss_mb_per_worker']:.0f} MB",
              flush=True)
    return row


def code_state() -> Dict[str, Any]:
    """The commit the figures were measured at, and whether the checkout had uncommitted changes."""
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True,
                           text=True).stdout.strip()
    return {"commit": head, "clean": not dirty}


# -- fits and projection --------------------------------------------------------------------------
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


# -- output ---------------------------------------------------------------------------------------
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
    from data_tools.fileio import write_json_atomic

    path = os.path.join(REPO, "benchmarks", "results.json")
    with open(path) as f:
        results = json.load(f)
    results["data_scaling"] = r
    write_json_atomic(path, results)
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


def parse_args(argv) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.scaling", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="0.3M and 1M rows at 100K a day, 30,000 videos, 50 steps; "
                                                         "records nothing in results.json or BENCHMARKS.md")
    ap.add_argument("--rows", help="row counts, comma-separated (default 3e6,10e6,30e6; quick 3e5,1e6)")
    ap.add_argument("--rows-per-day", type=float, help="default 1e6 (quick 1e5); at most 1e7 (the generator's limit)")
    ap.add_argument("--n-videos", type=int, help="the video catalog (default 300000; quick 30000)")
    ap.add_argument("--ids-factor", type=int, default=10,
                    help="an extra data set at the smallest row count with this many times the videos (0: none)")
    ap.add_argument("--steps", type=int, help="training steps per run (default 200; quick 50)")
    ap.add_argument("--nprocs", default="1,2", help="training workers per run, comma-separated (default 1,2)")
    ap.add_argument("--train-override", action="append", default=[], metavar="KEY=VALUE",
                    help="a Hydra override for every training run and the loader's config (repeatable), "
                         "e.g. trainer.threads_per_worker=1")
    ap.add_argument("--out-dir", default=os.path.join(REPO, ".cache", "scaling"),
                    help="generated and converted data (raw pieces reused by a rerun)")
    ap.add_argument("--no-record", action="store_true", help="a full run: leave results.json and BENCHMARKS.md alone")
    args = ap.parse_args(argv)
    mode = MODES["quick" if args.quick else "full"]
    args.rows = sorted(int(float(x)) for x in args.rows.split(",")) if args.rows else mode["rows"]
    args.rows_per_day = int(args.rows_per_day or mode["rows_per_day"])
    args.n_videos = args.n_videos or mode["n_videos"]
    args.steps = args.steps or mode["steps"]
    args.nprocs = [int(x) for x in args.nprocs.split(",")]
    if len(args.rows) < 2 or len(set(args.rows)) != len(args.rows):
        ap.error("--rows: at least two different row counts (a fit needs them)")
    if any(r % args.rows_per_day or r // args.rows_per_day < 3 for r in args.rows):
        ap.error("--rows: each a multiple of --rows-per-day, of at least 3 days (held-out, warm-up and timed days)")
    if args.steps < 2 * LOG_EVERY:
        ap.error(f"--steps: at least {2 * LOG_EVERY} (two of metrics.jsonl's intervals of {LOG_EVERY} steps)")
    args.out_dir = os.path.abspath(args.out_dir)
    return args


def main(argv=None) -> int:
    from data_tools.fileio import write_json_atomic

    args = parse_args(argv)
    command = "python -m benchmarks.scaling" + "".join(f" {a}" for a in (sys.argv[1:] if argv is None else argv))
    load_start = os.getloadavg()[0]
    days = [r // args.rows_per_day for r in args.rows]
    ids_videos = args.n_videos * args.ids_factor
    base_key, ids_key = data_key(args.n_videos, args.rows_per_day), data_key(ids_videos, args.rows_per_day)
    raw, processed = os.path.join(args.out_dir, "raw"), os.path.join(args.out_dir, "processed")
    roots = [os.path.join(processed, base_key, f"days_{n:03d}") for n in days]
    # composed before anything runs: a bad --train-override stops here
    table = embedding_row(compose_config(config_overrides(roots[0], args.train_override)))
    pieces = ensure_pieces(os.path.join(raw, base_key), args.n_videos, args.rows_per_day, days)
    ids_pieces = ensure_pieces(os.path.join(raw, ids_key), ids_videos, args.rows_per_day, days[:1]) \
        if args.ids_factor else None
    sizes: List[Dict[str, Any]] = []
    variants: Dict[str, Dict[str, float]] = {}
    ids_row = None
    with tempfile.TemporaryDirectory(prefix="scaling_") as workdir:
        for i, root in enumerate(roots):
            print(f"{args.rows[i]:,} rows ({days[i]} days)", flush=True)
            sizes.append({"n_videos": args.n_videos,
                          **measure(raw_inputs(pieces[:i + 1]), root, args.nprocs, args.steps, args.train_override,
                                    workdir)})
            if i == 0:
                variants["default"] = sizes[0]["train"][str(args.nprocs[0])]
                for name, extra in TRAIN_VARIANTS.items():
                    variants[name] = train(root, args.nprocs[0], args.steps, [*args.train_override, *extra], workdir)
                    print(f"  {name}: {variants[name]['examples_per_sec']:,.0f} examples/s", flush=True)
        if ids_pieces:
            print(f"ids row: {args.rows[0]:,} rows, {ids_videos:,} videos", flush=True)
            root = os.path.join(processed, ids_key, f"days_{days[0]:03d}")
            ids_row = {"n_videos": ids_videos,
                       **measure(raw_inputs(ids_pieces), root, args.nprocs[:1], args.steps, args.train_override,
                                 workdir)}
    rows = [s["rows"] for s in sizes]
    figures = series(sizes, args.nprocs)
    fits = {name: fit(rows, values) for name, values in figures.items()}
    growth = id_growth(sizes[0], ids_row, args.nprocs[0]) if ids_row else None
    result = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}, "
                   f"torch {importlib.metadata.version('torch')}",
        "date": time.strftime("%Y-%m-%d"), "command": command, "mode": "quick" if args.quick else "full",
        "commit": code_state(),
        "load_average": {"start": load_start, "end": os.getloadavg()[0]},
        "setup": {"rows_per_day": args.rows_per_day, "ids": {**FIXED_IDS, "n_videos": args.n_videos},
                  "steps": args.steps, "nprocs": args.nprocs, "train_overrides": args.train_override,
                  "loader_ranks": list(LOADER_KEYS.values())},
        "rows": rows, **figures, "fits": fits, "targets": targets(figures, fits), "sizes": sizes,
        "ids_row": ids_row, "id_growth": growth, "variants": variants,
        "projection": projection(sizes, figures, fits, growth, args.nprocs, table),
    }
    body = tables(result)
    print("\n" + body)
    out = os.path.join(REPO, "outputs", "benchmarks", f"scaling-{result['mode']}.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    write_json_atomic(out, result)
    print(f"\nwrote {out}")
    if not args.quick and not args.no_record:
        record(result, body)
        print("recorded data_scaling in benchmarks/results.json and the section in BENCHMARKS.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
