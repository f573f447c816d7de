"""``python -m studies.range_check``: how often the check of the range test's curves flags a commit that lay off its
setting's plateau, and how often one that lay on it (issue 59 item 5; the travel-rule's (e)). Trains nothing.

The check (:mod:`recsys_hdet.hdet.range_test.check`), the one definition of "on the plateau" and the targets were
pre-registered before any plateau comparison (docs/results/hdet_history.md, ``range-check-rule``, quoted into the
report). For every recorded range-test run - the benchmark's recovery study (``lr_recovery_f3``, against
``docs/results/lr_recovery/lr_recovery.json``'s plateau) and each setting of :mod:`studies.settings` that has them
(``docs/results/rule_travels/NAME/``, against its own ``lr_recovery.json``) - the check is recomputed from the run's
recorded curves, and the commit is on the plateau when one plateau cell lies within x10^0.25 (half a lattice step) of
both the committed embedding max LR and the committed dense groups' geometric mean. A commit is flagged when either
axis is. The 2x2 table (flagged or passed, off or on) per source and pooled; the targets judged on the pooled one.

``--root DIR`` reads the results under another checkout (a study's worktree while its runs are recorded); rerun as
the settings' runs arrive. Results: ``docs/results/rule_travels/range_check/range_check.{json,md}``.
"""

from __future__ import annotations

import argparse
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence

from recsys_hdet.hdet.range_test import check as range_check
from studies.provenance import REPO, code_state
from studies.reporting import machine_line, preregistered, write_reports
from studies.results import load
from studies.range_tests import HALF_STEP_DECADES, committed_rates, plateau_distance
from studies.settings import RESULTS_ROOT, SETTINGS

OUT = os.path.join(REPO, RESULTS_ROOT, "range_check")
BENCHMARK = ("benchmark", os.path.join("docs", "results", "lr_recovery", "lr_recovery_f3", "results.jsonl"),
             os.path.join("docs", "results", "lr_recovery", "lr_recovery.json"))
PLANNED = 15  # each setting's range-test runs per rule (the travel-rule's step 2: 5 starts x seeds 0, 1, 2)
OFF_TARGET, ON_TARGET = 0.75, 0.10  # flag >= 3 of 4 commits off the plateau, <= 1 in 10 on it
OFF_MIN, ON_MIN = 4, 10  # fewer commits on a side than this: that side cannot be judged yet
MARKER = "range-check-rule"
# The revised check (hdet_history.md, range-check-revised): the same check without these reasons, judged only on the
# settings run after it was written, with the same targets.
REVISED_MARKER = "range-check-revised"
REVISED_DROPPED = ("no_clear_explosion",)
REVISED_JUDGED_ON = ("model_shape", "batch_4x")


def sources(root: str) -> List[Dict[str, str]]:
    """The benchmark and every setting: name, results file, plateau file (absolute, under ``root``)."""
    out = [dict(zip(("name", "results", "plateau"), BENCHMARK))]
    out += [{"name": name, "results": os.path.join(s.out, "results.jsonl"),
             "plateau": os.path.join(s.out, "lr_recovery.json")} for name, s in SETTINGS.items()]
    return [{**s, "results": os.path.join(root, s["results"]), "plateau": os.path.join(root, s["plateau"])}
            for s in out]


def rule_text(path: str = os.path.join(REPO, "docs", "results", "hdet_history.md"), marker: str = MARKER) -> str:
    """The check's pre-registered rule (:func:`studies.reporting.preregistered`); SystemExit when it is missing."""
    try:
        return preregistered(path, marker)
    except ValueError as e:
        raise SystemExit(str(e)) from None


def check_run(record: Mapping[str, Any]) -> Dict[str, Any]:
    """Each axis's check recomputed from the record's curves (and the recorded one, where the run recorded one)."""
    out = {}
    for axis, a in record["axes"].items():
        replicas = [r["loss"] for r in (a.get("replicas") or {}).values()]
        got = range_check.check_curve(a["loss"], record["low"], record["high"], record["steps"], a["smoothing"],
                                      a["divisor"], replicas if len(replicas) > 1 else (), a.get("read", "minimum"))
        out[axis] = {"trusted": got["trusted"], "reasons": got["reasons"],
                     "measures": {k: v for k, v in got.items() if k not in ("trusted", "reasons")},
                     "recorded_agrees": None if "check" not in a else a["check"]["reasons"] == got["reasons"]}
    return out


def runs_of(source: Mapping[str, str], plateau: Sequence[Mapping[str, Any]]) -> List[Dict[str, Any]]:
    rows = []
    for name, line in sorted(load(source["results"]).items()):
        record = (line.get("hdet") or {}).get("range_test")
        if "hdet_range_test" not in name or not record or not record.get("axes"):
            continue
        rates = committed_rates(record)
        distance = plateau_distance(rates, plateau)
        axes = check_run(record)
        rows.append({"run": name, "rule": "revised" if "/hdet_range_test_revised/" in name else "shipped",
                     "status": line.get("status"), "commit": line.get("commit"),
                     "clean": line.get("clean"), "committed": rates, "plateau_distance_decades": distance,
                     "on_plateau": distance <= HALF_STEP_DECADES + 1e-9,
                     "flagged": not all(a["trusted"] for a in axes.values()),
                     "flagged_revised": any(set(a["reasons"]) - set(REVISED_DROPPED) for a in axes.values()),
                     "axes": axes})
    return rows


