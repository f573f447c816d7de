"""Reports with uncertainty and lineage: the 95% intervals on every task's AUC, NE and calibration (overall,
per segment, on the random-exposure slice; recsys_hdet/evaluation/intervals.py), the segment tables'
calibration and positives, a comparison that never writes over a run's evaluation, and a registry version's
report that names the gate's decision, its reasons, the parent and the paired difference against it.

The intervals are checked against the truth they estimate: a slice of a few positives gets a wide one and a
large slice a narrow one, their widths match a bootstrap computed independently (scikit-learn's AUC), and
over repeated draws from a known population they hold the population's metric about 95% of the time. Runs:
the session's tiny HDET run (tests/conftest.py's ``hdet_run``), nothing trained here.
"""

import html
import json
import os
import re
import shutil

import numpy as np
import polars as pl
import pytest
import torch

from conftest import read_json

TASKS = ["contribution", "like", "long_dwell"]


def _frame(rows, rate, seed, segment="tab 1"):
    """A predictions table of ``rows`` impressions with about ``rate`` positives per task, calibrated
    (labels drawn from the predictions), in one tab."""
    rng = np.random.default_rng(seed)
    data = {"user_activity": ["high_active"] * rows, "item_popularity": ["head"] * rows, "tab_segment": [segment] * rows,
            "user_id_raw": rng.integers(0, 50, rows)}
    for t in TASKS:
        p = np.clip(rng.beta(1.0, 1.0 / rate - 1.0, rows), 1e-4, 0.999).astype(np.float32)
        data[f"pred_{t}"] = p
        data[f"label_{t}"] = (rng.uniform(size=rows) < p).astype(np.float32)
    return pl.DataFrame(data)


def _width(m, key):
    low, high = m["interval"][key]
    return high - low


def test_every_task_metric_has_an_interval_in_eval_json_and_the_report(hdet_run):
    ev = read_json(hdet_run / "eval.json")
    df = pl.read_parquet(hdet_run / "predictions.parquet")
    assert ev["intervals"]["level"] == 0.95 and ev["intervals"]["auc"] == "DeLong's variance on the logit scale"
    slices = [("eval", ev["eval"], df)]
    for kind, column in (("user_activity", "user_activity"), ("item_popularity", "item_popularity"), ("tab", "tab_segment")):
        for value, metrics in ev["segments"][kind].items():
            slices.append((f"{kind}/{value}", metrics, df.filter(pl.col(column) == value)))
    if ev["random_exposure"]["status"] == "present":
        slices.append(("random_exposure", ev["random_exposure"]["eval"], df.filter(pl.col("is_rand") == 1)))
    for name, metrics, part in slices:
        assert set(metrics) == set(TASKS), name
        for t, m in metrics.items():
            assert m["positives"] == int(part[f"label_{t}"].sum()), (name, t)
            for key in ("auc", "ne", "calibration"):
                if m[key] is None:  # undefined on a one-class slice: no interval either
                    assert m["interval"][key] is None, (name, t, key)
                    continue
                low, high = m["interval"][key]
                assert low <= high, (name, t, key)
    # The whole held-out day: each interval holds its point estimate and has a width (not a degenerate one).
    for t, m in ev["eval"].items():
        for key in ("auc", "ne", "calibration"):
            low, high = m["interval"][key]
            assert low < m[key] < high, (t, key)
    page = (hdet_run / "report.html").read_text()
    for t, m in ev["eval"].items():
        for key, digits in (("auc", 4), ("ne", 4), ("calibration", 3)):
            low, high = m["interval"][key]
            assert f"{m[key]:.{digits}f} <span class='ci'>[{low:.{digits}f}, {high:.{digits}f}]</span>" in page, (t, key)


