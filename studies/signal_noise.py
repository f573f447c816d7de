"""``python -m studies.signal_noise``: how noisy is each HDET signal, against the effect it measures?

Four HDET runs of one preset (default: ``baseline_low`` on the benchmark data, cold start), the
controller off so that every run follows the same schedule:

- ``train_alpha0`` / ``probe_alpha0``: no spread. Every replica trains with the same learning
  rates, so every difference between the replicas' losses at a sync is noise: with ``train``, each
  rank's window loss on its own data; with ``probe``, the replicas scored on the same rows (what is
  left is the drift of the embedding copies between syncs).
- ``train_spread`` / ``probe_spread``: the scale-free controller's spread (log space, x2 each way,
  ``alpha = 1``): the differences now also carry the learning rates' effect.

For each run, from ``hdet.jsonl``: the standard deviation of the replicas' deviations from their
mean at each sync (pooled over syncs), and per learning-rate group the mean over syncs of the rank
correlation between ``-loss`` and the replicas' spread offsets (``preference``: what the ``rank``
score feeds the controller; 0 on average when there is nothing to find). Writes
``signal_noise.{md,json}``. Resumable like the ablation: each finished run's line (its sync records
included) goes to ``<out>/results.jsonl``, a run with a line is skipped, and ``--report-only``
rebuilds the report from that file alone. Run directories go to ``--work`` (default
``outputs/studies/signal_noise``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from typing import Any, Dict, Optional, Sequence

import torch

from recsys_hdet.constants import PARAM_GROUPS as GROUPS
from recsys_hdet.hdet.controller.statistics import preference, spread_offsets
from studies.contract import StudyMismatch
from studies.record import sync_records
from studies.reporting import fmt as _f, machine_line, write_reports
from studies.results import ResultsError, StudyFiles
from studies.runs import AblationConfig, run_one

COMMON = ("hdet=controller", "hdet.autolr=false", "hdet.space=log", "hdet.score=rank")
RUNS = {
    "train_alpha0": (*COMMON, "hdet.alpha=0.0", "hdet.signal=train"),
    "probe_alpha0": (*COMMON, "hdet.alpha=0.0", "hdet.signal=probe"),
    "train_spread": (*COMMON, "hdet.alpha=1.0", "hdet.signal=train"),
    "probe_spread": (*COMMON, "hdet.alpha=1.0", "hdet.signal=probe"),
}


def measure(records) -> Dict[str, Any]:
    """Noise (std of per-sync deviations) and per-group mean rank preference from sync records."""
    deviations, prefs = [], {g: [] for g in GROUPS}
    for r in records:
        losses = r["losses"]
        if None in losses or not r.get("hparams"):
            continue
        mean = statistics.fmean(losses)
        deviations += [x - mean for x in losses]
        for g in GROUPS:
            h = r["hparams"].get(f"lr/{g}")
            if h is None or h["base"] <= 0:
                continue
            n = len(h["values"])
            # Each replica's offset u from its value: value = base (1 + alpha)^u, so u is the
            # rank of value / base among the spread's; with no spread every u is 0.
            ratios = [v / h["base"] for v in h["values"]]
            if max(ratios) == min(ratios):
                continue  # no spread: nothing to correlate with
            u = torch.zeros(n, dtype=torch.float64)
            u[sorted(range(n), key=ratios.__getitem__)] = spread_offsets(n)
            per_replica = torch.tensor([statistics.fmean(losses[k] for k in _members(len(losses), n, i))
                                        for i in range(n)], dtype=torch.float64)
            prefs[g].append(preference(per_replica, torch.ones(n, dtype=torch.bool), u, "rank", 1.0))
    return {"syncs": len(records), "noise_std": statistics.pstdev(deviations) if deviations else None,
            "preference": {g: statistics.fmean(p) if p else None for g, p in prefs.items()}}


def _members(ranks: int, replicas: int, i: int):
    """The ranks of replica ``i`` when ``ranks`` ranks form ``replicas`` contiguous replicas."""
    block = ranks // replicas
    return range(i * block, (i + 1) * block)


def render_markdown(result: Dict[str, Any]) -> str:
    lines = ["# HDET signal noise", "", f"Produced by `{result['command']}` on {result['machine']}. Noise: the "
             "standard deviation of the replicas' losses around their mean at each sync, pooled over syncs. "
             "Preference: the mean over syncs of the rank correlation between -loss and each replica's spread "
             "offset (what the rank score gives the controller; positive: higher learning rates did better).", "",
             "| run | syncs | loss std across replicas | " + " | ".join(f"preference {g}" for g in GROUPS) + " | train loss |",
             "|---|---|---|" + "---|" * (len(GROUPS) + 1)]
    for name, m in result["runs"].items():
        lines.append(f"| {name} | {m['syncs']} | {_f(m['noise_std'], 5)} | "
                     + " | ".join(_f(m["preference"][g], 3) for g in GROUPS) + f" | {_f(m['train_loss'])} |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m studies.signal_noise", description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="baseline_low")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="docs/results/signal_noise/signal_noise",
                    help="study directory: its results.jsonl (committed, so a later session resumes)")
    ap.add_argument("--work", default=None, help="where the run directories go (default: --out, or "
                    "outputs/studies/<study> for a study under docs/)")
    ap.add_argument("--docs", default="docs/results/signal_noise", help="where signal_noise.{md,json} go")
    ap.add_argument("--report-only", action="store_true", help="train nothing: the report from the results file alone")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides for every run")
    args = ap.parse_args(argv)
    result: Dict[str, Any] = {"preset": args.preset, "seed": args.seed, "runs": {}}
    try:
        study = StudyFiles.open(args.out, args.work)
    except ResultsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for name, overrides in RUNS.items():
        try:
            res = run_one(study, AblationConfig(name, args.preset, name, None, None), args.seed,
                          [*overrides, *args.overrides], args.report_only)
        except StudyMismatch as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        if res.get("crashed"):
            print(f"{name}: CRASHED (exit status {res['exit_status']}), see {res['log']}", file=sys.stderr)
            return 1
        record = res["record"]
        if record is None:  # --report-only, not run yet
            print(f"{name}: not run yet", flush=True)
            continue
        m = measure(sync_records(record))
        m["train_loss"] = record["train_loss"]["avg"]
        result["runs"][name] = m
        print(f"{name}: noise std {_f(m['noise_std'], 5)}, preference "
              + " ".join(f"{g}={_f(v, 3)}" for g, v in m["preference"].items()), flush=True)
    result["command"] = "python -m studies.signal_noise " + " ".join(sys.argv[1:] if argv is None else argv)
    result["machine"] = machine_line()
    docs = os.path.abspath(args.docs)
    write_reports(docs, "signal_noise", result, render_markdown(result))
    print(f"wrote signal_noise.md/.json into {docs}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