def table(rows: Sequence[Mapping[str, Any]], flag: str = "flagged") -> Dict[str, Any]:
    """The 2x2 table of ``rows`` by ``flag`` (the check's "flagged", or the revised check's "flagged_revised") and
    on / off the plateau, its rates, and the runs with each reason."""
    cell = lambda flagged, on: sum(r[flag] == flagged and r["on_plateau"] == on for r in rows)  # noqa: E731
    t = {"flagged_off": cell(True, False), "flagged_on": cell(True, True),
         "passed_off": cell(False, False), "passed_on": cell(False, True)}
    off, on = t["flagged_off"] + t["passed_off"], t["flagged_on"] + t["passed_on"]
    t.update({"off": off, "on": on, "off_flag_rate": t["flagged_off"] / off if off else None,
              "on_flag_rate": t["flagged_on"] / on if on else None})
    reasons: Dict[str, Dict[str, int]] = {}
    for r in rows:
        for reason in sorted({x for a in r["axes"].values() for x in a["reasons"]}):
            side = reasons.setdefault(reason, {"off": 0, "on": 0})
            side["on" if r["on_plateau"] else "off"] += 1
    t["runs_with_reason"] = reasons
    return t


def judge(t: Mapping[str, Any]) -> Dict[str, Any]:
    """The pre-registered targets on a table: each side met, missed, or not judged yet (too few commits)."""
    off = ("not judged yet" if t["off"] < OFF_MIN else "met" if t["off_flag_rate"] >= OFF_TARGET else "missed")
    on = ("not judged yet" if t["on"] < ON_MIN else "met" if t["on_flag_rate"] <= ON_TARGET else "missed")
    return {"off_plateau_flagged_at_least_75pct": off, "on_plateau_flagged_at_most_10pct": on}


def study(root: str) -> Dict[str, Any]:
    import json

    per_source, pooled, missing = {}, [], []
    for s in sources(root):
        plateau = None
        if os.path.isfile(s["plateau"]):
            with open(s["plateau"]) as f:
                plateau = json.load(f).get("plateau")
        rows = runs_of(s, plateau) if plateau else []
        shipped = [row for row in rows if row["rule"] == "shipped"]  # the pre-registered table: today's rule's runs
        entry = {"results": os.path.relpath(s["results"], root), "plateau_file": os.path.relpath(s["plateau"], root),
                 "plateau": [{"embedding": c["embedding"], "dense": c["dense"]} for c in plateau or []],
                 "runs": rows, "table": table(shipped)}
        if not plateau:
            entry["note"] = "no plateau recorded yet: not judged"
        planned = PLANNED * sum(c.startswith("hdet_range_test") for c in SETTINGS[s["name"]].contenders) \
            if s["name"] in SETTINGS else 0
        if s["name"] != "benchmark" and len(rows) < planned:
            missing.append(f"{s['name']} ({len(rows)} of {planned} range-test runs)")
        per_source[s["name"]] = entry
        pooled += shipped
    t = table(pooled)
    held_out = [row for name in REVISED_JUDGED_ON for row in per_source[name]["runs"]]
    revised = table(held_out, "flagged_revised")
    return {"command": "python -m studies.range_check", "machine": machine_line(), **code_state(),
            "source_root": root, "source_commit": code_state(root) if os.path.abspath(root) != REPO else None,
            "rule": rule_text(), "plateau_rule": f"a plateau cell within x10^{HALF_STEP_DECADES} of both committed "
            "rates (embedding; the dense groups' geometric mean)",
            "thresholds": {"floor_decades": range_check.FLOOR_DECADES, "floor_sigmas": range_check.FLOOR_SIGMAS,
                           "slope_fraction": range_check.SLOPE_FRACTION, "replica_factor": range_check.REPLICA_FACTOR,
                           "near_end_and_explosion": "the smoothing window (decades)"},
            "sources": per_source, "pooled": t, "targets": judge(t),
            "revised": {"dropped": list(REVISED_DROPPED), "judged_on": list(REVISED_JUDGED_ON), "table": revised,
                        "targets": judge(revised), "rule": rule_text(marker=REVISED_MARKER)},
            "final": not missing, "incomplete": missing}