def test_a_tiny_slice_has_a_wide_interval_and_a_large_slice_a_narrow_one():
    """A planted tab of 300 impressions with a handful of positives beside a tab of 10,000: the tiny slice's
    intervals are several times wider, as 1 / sqrt(positives) says (calibration's relative standard error is
    about 1 / sqrt(positives): its interval 1.96 * 2 / sqrt(6) ~ 1.6 times its value for 6 positives, ~0.12
    for 1,000)."""
    from recsys_hdet.evaluation import evaluate_frame

    large, tiny = _frame(10_000, 0.1, seed=1, segment="tab large"), _frame(300, 0.02, seed=2, segment="tab tiny")
    ev = evaluate_frame(pl.concat([large, tiny]), TASKS)
    tabs = ev["segments"]["tab"]
    for t in TASKS:
        small, big = tabs["tab tiny"][t], tabs["tab large"][t]
        assert 2 <= small["positives"] <= 15 and big["positives"] > 900, (t, small["positives"], big["positives"])
        assert _width(small, "calibration") / small["calibration"] > 0.8, (t, small)
        # The large slice's: 2 * 1.96 / sqrt(positives) of its value, give or take the predictions' own spread.
        assert 0.7 < _width(big, "calibration") / big["calibration"] / (3.92 / big["positives"] ** 0.5) < 1.2, (t, big)
        assert _width(small, "auc") > 0.15 and _width(big, "auc") < 0.04, t
        assert _width(small, "ne") > 0.1 and _width(big, "ne") < 0.04, t
        for key in ("auc", "ne", "calibration"):
            assert _width(small, key) > 4 * _width(big, key), (t, key)


def test_the_intervals_match_a_bootstrap_computed_independently():
    """On a slice of 3,000 rows (about 150 positives per task), each interval's width matches the spread of
    the metric over 300 bootstrap resamples of the rows (recomputed on each, AUC as the Mann-Whitney statistic
    of the ranks: 2 x 1.96 standard deviations) within 20%: the delta method's and DeLong's variances are right."""
    from recsys_hdet.evaluation.intervals import slice_intervals

    df = _frame(3_000, 0.05, seed=3)
    labels = df.select([f"label_{t}" for t in TASKS]).to_numpy().astype(np.float64)
    probs = df.select([f"pred_{t}" for t in TASKS]).to_numpy().astype(np.float64)
    rows = np.random.default_rng(4).integers(0, len(df), (300, len(df)))  # one resample per row of the matrix
    for i, interval in enumerate(slice_intervals(labels, probs)):
        y, p = labels[rows, i], probs[rows, i]
        rate, m = y.mean(axis=1), y.sum(axis=1)
        loss = -(y * np.log(p) + (1 - y) * np.log(1 - p)).mean(axis=1)
        # Ordinal ranks: a row drawn twice ties only with itself (one label), which leaves the statistic as it is.
        ranks = np.argsort(np.argsort(p, axis=1), axis=1) + 1
        auc = ((ranks * y).sum(axis=1) - m * (m + 1) / 2) / (m * (len(df) - m))  # Mann-Whitney
        ne = loss / -(rate * np.log(rate) + (1 - rate) * np.log(1 - rate))
        spread = [np.std(x, ddof=1) for x in (auc, ne, p.mean(axis=1) / rate)]
        for key, sd in zip(("auc", "ne", "calibration"), spread):
            low, high = interval[key]
            assert abs((high - low) / (2 * 1.96 * sd) - 1) < 0.2, (TASKS[i], key, interval[key], sd)


def test_intervals_hold_the_population_metric_about_95_percent_of_the_time():
    """1,000 slices of 400 rows (about 37 positives each, the size of a random-exposure slice) and 1,000 of 100
    rows (about 9) drawn from one miscalibrated population whose metrics are known (half a million rows of
    it): the intervals should hold them in about 95% of the slices; 0.92 to 0.975 is accepted at 37
    positives and 0.88 to 0.98 at 9, where normal approximations are rough (measured: 0.91 to 0.95; seeded
    draws: the same outcome on every run; intervals of half the width would hold them about 68% of the time)."""
    from recsys_hdet.evaluation.intervals import slice_intervals
    from recsys_hdet.evaluation.task_metrics import task_metrics

    rng = np.random.default_rng(7)

    def draw(n):
        p = rng.beta(0.5, 6.0, n)
        return (rng.uniform(size=n) < np.clip(1.2 * p, 0, 1)).astype(np.float64), p  # calibration 1 / 1.2

    y, p = draw(500_000)
    truth = task_metrics(torch.from_numpy(p), torch.from_numpy(y))
    for rows, (lowest, highest) in ((400, (0.92, 0.975)), (100, (0.88, 0.98))):
        held = {key: 0 for key in ("auc", "ne", "calibration")}
        slices = 1000
        for _ in range(slices):
            (interval,) = slice_intervals(*draw(rows))
            for key in held:
                held[key] += interval[key] is not None and interval[key][0] <= truth[key] <= interval[key][1]
        for key, n in held.items():
            assert lowest <= n / slices <= highest, (rows, key, n / slices)


