"""``python -m studies.range_replicas``: where the range test on the replicas commits with 2, 3 and 4 replicas, on the
same data from the same start. A measurement, not a study with targets.

Each replica's dense batch is the global batch over the replicas, and the divisors were measured at R = 2 (the
benchmark's layout: 4 workers, 2 sharding groups of 2). From the recovery study's best cell (its anchor) on the
benchmark data, ``hdet=enabled`` as the product ships it, stopped after the pass's first step (the commit is made
before it), seeds 0 and 1, in four layouts (:data:`LAYOUTS`): R = 2 with 1024 rows per replica (the benchmark's), R =
4 with 512 (the same global batch), R = 2 and R = 3 with 512 (one rank per replica). Per layout and seed: each axis's
committed multiplier of the best cell, and its ratio to the benchmark layout's on the same seed.

Results: ``docs/results/range_replicas/`` (``results.jsonl``, ``range_replicas.{json,md}``), rebuilt from the
results file alone with ``--report-only``; every line names its commit (run it from a clean worktree).
"""

from __future__ import annotations

import math
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence

from studies.provenance import REPO
from studies.reporting import machine_line, write_reports
from studies.results import StudyFiles
from studies.runs import measurement_parser, train_missing
from studies.starts import PRESET, lr_overrides, recovery_anchor

OUT = os.path.join(REPO, "docs", "results", "range_replicas")
SEEDS = (0, 1)
REFERENCE = "r2_groups_of_2"
LAYOUTS: Dict[str, Dict[str, Any]] = {
    "r2_groups_of_2": {"overrides": ["trainer.nproc=4", "trainer.sharding_group_size=2"], "replicas": 2,
                       "rows_per_replica": 1024},
    "r4_groups_of_1": {"overrides": ["trainer.nproc=4", "trainer.sharding_group_size=1"], "replicas": 4,
                       "rows_per_replica": 512},
    "r2_groups_of_1": {"overrides": ["trainer.nproc=2", "trainer.sharding_group_size=1"], "replicas": 2,
                       "rows_per_replica": 512},
    "r3_groups_of_1": {"overrides": ["trainer.nproc=3", "trainer.sharding_group_size=1"], "replicas": 3,
                       "rows_per_replica": 512},
}


def run_name(layout: str, seed: int) -> str:
    return f"{layout}/seed{seed}"


def overrides(layout: str, seed: int, anchor: Sequence[float]) -> List[str]:
    return [f"+experiment={PRESET}", f"seed={seed}", *lr_overrides(*anchor), "hdet=enabled",
            "trainer.stop_at_step=1", *LAYOUTS[layout]["overrides"]]


def multipliers(line: Mapping[str, Any]) -> Optional[Dict[str, float]]:
    record = ((line.get("hdet") or {}).get("range_test") or {}).get("axes")
    return {axis: a["multiplier"] for axis, a in record.items()} if record else None


def table(results: Mapping[str, Mapping[str, Any]]) -> Dict[str, Any]:
    rows, ratios = [], {}
    for layout, spec in LAYOUTS.items():
        for seed in SEEDS:
            line, ref = results.get(run_name(layout, seed)), results.get(run_name(REFERENCE, seed))
            got, base = (multipliers(line) if line else None), (multipliers(ref) if ref else None)
            if got is None:
                continue
            flags = {a: x.get("off_map", []) for a, x in line["hdet"]["range_test"]["axes"].items()}
            ratio = {a: got[a] / base[a] for a in got} if base else None
            rows.append({"layout": layout, "seed": seed, **spec, "multiplier": got, "ratio_to_reference": ratio,
                         "off_map": flags, "commit": line.get("commit"), "clean": line.get("clean")})
            for a, r in (ratio or {}).items():
                ratios.setdefault(layout, {}).setdefault(a, []).append(r)
    geomean = {layout: {a: math.exp(sum(map(math.log, v)) / len(v)) for a, v in axes.items()}
               for layout, axes in ratios.items()}
    return {"start": "the recovery study's best cell (its anchor)", "seeds": list(SEEDS), "reference": REFERENCE,
            "rows": rows, "ratio_geomean": geomean}


def render(t: Mapping[str, Any]) -> str:
    lines = ["# The range test on the replicas with 2, 3 and 4 replicas", "",
             f"Produced by `python -m studies.range_replicas` on {machine_line()}. From {t['start']}, `hdet=enabled` as "
             "shipped, the benchmark data; each row one layout and seed: the committed multiplier of the best cell per "
             f"axis, and its ratio to the benchmark layout's (`{t['reference']}`) on the same seed. A measurement: no "
             "target.", "",
             "| layout | replicas | rows per replica | seed | embedding | dense | ratio embedding / dense | off the map |",
             "|---|---|---|---|---|---|---|---|"]
    for r in t["rows"]:
        ratio = r["ratio_to_reference"]
        flags = "; ".join(f"{a}: {', '.join(f)}" for a, f in r["off_map"].items() if f) or "-"
        lines.append(f"| {r['layout']} | {r['replicas']} | {r['rows_per_replica']} | {r['seed']} | "
                     f"x{r['multiplier']['embedding']:.3g} | x{r['multiplier']['dense']:.3g} | "
                     + (f"{ratio['embedding']:.3g} / {ratio['dense']:.3g}" if ratio else "-") + f" | {flags} |")
    for layout, g in t["ratio_geomean"].items():
        lines.append(f"| {layout} | | | all | | | **{g['embedding']:.3g} / {g['dense']:.3g}** (geometric mean) | |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = measurement_parser("python -m studies.range_replicas", __doc__, OUT).parse_args(argv)
    files = StudyFiles.open(args.out, train=not args.report_only, contract=None)
    anchor = recovery_anchor()
    plan = [] if args.report_only else [(run_name(layout, seed), overrides(layout, seed, anchor))
                                        for layout in LAYOUTS for seed in SEEDS]
    train_missing(files, plan, args.data_cache,
                  lambda name, r: f"{name}: {r['status']}, committed {multipliers(r)}")
    result = table(files.results)
    write_reports(args.out, "range_replicas", result, render(result))
    print(f"wrote {os.path.join(args.out, 'range_replicas.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
