"""``python -m studies.range_probes``: why the range test reads the dense edge high. Exploratory probes, not a
study with targets: each changes one thing of the LR finder's dense sweep and asks where the suggestion moves.

Both range tests (the finder's and the replicas') commit the dense rate about 2x above the recovery study's
best cell (docs/results/hdet_history.md, "The range test on the replicas"). Each probe reruns the finder's dense sweep exactly as
the range test's kill test recorded it (``finder_commit``: from the best cell, seeds 0-2, 100 steps from x0.001
to x10000, the embedding held at x0.001 of its start; its lines are read from the truth study's results file,
``docs/results/lr_truth/lr_truth/results.jsonl``) with one change:

- ``half_batch``: 2 workers in one sharding group (``trainer.nproc=2 trainer.sharding_group_size=2``), so the
  dense gradient is averaged over 2 ranks, as in a replica's sweep, not over 4;
- ``embedding_trains``: the embedding at its start's rate (x1) instead of held at x0.001, so the dense groups'
  edge is measured with the embedding learning, as in the pass.

Each sweep's suggestion (fastai's rule as the finder reads it) is compared, seed by seed, with the recorded one.
Results: ``docs/results/range_probes/`` (``results.jsonl``, ``range_probes.{json,md}``), rebuilt from the
results file alone with ``--report-only``.
"""

from __future__ import annotations

import math
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence

from studies.provenance import REPO
from studies.range_tests import finder_sweeps, sweep_suggestion
from studies.reporting import machine_line, write_reports
from studies.results import RESULTS, StudyFiles
from studies.runs import measurement_parser, train_missing
from studies.starts import PRESET, recovery_anchor, start_lrs

OUT = os.path.join(REPO, "docs", "results", "range_probes")
TRUTH_RESULTS = os.path.join(REPO, "docs", "results", "lr_truth", "lr_truth", RESULTS)
START, SEEDS = "best", (0, 1, 2)
PROBES: Dict[str, str] = {
    "half_batch": "the dense gradient averaged over 2 ranks (trainer.nproc=2 trainer.sharding_group_size=2)",
    "embedding_trains": "the embedding at its start's rate (x1), not held at x0.001",
}


def recorded_name(seed: int) -> str:
    """The finder's recorded dense sweep from the start (the kill test's ``finder_commit`` lines)."""
    return f"finder_commit/{START}/seed{seed}/sweep_dense"


def probe_name(probe: str, seed: int) -> str:
    return f"{probe}/{START}/seed{seed}/sweep_dense"


def overrides(probe: str, seed: int, anchor: Sequence[float]) -> List[str]:
    """The recorded sweep's overrides with the probe's one change."""
    embedding, dense = start_lrs(START, tuple(anchor))
    sweep = [f"+experiment={PRESET}", f"seed={seed}", *finder_sweeps(embedding, dense)["dense"]]
    if probe == "half_batch":
        return [*sweep, "trainer.nproc=2", "trainer.sharding_group_size=2"]
    if probe == "embedding_trains":
        return [o for o in sweep if not o.startswith("optim.lr.embedding=")] + [f"optim.lr.embedding={embedding:g}"]
    raise ValueError(f"probe {probe!r}: not one of {', '.join(PROBES)}")


def table(results: Mapping[str, Mapping[str, Any]], recorded: Mapping[str, Mapping[str, Any]]) -> Dict[str, Any]:
    """Per probe and seed the suggested dense multiplier beside the recorded sweep's, and the geometric mean of
    their ratios over the seeds both have."""
    probes: Dict[str, Any] = {}
    for probe, what in PROBES.items():
        rows = []
        for seed in SEEDS:
            line, base = results.get(probe_name(probe, seed)), recorded.get(recorded_name(seed))
            if line is None or base is None:
                continue
            rows.append({"seed": seed, "suggestion": sweep_suggestion(line), "recorded": sweep_suggestion(base),
                         "status": line["status"], "steps": line["steps"], "commit": line.get("commit"),
                         "clean": line.get("clean")})
        ratios = [r["suggestion"] / r["recorded"] for r in rows if r["suggestion"] and r["recorded"]]
        probes[probe] = {"what": what, "seeds": rows,
                         "ratio_geomean": math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None}
    return {"start": START, "sweep": "the finder's dense sweep, 100 steps, x0.001 to x10000 (finder_commit)",
            "probes": probes}


def render(t: Mapping[str, Any]) -> str:
    lines = ["# Where the range test reads the dense edge: probes", "",
             f"Produced by `python -m studies.range_probes` on {machine_line()}. Each row: {t['sweep']} from "
             f"`{t['start']}`, rerun with one change, its suggested dense multiplier beside the recorded sweep's "
             "(same start and seed; fastai's rule). Exploratory: no target, no verdict.", "",
             "| probe | what changed | seed | suggestion | recorded | ratio |", "|---|---|---|---|---|---|"]
    for probe, p in t["probes"].items():
        for r in p["seeds"]:
            ratio = r["suggestion"] / r["recorded"] if r["suggestion"] and r["recorded"] else None
            lines.append(f"| {probe} | {p['what']} | {r['seed']} | {r['suggestion']:.3g} | {r['recorded']:.3g} | "
                         f"{'-' if ratio is None else f'{ratio:.3g}'} |")
        if p["ratio_geomean"] is not None:
            lines.append(f"| {probe} | | all | | | **{p['ratio_geomean']:.3g}** (geometric mean) |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = measurement_parser("python -m studies.range_probes", __doc__, OUT).parse_args(argv)
    files = StudyFiles.open(args.out, train=not args.report_only, contract=None)
    recorded = StudyFiles.open(os.path.dirname(TRUTH_RESULTS), train=False, contract=None).results
    anchor = recovery_anchor()
    plan = [] if args.report_only else [(probe_name(probe, seed), overrides(probe, seed, anchor))
                                        for probe in PROBES for seed in SEEDS]
    train_missing(files, plan, args.data_cache, lambda name, r: f"{name}: {r['status']} at step {r['steps']}, "
                  f"suggests x{sweep_suggestion(r):.3g}")
    result = table(files.results, recorded)
    write_reports(args.out, "range_probes", result, render(result))
    print(f"wrote {os.path.join(args.out, 'range_probes.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
