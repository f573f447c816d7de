"""The learning-rate ground-truth harness (studies/lr_truth*.py): its truth rule and signal scores
on records with known answers, and the harness end to end on tiny data (slow)."""
import json
import math
import os
import sys

import pytest

from conftest import REPO, run_command
from recsys_hdet.constants import DENSE_GROUPS
from studies import lr_truth_plan as P
from studies import lr_truth_scorecard as S
from studies.record import compact_syncs
from studies.stats import paired_ci95


def test_the_truth_is_the_best_multiplier_only_where_its_paired_interval_excludes_zero():
    # x2 better than x1 by 0.010 on every seed, with little paired noise: decided.
    ne = {0.5: {0: 0.80, 1: 0.81, 2: 0.79}, 1.0: {0: 0.78, 1: 0.79, 2: 0.77},
          2.0: {0: 0.770, 1: 0.781, 2: 0.759}}
    t = S.truth(ne)
    assert t["best"] == "x2" and t["runner_up"] == "x1" and t["seeds"] == [0, 1, 2]
    assert t["diff"] == pytest.approx(-0.01, abs=1e-9) and t["ci95"][1] < 0
    # The same means with the sign of the difference flipping between seeds: no difference.
    ne[2.0] = {0: 0.760, 1: 0.800, 2: 0.750}
    t = S.truth(ne)
    assert t["best"] == "none" and t["leader"] == "x2" and t["ci95"][0] < 0 < t["ci95"][1]
    # A seed missing one multiplier is left out of the pairing; one seed is not enough.
    assert S.truth({0.5: {0: 0.8}, 1.0: {0: 0.7, 1: 0.7}, 2.0: {0: 0.9, 1: 0.9}})["best"] is None


def test_paired_interval_uses_the_t_quantile():
    mean, low, high = paired_ci95([1.0, 2.0, 3.0])
    assert mean == 2.0 and high - mean == pytest.approx(4.303 * 1.0 / 3 ** 0.5, rel=1e-4)


def _sync(step, rank_losses, dense_u, emb_u, base=0.01):
    """A 2 x 2 hdet.jsonl sync record: ranks 0-1 in sharding group 0 (embedding replica 0), 2-3 in group 1."""
    grow = lambda us: [base * (1 + P.ALPHA) ** u for u in us]  # noqa: E731
    names = ["lr/embedding", *(f"lr/{g}" for g in DENSE_GROUPS)]
    hparams = {n: {"base": base, "values": grow(emb_u if n == "lr/embedding" else dense_u), "next_base": base,
                   "velocity": 0.0} for n in names}
    return {"step": step, "losses": rank_losses, "train_losses": rank_losses, "hparams": hparams, "excluded": []}


def _signal_line(syncs, at):
    """A signal run's results line (studies.record's columns) branched at step ``at``."""
    return {"syncs": compact_syncs(syncs), "overrides": [f"trainer.branch_from=/x/checkpoint/step-{at}"]}


def test_every_score_reads_the_planted_direction():
    # Dense: the higher a rank's LR, the lower its loss (+); embedding: the replica with the higher LR
    # scores worse (-). Offsets are permuted between syncs, each sharding group holding dense offsets
    # that sum to zero, so neither effect leaks into the other's per-group score.
    syncs = []
    for k, dense_u in enumerate(([-1, 1, -1 / 3, 1 / 3], [1 / 3, -1 / 3, 1, -1], [1, -1, 1 / 3, -1 / 3])):
        emb_u = [-1, 1] if k % 2 == 0 else [1, -1]
        emb_of_rank = [emb_u[0], emb_u[0], emb_u[1], emb_u[1]]
        losses = [0.5 - 0.01 * d + 0.03 * e for d, e in zip(dense_u, emb_of_rank)]
        syncs.append(_sync(25 * (k + 1), losses, dense_u, emb_u))
    for score in ("zscore", "rank", "softmax", "regression"):
        v = S.signal_values(syncs, "losses", score, sharding_group_size=2)
        assert v["dense"] > 0 and v["embedding"] < 0, (score, v)