def pct(x: Optional[float]) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def render(r: Mapping[str, Any]) -> str:
    head = "| source | runs | flagged & off | flagged & on | passed & off | passed & on | off flagged | on flagged |"
    at = (r["commit"] or "?")[:7] + ("" if r["clean"] else " (dirty tree)")
    source = (f", reading the results under `{r['source_root']}` (at {(r['source_commit']['commit'] or '?')[:7]})"
              if r["source_commit"] else "")
    lines = ["# The check of the range test's curves against the plateaus", "",
             f"Produced by `{r['command']}` on {r['machine']} at {at}{source}. Every recorded range-test run's check "
             "recomputed from its curves (`recsys_hdet/hdet/range_test/check.py`); a commit is flagged when either "
             f"axis is, on the plateau when {r['plateau_rule']}. Pre-registered before any plateau "
             "comparison ([the rule](../../hdet_history.md#what-a-user-sees-the-check-of-the-curves-pre-registered-"
             "2026-11-28-before-any-plateau-comparison)); nothing was revised after this table.", ""]
    if r["incomplete"]:
        lines += [f"**Interim**: the judgement is the table over every run of the travel-rule's step 2; still to come: "
                  f"{'; '.join(r['incomplete'])}.", ""]
    lines += ["The table is today's rule's runs (`hdet_range_test`), as pre-registered; the revised rule's runs "
              "(`hdet_range_test_revised`, on the settings run after it) enter the revised check's table below and "
              "the list of every run.", "", head, "|---|---|---|---|---|---|---|---|"]
    pooled = {"table": r["pooled"], "runs": [None] * (r["pooled"]["off"] + r["pooled"]["on"])}
    for name, s in [*r["sources"].items(), ("**pooled**", pooled)]:
        t = s["table"]
        t0 = s["table"]
        runs = f"{t0['off'] + t0['on']}" + (f" ({s['note']})" if s.get("note") else "")
        lines.append(f"| {name} | {runs} | {t['flagged_off']} | {t['flagged_on']} | {t['passed_off']} | "
                     f"{t['passed_on']} | {t['flagged_off']} of {t['off']} ({pct(t['off_flag_rate'])}) | "
                     f"{t['flagged_on']} of {t['on']} ({pct(t['on_flag_rate'])}) |")
    tg, p = r["targets"], r["pooled"]
    lines += ["", "Targets (pooled): at least 3 of 4 commits off the plateau flagged: "
              f"**{tg['off_plateau_flagged_at_least_75pct']}** ({p['flagged_off']} of {p['off']}; judged with "
              f"{OFF_MIN} or more); at most 1 in 10 on it flagged: **{tg['on_plateau_flagged_at_most_10pct']}** "
              f"({p['flagged_on']} of {p['on']}; judged with {ON_MIN} or more).",
              "", "Runs with each reason (either axis), off / on the plateau, pooled: "
              + (", ".join(f"`{k}` {v['off']} / {v['on']}" for k, v in sorted(p["runs_with_reason"].items())) or "none")
              + ".", ""]
    rv = r["revised"]
    rt = rv["table"]
    lines += ["## The revised check (pre-registered 2026-11-29, judged only on " + ", ".join(rv["judged_on"]) + ")", "",
              f"The check without `{'`, `'.join(rv['dropped'])}` ([the rule](../../hdet_history.md), "
              f"`{REVISED_MARKER}`), over the range-test runs of those settings only (both rules'): "
              f"{rt['off'] + rt['on']} runs; off the plateau flagged {rt['flagged_off']} of {rt['off']} "
              f"({pct(rt['off_flag_rate'])}): **{rv['targets']['off_plateau_flagged_at_least_75pct']}**; on it flagged "
              f"{rt['flagged_on']} of {rt['on']} ({pct(rt['on_flag_rate'])}): "
              f"**{rv['targets']['on_plateau_flagged_at_most_10pct']}**.", "", "## Every run", "",
              "| source | run | committed embedding / dense | from the plateau (decades) | on | embedding | dense |",
              "|---|---|---|---|---|---|---|"]
    for name, s in r["sources"].items():
        for row in s["runs"]:
            reasons = {a: ", ".join(x["reasons"]) or "trusted" for a, x in row["axes"].items()}
            rates = row["committed"]
            lines.append(f"| {name} | {row['run']} | {rates['embedding']:.3g} / {rates['dense']:.3g} | "
                         f"{row['plateau_distance_decades']:.2f} | {'on' if row['on_plateau'] else 'off'} | "
                         f"{reasons.get('embedding', '-')} | {reasons.get('dense', '-')} |")
    lines += ["", "## The plateaus", ""]
    for name, s in r["sources"].items():
        cells = ", ".join(f"({c['embedding']:.3g}, {c['dense']:.3g})" for c in s["plateau"]) or "none yet"
        lines.append(f"- {name} (`{s['plateau_file']}`): {cells}")
    lines += ["", "## The pre-registered rule", "", r["rule"], ""]
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m studies.range_check", description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=OUT)
    ap.add_argument("--root", default=REPO, help="the checkout whose docs/results are read (default: this one)")
    args = ap.parse_args(argv)
    result = study(os.path.abspath(args.root))
    write_reports(args.out, "range_check", result, render(result))
    print(f"wrote {os.path.join(args.out, 'range_check.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
