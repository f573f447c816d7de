"""``python -m studies.probe_bias``: which way does the probe signal push, and why?

In the first recovery study (docs/results/lr_recovery/lr_recovery/lr_recovery.md, the bench data's first format) the scale-free controller lowered every group's base
from every start, the 10x-too-low one included. This diagnostic asks whether the bias comes from
what the probe scores. It runs, on the benchmark data set (format 2, today's loader), the study's
first scale-free HDET controller (``RANK_X2``) from the study's tuned point (embedding 6,
dense 0.03) and from all-low (0.6, 0.003), with three forms of the probe:

- ``probe_mix=1.0``: each replica scores itself (the study's form);
- ``probe_mix=replicas``: ``avg + (own - avg) / N``: a replica's own noise weighed as the averaged
  model keeps it (tests whether the bias is the replicas' extra noise);
- ``probe_mix=0.05``: ``avg + 0.05 (own - avg)``: to first order, how each replica's displacement
  moves the *averaged* model's loss (tests whether it is the replicas' own overshoot);
- ``score=regression``: the replica itself, but each group's signal from one joint fit of the losses
  on all groups' offsets (tests whether the per-group correlations' confounding decides the sign);
- ``autolr=false``: the same spread and averaging with the controller off (what HDET costs before
  the controller does anything);
- ``alpha=0``: no spread and no controller, only the averaging every ``hdet.sync_every`` steps
  (the plain run averages the embedding replicas every step): the sync interval's cost alone;
- ``regression,alpha=0.25`` and ``autolr=false,alpha=0.25``: the joint fit with a x1.25 spread
  instead of x2, and that spread with the controller off (tests whether the x2 spread, not the
  controller, is what costs NE: the probe's noise is ~1/76 of a x2 spread's effect, so a narrower
  spread still leaves a clear signal);
- ``regression,alpha=0.25,start=300``: that joint fit with the controller from the end of the
  warm-up instead of step 0 (tests whether the downward push is the warm-up's short-horizon bias);

plus the plain runs at both points. Seed 0 only: a diagnostic, not a study. Writes
``docs/results/probe_bias/probe_bias.md``/``.json``: per run, held-out NE (mean over tasks) and each group's final
base over its start (geometric mean over the last quarter of the syncs, as the study reports it).
Resumable like the ablation: each finished run's line goes to ``<out>/results.jsonl``, a run with a
line is skipped, and ``--report-only`` rebuilds the report from that file (and the recovery study's,
``--study``) alone. Run directories go to ``--work`` (default ``outputs/studies/probe_bias``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from typing import Any, Dict, List, Tuple

from recsys_hdet.constants import DENSE_GROUPS
from studies.contract import StudyMismatch
from studies.record import mean_ne, sync_records
from studies.results import RESULTS, ResultsError, StudyFiles, load, run_name
from studies.runs import AblationConfig, run_one
from studies.starts import lr_overrides
from studies.trajectory import final_bases

STARTS: Dict[str, Tuple[float, float]] = {"tuned": (6.0, 0.03), "all_low": (0.6, 0.003)}
# The controller every form below varies: the recovery study's first scale-free form (probe signal,
# centred ranks, log space, x2 spread, from step 0). Frozen here, so that these runs stay resumable and
# comparable after the study moved on to the form this diagnostic chose (regression, x1.25 spread).
RANK_X2 = ("hdet=controller", "hdet.space=log", "hdet.score=rank", "hdet.signal=probe", "hdet.alpha=1.0",
           "hdet.controller_start=0", "hdet.beta=0.5", "hdet.travel_decades=3.0")


def replaced(base: Tuple[str, ...], changes: Dict[str, str]) -> Tuple[str, ...]:
    """``base``'s ``key=value`` overrides with ``changes`` applied: a changed key keeps its place, a new
    one is appended (the order is part of each finished run's record, which a rerun must match)."""
    return tuple(f"{k}={v}" for k, v in {**dict(o.split("=", 1) for o in base), **changes}.items())


FORMS: Dict[str, Tuple[str, ...]] = {
    "plain": (),
    "probe_mix=1.0": (*RANK_X2, "hdet.probe_mix=1.0"),
    "probe_mix=replicas": (*RANK_X2, "hdet.probe_mix=replicas"),
    "probe_mix=0.05": (*RANK_X2, "hdet.probe_mix=0.05"),
    # One joint fit of the losses on every group's offset instead of one correlation per group
    # (pooled over syncs: beta 0.9 keeps ~10 syncs, enough degrees of freedom for 4 groups).
    "score=regression": replaced(RANK_X2, {"hdet.score": "regression", "hdet.beta": "0.9"}),
    # The spread and the averaging without any control: what HDET costs before the controller acts.
    "autolr=false": (*RANK_X2, "hdet.autolr=false"),
    # No spread either: only the averaging every hdet.sync_every steps (plain averages the embedding
    # replicas every step): the cost of the sync interval alone.
    "alpha=0": replaced(RANK_X2, {"hdet.alpha": "0", "hdet.autolr": "false"}),
}
# The probe's noise is ~1/76 of a x2 spread's effect (docs/results/signal_noise/signal_noise.md), so a much narrower spread
# still gives a clear signal, and the x2 spread alone costs 0.005-0.008 NE (autolr=false vs alpha=0):
# the joint fit with a x1.25 spread, and that spread with the controller off (its cost alone).
FORMS["regression,alpha=0.25"] = replaced(FORMS["score=regression"], {"hdet.alpha": "0.25"})
# The x1.25 joint fit with the controller from step 300 (after OneCycle's warm-up, 30% of ~976 steps)
# instead of 0: the study's first HDET run lowered the dense groups mostly in the first half, during
# the warm-up (docs/results/lr_recovery/lr_recovery_f2 tuned/hdet seed 0: slopes +44..+55 x 1e-4 per log2 unit there, +2
# in the second half), when a short window penalizes a higher LR most, which the warm-up exists for.
FORMS["regression,alpha=0.25,start=300"] = replaced(FORMS["regression,alpha=0.25"], {"hdet.controller_start": "300"})
FORMS["autolr=false,alpha=0.25"] = replaced(RANK_X2, {"hdet.alpha": "0.25", "hdet.autolr": "false"})


def _name(start: str, form: str) -> str:
    return f"{start}/{form.replace('=', '_').replace(',', '__')}"


def run_all(study: StudyFiles, report_only: bool = False) -> List[Dict[str, Any]]:
    rows = []
    for start, (emb, dense) in STARTS.items():
        for form, extra in FORMS.items():
            name = _name(start, form)
            res = run_one(study, AblationConfig(name, "baseline_low", name, None, None), 0,
                          [*lr_overrides(emb, dense), *extra], report_only)
            summary = res["record"]
            missing = "crashed" if res.get("crashed") else "not run yet"
            row: Dict[str, Any] = {"start": start, "form": form, "status": summary["status"] if summary else missing,
                                   "ne": mean_ne(summary) if summary else None}
            if summary and form != "plain" and summary["status"] == "completed":
                bases = final_bases(summary)
                row["final_over_start"] = {"embedding": bases["embedding"] / emb,
                                           **{g: bases[g] / dense for g in DENSE_GROUPS}}
            rows.append(row)
            print(f"{name}: {row['status']}, NE {row['ne']}", flush=True)
    return rows


GROUPS = ("embedding", *DENSE_GROUPS)


def probe_slopes(syncs: List[Dict[str, Any]]) -> List[Dict[str, float]]:
    """What the controller saw in a finished HDET run (its sync records, hdet.jsonl's form, e.g.
    :func:`studies.record.sync_records` of its results line): per half of the pass, the least-squares slope
    of the replicas' probe losses on every group's log2 multiplier, fitted jointly (the four groups'
    permutations are independent, so one joint fit separates their effects), with each sync's
    losses and multipliers centred. In loss units per doubling of that group's LR: positive, the
    higher-LR replicas scored worse."""
    import numpy as np

    X, Y = [], []
    for r in syncs:
        hp, losses = r.get("hparams") or {}, r.get("losses") or []
        if not hp or not losses or any(x is None for x in losses):
            continue
        n = len(losses)
        rows = []
        for rank in range(n):
            feats = []
            for g in GROUPS:
                h = hp[f"lr/{g}"]
                replica = rank * len(h["values"]) // n  # contiguous blocks of ranks form one replica
                feats.append(math.log2(h["values"][replica] / h["base"]))
            rows.append(feats)
        a, y = np.array(rows), np.array(losses, dtype=float)
        X.append(a - a.mean(0))
        Y.append(y - y.mean())
    out = []
    for part in (slice(0, len(X) // 2), slice(len(X) // 2, None)):
        xs, ys = np.concatenate(X[part]), np.concatenate(Y[part])
        coef = np.linalg.lstsq(xs, ys, rcond=None)[0]
        out.append({g: float(c) for g, c in zip(GROUPS, coef)})
    return out


def study_slopes(study: str) -> List[Dict[str, Any]]:
    """:func:`probe_slopes` of the recovery study's scale-free HDET runs (those finished), from its
    results file (``<study>/results.jsonl``)."""
    results = load(os.path.join(study, RESULTS))
    rows = []
    for start in ("tuned", "all_low", "all_high", "emb_low_dense_high", "emb_high_dense_low"):
        for seed in (0, 1, 2):
            summary = results.get(run_name(f"{start}/hdet", seed))
            if summary and summary.get("status") == "completed":
                first, second = probe_slopes(sync_records(summary))
                rows.append({"start": start, "seed": seed, "first_half": first, "second_half": second})
    return rows


def costs(rows: List[Dict[str, Any]]) -> str:
    """Each start's NE cost of the spread alone (controller off minus no spread) and of the controller
    (controller on minus off, same spread), from the runs in the table: what HDET costs, and where."""
    ne = {(r["start"], r["form"]): r["ne"] for r in rows if r["status"] == "completed"}
    out = []
    for start in STARTS:
        for label, off, on in (("x2 spread, controller from step 0", "autolr=false", "score=regression"),
                               ("x1.25 spread, controller from step 0", "autolr=false,alpha=0.25",
                                "regression,alpha=0.25"),
                               ("x1.25 spread, controller from step 300", "autolr=false,alpha=0.25",
                                "regression,alpha=0.25,start=300")):
            base, o, c = ne.get((start, "alpha=0")), ne.get((start, off)), ne.get((start, on))
            if None not in (base, o, c):
                out.append(f"- {start}, {label}: the spread alone {o - base:+.4f}, the controller (joint fit) "
                           f"{c - o:+.4f}.")
    if not out:
        return ""
    return "NE cost (mean held-out NE, positive is worse; one seed: the plain runs' seed std in the recovery studies is 0.0011 to 0.0025), " \
           "from the rows above:\n\n" + "\n".join(out)


def write(rows: List[Dict[str, Any]], docs: str, slopes: List[Dict[str, Any]] = ()) -> None:
    fmt = lambda x, d=4: "-" if x is None else f"{x:.{d}f}"
    slope_lines = ["| start | seed | half | " + " | ".join(GROUPS) + " |", "|---|---|---|" + "---|" * len(GROUPS)]
    for r in slopes:
        for half in ("first_half", "second_half"):
            slope_lines.append(f"| {r['start']} | {r['seed']} | {half.replace('_', ' ')} | "
                               + " | ".join(f"{r[half][g] * 1e4:+.2f}" for g in GROUPS) + " |")
    if slopes:
        positive = sum(r["second_half"]["non_embedding"] > 0 for r in slopes)
        slope_lines.append(f"\nnon_embedding's second-half slope is positive in {positive} of {len(slopes)} runs.")
    lines = ["| start | probe form | status | held-out NE | embedding | transformer | non_embedding | no_decay |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        f = r.get("final_over_start", {})
        lines.append(f"| {r['start']} | {r['form']} | {r['status']} | {fmt(r['ne'])} | "
                     + " | ".join(fmt(f.get(g), 3) for g in ("embedding", *DENSE_GROUPS)) + " |")
    md = f"""# Which way does the probe signal push? (a diagnostic)

Produced by `python -m studies.probe_bias` on {platform.machine()}, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}.
Benchmark data set (format 2), `baseline_low` preset, seed 0, the recovery study's scale-free controller
(`RANK_X2`, the study's first scale-free form: probe signal, centred ranks, log space, x2 spread, from step 0) with
the forms listed in the pipeline's docstring (what each replica's probe scores, the joint fit, the
spread's width, the controller off), and the plain runs at the same max LRs. The group columns are each group's final base over the max LR it
started from (geometric mean over the last quarter of the syncs): below 1, the controller lowered it.
One seed: a diagnostic of direction, not a measurement of size.

{chr(10).join(lines)}

{costs(rows)}

## What the probe saw in the recovery study's runs

Per finished scale-free HDET run of `docs/results/lr_recovery/lr_recovery` (the bench data's first format, 3 seeds per start): the slope of
the replicas' probe losses on each group's log2 LR multiplier, fitted jointly over all groups and the
syncs of each half of the pass (losses centred per sync), x 1e4: positive, the higher-LR replicas scored
worse (the controller then lowers that group).

{chr(10).join(slope_lines)}
"""
    os.makedirs(docs, exist_ok=True)
    with open(os.path.join(docs, "probe_bias.json"), "w") as fh:
        json.dump({"runs": rows, "study_probe_slopes": list(slopes)}, fh, indent=1)
    with open(os.path.join(docs, "probe_bias.md"), "w") as fh:
        fh.write(md)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="docs/results/probe_bias/probe_bias",
                    help="study directory: its results.jsonl (committed, so a later session resumes)")
    ap.add_argument("--work", default=None, help="where the run directories go (default: --out, or "
                    "outputs/studies/<study> for a study under docs/)")
    ap.add_argument("--docs", default="docs/results/probe_bias")
    ap.add_argument("--study", default="docs/results/lr_recovery/lr_recovery",
                    help="the recovery study whose HDET runs' signal is read (its results.jsonl)")
    ap.add_argument("--report-only", action="store_true", help="train nothing: the report from the results files alone")
    args = ap.parse_args(argv)
    try:
        rows = run_all(StudyFiles.open(args.out, args.work), args.report_only)
        slopes = study_slopes(args.study)
    except (StudyMismatch, ResultsError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    write(rows, args.docs, slopes)
    print(f"wrote {args.docs}/probe_bias.md and .json")
    return 0 if all(r["status"] != "crashed" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