def test_the_scorecard_scores_only_decided_cases():
    mode = P.Mode(("data=tiny",), {"s": (0.05, 0.002)}, (0, 1), 5, 1, layout=(4, 2), fractions=(0.5,),
                  groups=("dense",))
    results = {}
    for seed, (x05, x1, x2) in enumerate(((0.80, 0.79, 0.780), (0.81, 0.80, 0.791))):
        results[f"s/seed{seed}/trunk"] = {"status": "completed", "mean_ne": x1, "wall_seconds": 1}
        results[f"s/seed{seed}/c50/dense_x0.5"] = {"status": "completed", "mean_ne": x05, "wall_seconds": 1}
        results[f"s/seed{seed}/c50/dense_x2"] = {"status": "diverged" if seed == 5 else "completed", "mean_ne": x2,
                                                 "wall_seconds": 1}
        good = _sync(30, [0.50, 0.49, 0.48, 0.47], [-1, -1 / 3, 1 / 3, 1], [-1, 1])
        # the second sync closes a shorter window at the pass's end: left out
        partial = _sync(33, [0.47, 0.48, 0.49, 0.50], [-1, -1 / 3, 1 / 3, 1], [-1, 1])
        for signal in ("probe", "serving"):
            results[f"s/seed{seed}/c50/signal_{signal}"] = _signal_line([good, partial], 25)
    # A signal added later, run for one seed so far, pointing the other way: scored over that seed.
    wrong = _sync(30, [0.47, 0.48, 0.49, 0.50], [-1, -1 / 3, 1 / 3, 1], [-1, 1])
    results["s/seed1/c50/signal_anneal_probe"] = _signal_line([wrong], 25)
    out = S.collect(results, mode)
    (case,) = out["cases"]
    assert case["best"] == "x2" and case["signal_windows"] == [1] and case["checkpoint_steps"] == [25]
    assert out["scorecard"]["probe/zscore"] == {"agree": 1, "cases": 1, "per_start": {"s": {"agree": 1, "cases": 1}}}
    assert out["scorecard"]["anneal_probe/zscore"] == {"agree": 0, "cases": 1, "per_start": {"s": {"agree": 0, "cases": 1}}}
    assert case["signal_seeds"]["anneal_probe/regression"] == 1 and case["signal_seeds"]["probe/regression"] == 2
    assert "averaged_probe/zscore" not in out["scorecard"]  # never run: not scored
    assert out["scorecard"]["paper"]["cases"] == 1
    assert out["chosen"] in out["scorecard"] or out["chosen"].split("/")[0] in S.LOSSES


@pytest.mark.slow  # ~11 tiny 2-rank runs: about 2 min on 2 cores
def test_the_harness_end_to_end_with_resume_report_only_and_a_refused_start(tmp_path, data_cache, tiny_dataset):
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    cmd = [sys.executable, "-m", "studies.lr_truth", "--mode", "tiny", "--out", str(tmp_path / "out"),
           "--work", str(tmp_path / "work"), "--data-cache", data_cache]
    first = run_command(cmd, env=env, timeout=900)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    results = tmp_path / "out" / "lr_truth_tiny" / "results.jsonl"
    lines = [json.loads(x) for x in results.read_text().splitlines()]
    # per seed: the trunk, two dense branches, two signal runs
    assert sorted(x["name"].split("/")[-1] for x in lines) == sorted(
        ["trunk", "dense_x0.5", "dense_x2", *(f"signal_{s}" for s in P.SIGNAL_RUNS)] * 2)
    signal = [x for x in lines if "signal_" in x["name"]]
    assert len(signal) == 2 * len(P.SIGNAL_RUNS) and all(x["status"] == "stopped" and len(x["syncs"]["step"]) == 1 for x in signal)
    # Rows are reserved in every run (data.reserve_rows), but only the probe runs score them: the
    # serving run's losses are its own served ones (no probe: no separate training losses).
    assert all(("train_losses" in x["syncs"]) == (not x["name"].endswith("signal_serving")) for x in signal)
    report = json.loads((tmp_path / "out" / "lr_truth_tiny.json").read_text())
    (case,) = report["cases"]
    assert case["best"] in ("x0.5", "x1", "x2", "none") and len(case["seeds"]) == 2
    assert set(report["scorecard"]) >= {"paper", "probe/regression", "train/zscore", "serving/rank",
                                        "averaged_probe/regression", "anneal_probe/rank"}
    # Resume: every run has its line, none trains again; report-only rebuilds the same report.
    md = (tmp_path / "out" / "lr_truth_tiny.md").read_text()
    second = run_command(cmd, env=env, timeout=300)
    assert second.returncode == 0 and "completed" not in second.stdout, second.stdout
    assert results.read_text().count("\n") == len(lines)
    import shutil

    shutil.rmtree(tmp_path / "work")
    third = run_command([*cmd, "--report-only"], env=env, timeout=300)
    assert third.returncode == 0 and (tmp_path / "out" / "lr_truth_tiny.md").read_text() == md
    # A start whose plain run diverges is refused, named.
    bad = run_command([*cmd, "--start", "wild:500:5"], env=env, timeout=300)
    assert bad.returncode == 2 and "start 'wild'" in bad.stderr and "diverged" in bad.stderr, bad.stderr[-2000:]