def test_segment_tables_show_calibration_and_positives(hdet_run):
    ev = read_json(hdet_run / "eval.json")
    page = (hdet_run / "report.html").read_text()
    segments = page.split("<h2>Segments</h2>")[1]
    for t in TASKS:
        table = segments.split(f"<h3>{t} by item popularity bucket</h3>")[1].split("</table>")[0]
        assert ("<tr><th>segment</th><th>impressions</th><th>positives</th><th>AUC [95%]</th><th>NE [95%]</th>"
                "<th>calibration [95%]</th></tr>") in table
        for value, metrics in ev["segments"]["item_popularity"].items():
            m = metrics[t]
            cal = "–" if m["calibration"] is None else f"{m['calibration']:.3f}"
            row = re.search(rf"<tr><td>{re.escape(html.escape(value))}</td><td>([\d,]+)</td><td>([\d,]+)</td>"
                            rf"<td>.*?</td><td>.*?</td><td>(.*?)</td></tr>", table)
            assert row, (t, value)
            assert row.group(1) == f"{m['count']:,}" and row.group(2) == f"{m['positives']:,}", (t, value)
            assert row.group(3).startswith(cal), (t, value, row.group(3))


# ----------------------------------------------------------------------------------------------
# Comparisons write into their own directory


def _fake_scores(monkeypatch):
    """score_run replaced by calibrated-looking random scores of the right shape: where the files go is
    what these tests check, not the model (scoring a run takes a worker process and most of a minute)."""
    from recsys_hdet import evaluation
    from recsys_hdet.components.dataset import RowHoldout

    def score_run(run, batch_size=4096, nproc=1, scratch=None):
        assert RowHoldout.from_config(run.cfg.data) is None  # every row of the days is scored
        rows = sum(run.meta.days[d]["rows"] for d in run.eval_days)
        return np.random.default_rng(0).uniform(0.01, 0.4, (rows, len(TASKS))).astype(np.float32)

    monkeypatch.setattr(evaluation, "score_run", score_run)


def _no_figures(monkeypatch):
    """The reports without their figures (about a second of matplotlib each): these tests read the tables."""
    from recsys_hdet.evaluation import report

    for name in ("fig_train_loss", "fig_base_lrs", "fig_reliability", "fig_replica_losses", "fig_hparams"):
        monkeypatch.setattr(report, name, lambda *args: None)


def _files(run_dir):
    return {n: (run_dir / n).read_bytes() for n in ("eval.json", "predictions.parquet", "report.html")}


def test_a_comparison_leaves_each_run_s_evaluation_byte_identical(hdet_run, tmp_path, monkeypatch):
    """Two runs compared on a day that is not their own held-out day (days=[the first day]): each is scored
    into the comparison's directory, and neither run's eval.json, predictions.parquet nor report.html
    changes by a byte. On their own day the runs' evaluations are reused as they are."""
    from recsys_hdet.evaluation import load_run
    from recsys_hdet.evaluation.cli import compare_runs

    _fake_scores(monkeypatch)
    _no_figures(monkeypatch)
    other = tmp_path / "other"
    shutil.copytree(hdet_run, other)
    before = {str(d): _files(d) for d in (hdet_run, other)}
    own_days = read_json(hdet_run / "eval.json")["days"]
    first = next(d for d in load_run(str(hdet_run)).meta.days if d not in own_days)
    out = tmp_path / "compare"
    report = compare_runs([str(hdet_run), str(other)], out=str(out), days=[first], labels=["a", "b"])
    assert report == str(out / "report.html") and os.path.isfile(report)
    for d in (hdet_run, other):
        assert _files(d) == before[str(d)], d
    for i, d in enumerate((hdet_run, other)):
        scored = read_json(out / "runs" / f"{i + 1}-{d.name}" / "eval.json")
        assert scored["days"] == [first] and scored["run_dir"] == str(d)
    page = (out / "report.html").read_text()
    assert f"on days {first}" in page and "Differences against a" in page
    # Their own day: reused, nothing rewritten; the default directory is a new one under outputs/comparisons.
    monkeypatch.chdir(tmp_path)
    report = compare_runs([str(hdet_run), str(other)])
    assert os.path.dirname(report).startswith(str(tmp_path / "outputs" / "comparisons" / ""))
    for d in (hdet_run, other):
        assert _files(d) == before[str(d)], d


