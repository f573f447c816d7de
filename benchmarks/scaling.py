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

- **convert**: ``python -m data_tools.convert log=[...] users=... videos=... data.root=...`` (its
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
  (``trainer.stop_at_step``), no checkpoints; examples/s is ``RunDir.SUMMARY``'s (the pass, data
  loading and the first steps included) and the steady figure the median of ``RunDir.METRICS``'s
  intervals after the first; peak RSS per worker is the largest of ``RunDir.SUMMARY``'s
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
import os
import sys
import tempfile
import time
from typing import Any, Dict, List

from benchmarks.recording import REPO, code_state, command_line, machine
from benchmarks.scaling_data import FIXED_IDS, data_key, ensure_pieces, processed_root, raw_inputs
from benchmarks.scaling_fits import embedding_row, fit, id_growth, projection, series, targets
from benchmarks.scaling_measure import (LOADER_KEYS, LOG_EVERY, compose_config, config_overrides, measure,
                                        train)
from benchmarks.scaling_report import record, tables
from data_tools.fileio import write_json_atomic
from recsys_hdet.run_dir import RunDir

MODES = {
    "full": {"rows": [3_000_000, 10_000_000, 30_000_000], "rows_per_day": 1_000_000, "n_videos": 300_000,
             "steps": 200},
    "quick": {"rows": [300_000, 1_000_000], "rows_per_day": 100_000, "n_videos": 30_000, "steps": 50},
}
TRAIN_VARIANTS = {  # side by side at the smallest size, beside the default run
    "compile_dense=true": ["model.compile_dense=true"],
    "threads_per_worker=1": ["trainer.threads_per_worker=1"],
    "threads_per_worker=2": ["trainer.threads_per_worker=2"],
}


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
        ap.error(f"--steps: at least {2 * LOG_EVERY} (two of {RunDir.METRICS}'s intervals of {LOG_EVERY} steps)")
    args.out_dir = os.path.abspath(args.out_dir)
    return args


def measure_sizes(args: argparse.Namespace, roots: List[str], pieces: List[str], ids: Dict[str, Any] | None,
                  workdir: str) -> Dict[str, Any]:
    """Every size's figures (``sizes``), the training variants side by side at the smallest size
    (``variants``) and the ids row's figures (``ids_row``; ``ids``: its ``pieces``, ``root`` and
    ``n_videos``, or None)."""
    sizes: List[Dict[str, Any]] = []
    variants: Dict[str, Dict[str, float]] = {}
    for i, root in enumerate(roots):
        print(f"{args.rows[i]:,} rows ({args.rows[i] // args.rows_per_day} days)", flush=True)
        sizes.append({"n_videos": args.n_videos,
                      **measure(raw_inputs(pieces[:i + 1]), root, args.nprocs, args.steps, args.train_override,
                                workdir)})
        if i == 0:
            variants["default"] = sizes[0]["train"][str(args.nprocs[0])]
            for name, extra in TRAIN_VARIANTS.items():
                variants[name] = train(root, args.nprocs[0], args.steps, [*args.train_override, *extra], workdir)
                print(f"  {name}: {variants[name]['examples_per_sec']:,.0f} examples/s", flush=True)
    ids_row = None
    if ids:
        print(f"ids row: {args.rows[0]:,} rows, {ids['n_videos']:,} videos", flush=True)
        ids_row = {"n_videos": ids["n_videos"],
                   **measure(raw_inputs(ids["pieces"]), ids["root"], args.nprocs[:1], args.steps,
                             args.train_override, workdir)}
    return {"sizes": sizes, "variants": variants, "ids_row": ids_row}


def main(argv=None) -> int:
    args = parse_args(argv)
    command = command_line("benchmarks.scaling", argv)
    load_start = os.getloadavg()[0]
    days = [r // args.rows_per_day for r in args.rows]
    ids_videos = args.n_videos * args.ids_factor
    base_key, ids_key = data_key(args.n_videos, args.rows_per_day), data_key(ids_videos, args.rows_per_day)
    raw = os.path.join(args.out_dir, "raw")
    roots = [processed_root(args.out_dir, args.n_videos, args.rows_per_day, n) for n in days]
    # composed before anything runs: a bad --train-override stops here
    table = embedding_row(compose_config(config_overrides(roots[0], args.train_override)))
    pieces = ensure_pieces(os.path.join(raw, base_key), args.n_videos, args.rows_per_day, days)
    ids = {"pieces": ensure_pieces(os.path.join(raw, ids_key), ids_videos, args.rows_per_day, days[:1]),
           "root": processed_root(args.out_dir, ids_videos, args.rows_per_day, days[0]), "n_videos": ids_videos} \
        if args.ids_factor else None
    with tempfile.TemporaryDirectory(prefix="scaling_") as workdir:
        m = measure_sizes(args, roots, pieces, ids, workdir)
    sizes, ids_row = m["sizes"], m["ids_row"]
    rows = [s["rows"] for s in sizes]
    figures = series(sizes, args.nprocs)
    fits = {name: fit(rows, values) for name, values in figures.items()}
    growth = id_growth(sizes[0], ids_row, args.nprocs[0]) if ids_row else None
    result = {
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d"), "command": command, "mode": "quick" if args.quick else "full",
        "commit": code_state(),
        "load_average": {"start": load_start, "end": os.getloadavg()[0]},
        "setup": {"rows_per_day": args.rows_per_day, "ids": {**FIXED_IDS, "n_videos": args.n_videos},
                  "steps": args.steps, "nprocs": args.nprocs, "train_overrides": args.train_override,
                  "loader_ranks": list(LOADER_KEYS.values())},
        "rows": rows, **figures, "fits": fits, "targets": targets(figures, fits), "sizes": sizes,
        "ids_row": ids_row, "id_growth": growth, "variants": m["variants"],
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