def test_the_explore_round_table_compares_the_round_s_order_with_the_end_of_the_pass():
    from studies.lr_truth_plan import MODES, ROUND_MULTIPLIERS, pct
    from studies.lr_truth_scorecard import explore_round_cases

    mode = MODES["tiny"]  # rounds of 5 steps from step 0 and from the trunk's 50% checkpoint (step 25 of 46)
    # End of the pass: x10 best, then x3.16, then x1 (the trunk); the rounds rank x3.16 first from step 0
    # (a miss) and like the end from 50%.
    end = {1.0: 0.80, ROUND_MULTIPLIERS[1]: 0.78, 10.0: 0.77}
    rounds = {0.0: {1.0: 0.30, ROUND_MULTIPLIERS[1]: 0.28, 10.0: 0.29},
              0.5: {1.0: 0.30, ROUND_MULTIPLIERS[1]: 0.29, 10.0: 0.28}}
    results = {}
    for seed in mode.seeds:
        prefix = f"preset/seed{seed}"
        results[f"{prefix}/trunk"] = {"status": "completed", "steps": 46, "mean_ne": end[1.0] + 0.001 * seed}
        for fraction, at in ((0.0, 0), (0.5, 25)):
            for mult in ROUND_MULTIPLIERS:
                if mult != 1.0:
                    results[f"{prefix}/{pct(fraction)}/dense_x{mult:.3g}"] = {"status": "completed", "steps": 46,
                                                                             "mean_ne": end[mult] + 0.001 * seed}
                name = f"{prefix}/{pct(fraction)}/round_x1" if mult == 1.0 else f"{prefix}/{pct(fraction)}/round_dense_x{mult:.3g}"
                losses = [rounds[fraction][mult] + 0.01 * seed, None]  # a non-finite rank is left out of the mean
                results[name] = {"syncs": compact_syncs([{"step": at + 5, "losses": losses, "hparams": {}}])}
    # A round that diverged before its end scores worst (inf).
    table = explore_round_cases(results, mode)
    by_fraction = {c["fraction"]: c for c in table["cases"]}
    assert by_fraction[0.0]["order_by_end"] == ["x10", "x3.16", "x1"]
    assert by_fraction[0.0]["order_by_round"] == ["x3.16", "x10", "x1"] and not by_fraction[0.0]["same_order"]
    assert by_fraction[0.5]["same_order"] and by_fraction[0.5]["same_best"]
    assert by_fraction[0.0]["round_score"]["x1"] == pytest.approx(0.305)  # (0.30 + 0.31) / 2 over the seeds
    assert (table["same_order"], table["same_best"], table["scored"]) == (1, 1, 2)
    del results["preset/seed1/c50/round_dense_x10"]["syncs"]  # no sync record: the round diverged
    assert explore_round_cases(results, mode)["cases"][1]["round_score"]["x10"] == math.inf