def test_a_comparison_refuses_to_write_into_a_run_directory(hdet_run, capsys):
    from omegaconf import OmegaConf

    from recsys_hdet.evaluation import cli

    before = _files(hdet_run)
    cfg = OmegaConf.create({"run_dir": None, "runs": [str(hdet_run)], "out": str(hdet_run), "days": None,
                            "data": {"root": None}, "batch_size": 4096, "nproc": 1, "rescore": False, "labels": None})
    with pytest.raises(SystemExit) as exit_:
        cli.main(cfg)
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(err) == 1
    assert err[0].startswith(f"error: out={hdet_run}: the directory of the run") and "choose another out=DIR" in err[0]
    assert _files(hdet_run) == before


# ----------------------------------------------------------------------------------------------
# A registry version's report


def test_a_registry_version_s_report_names_the_gate_decision_and_parent(hdet_run, tmp_path, monkeypatch):
    """The gate run on the tiny run's held-out day against a parent that predicts the true probabilities
    (better than the candidate on every task): the version's report names the decision, every reason, the
    parent and each task's paired NE difference with its interval as the gate recorded them, and the parent's
    calibration; the same section comes back from the version directory's manifest alone."""
    from pipelines import gate as G
    from pipelines import retrain as R
    from pipelines.registry import Registry
    from pipelines.version_manifest import version_files, write_version_report
    from recsys_hdet.evaluation.report import render_run
    from recsys_hdet.evaluation.run_artifacts import RunArtifacts
    from recsys_hdet.evaluation.task_metrics import task_metrics

    _no_figures(monkeypatch)
    work = tmp_path / "work"
    work.mkdir()
    for name in ("summary.json", "eval.json", "metrics.jsonl", "hdet.jsonl", "predictions.parquet"):
        shutil.copy(hdet_run / name, work / name)
    frame = pl.read_parquet(work / "predictions.parquet")
    parent = frame.with_columns([pl.col(f"oracle_{t}").alias(f"pred_{t}") for t in TASKS])
    cfg = R.compose(["registry=/nonexistent", "data.root=/nonexistent"])
    published = {"eval": {t: task_metrics(torch.from_numpy(parent[f"pred_{t}"].to_numpy().astype(np.float64)),
                                          torch.from_numpy(parent[f"label_{t}"].to_numpy().copy())) for t in TASKS},
                 "paired": G.paired_differences(str(work / "predictions.parquet"), parent, TASKS, float(cfg.gate.z))}
    (work / "published_eval.json").write_text(json.dumps(published))
    candidate = read_json(work / "eval.json")
    decision = G.gate(cfg, read_json(work / "summary.json"), candidate, published)
    assert decision["decision"] == "rejected" and decision["reasons"]
    manifest = {"status": decision["decision"], "parent": "v0001", "day": candidate["days"][0],
                "train_days": candidate["days"], "cold_start": False, "gate": decision}
    assert write_version_report(str(work), manifest, "v0002") == str(work / "report.html")
    registry = Registry(str(tmp_path / "registry"))
    version_dir = registry.add_version("v0002", version_files(str(work)), manifest)
    page = open(os.path.join(version_dir, "report.html")).read()
    section = page.split("<h2>Registry version</h2>")[1].split("<h2>")[0]
    assert "Version <code>v0002</code>" in section and "parent <code>v0001</code>" in section
    assert "Gate decision: <b>rejected</b>" in section
    for reason in decision["reasons"]:
        assert f"<li>{html.escape(reason)}</li>" in section
    for t in TASKS:
        p = decision["tasks"][t]["paired"]
        assert p["diff"] > 0  # the candidate is worse than the true probabilities
        assert (f"<td>{t}</td><td>{p['rows']:,}</td><td>{decision['tasks'][t]['candidate_ne']:.4f}</td>"
                f"<td>{published['eval'][t]['ne']:.4f}</td><td>{p['diff']:+.4f} [{p['low']:+.4f}, {p['high']:+.4f}]</td>"
                f"<td>{candidate['eval'][t]['calibration']:.3f}</td><td>{published['eval'][t]['calibration']:.3f}</td>"
                ) in section, t
    assert "registry version <code>v0002</code> (rejected, parent v0001)" in page  # the provenance line
    # Rendered again from the version directory (e.g. a rescore there): the manifest's record, the same section.
    again = render_run(RunArtifacts(version_dir)).split("<h2>Registry version</h2>")[1].split("<h2>")[0]
    assert again == section
    # A plain run's report has no such section.
    assert "<h2>Registry version</h2>" not in (hdet_run / "report.html").read_text()
