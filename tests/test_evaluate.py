"""Offline evaluation: ``python -m recsys_hdet.evaluate`` on real (tiny) runs.

The metrics are checked against scikit-learn on the same predictions, the predictions against
the held-out files (row count, labels, order) and against the trainer's own evaluation, and the
report is opened in headless Chromium (skipped only where Chromium is not installed). The report's
content without a run: on real data (no true probabilities) no oracle column or wording, the loss
axis's units by the run's size, linear reliability axes without empty bins, a heading per section.
"""

import os
import shutil
import sys

import numpy as np
import polars as pl
import pytest
import torch

from conftest import REPO, read_json, read_jsonl, run_command, run_evaluate, run_train

TASKS = ["contribution", "like", "long_dwell"]
FAST = ["data=tiny", "trainer.log_every=10"]


def test_metrics_agree_with_scikit_learn(hdet_run):
    from sklearn.metrics import log_loss, roc_auc_score

    df = pl.read_parquet(hdet_run / "predictions.parquet")
    ev = read_json(hdet_run / "eval.json")
    for t in TASKS:
        y, p = df[f"label_{t}"].to_numpy(), df[f"pred_{t}"].to_numpy().astype(np.float64)
        assert abs(ev["eval"][t]["auc"] - roc_auc_score(y, p)) < 1e-4
        assert abs(ev["eval"][t]["logloss"] - log_loss(y, p)) < 1e-4
        assert ev["eval"][t]["count"] == df.height
    # A segment too: the slice's metrics are the same functions on the slice's rows.
    head = df.filter(pl.col("item_popularity") == "head")
    m = ev["segments"]["item_popularity"]["head"]["like"]
    assert m["count"] == head.height > 0
    assert abs(m["auc"] - roc_auc_score(head["label_like"], head["pred_like"].cast(pl.Float64))) < 1e-4
    assert abs(m["logloss"] - log_loss(head["label_like"], head["pred_like"].cast(pl.Float64))) < 1e-4
    # GAUC per user: scikit-learn's AUC of each user's impressions, weighted by their count, over the
    # users who have both classes.
    for t in TASKS:
        aucs, weights = [], []
        for _, part in df.group_by("user_id_raw"):
            y = part[f"label_{t}"].to_numpy()
            if 0 < y.sum() < len(y):
                aucs.append(roc_auc_score(y, part[f"pred_{t}"].to_numpy().astype(np.float64)))
                weights.append(len(y))
        g = ev["gauc_user"][t]
        assert g["groups"] == len(aucs) > 0 and g["rows"] == sum(weights)
        assert abs(g["gauc"] - float(np.average(aucs, weights=weights))) < 1e-9


def test_predictions_cover_the_held_out_day_in_order(hdet_run, tiny_dataset):
    """Every held-out row once, in file order, and the same model outputs the trainer evaluated."""
    df = pl.read_parquet(hdet_run / "predictions.parquet")
    ev = read_json(hdet_run / "eval.json")
    day = ev["days"]
    assert len(day) == 1
    held_out = pl.read_parquet(os.path.join(tiny_dataset, f"day={day[0]}.parquet"))
    assert df.height == held_out.height
    for t in TASKS:
        assert (df[f"label_{t}"] == held_out[f"label_{t}"]).all()
        assert (df[f"oracle_{t}"] == held_out[f"oracle_{t}"]).all()
    assert (df["time_ms"] == held_out["time_ms"]).all() and (df["user_id_raw"] == held_out["user_id_raw"]).all()
    # Scored with 2 workers on one sharding group after training on 4 in 2 groups: same numbers
    # as the trainer's own evaluation (to float32 rounding of the probabilities).
    summary = read_json(hdet_run / "summary.json")
    for t in TASKS:
        assert abs(ev["eval"][t]["ne"] - summary["eval"][t]["ne"]) < 1e-5
        assert abs(ev["eval"][t]["auc"] - summary["eval"][t]["auc"]) < 1e-4
    for name in ("user_activity", "item_popularity", "tab"):
        counts = sum(v["like"]["count"] for v in ev["segments"][name].values())
        assert counts == df.height, name
    assert {"head", "torso", "tail"} <= set(ev["segments"]["item_popularity"])
    assert set(ev["oracle"]) == set(TASKS)


def test_popularity_buckets_split_impressions_by_cumulative_share(tiny_dataset):
    from recsys_hdet.components.dataset import DatasetMeta
    from recsys_hdet.evaluation import popularity_buckets

    meta = DatasetMeta.load(tiny_dataset)
    days = list(meta.days)[:2]
    buckets = popularity_buckets(meta, days)
    counts = pl.concat([pl.read_parquet(meta.day_path(d), columns=["video_id_raw"]) for d in days]) \
        .group_by("video_id_raw").len()
    joined = counts.join(buckets, on="video_id_raw")
    share = joined.group_by("item_popularity").agg(pl.col("len").sum()).with_columns(pl.col("len") / counts["len"].sum())
    share = dict(zip(share["item_popularity"], share["len"]))
    # Head items start before 50% of impressions: at least half, at most half plus one item's share.
    top = counts["len"].max() / counts["len"].sum()
    assert 0.5 <= share["head"] <= 0.5 + top
    assert share["head"] + share["torso"] >= 0.8
    # Every head item has at least as many impressions as every tail item.
    assert joined.filter(pl.col("item_popularity") == "head")["len"].min() >= \
        joined.filter(pl.col("item_popularity") == "tail")["len"].max()


def test_task_metrics_handle_one_class_slices():
    from recsys_hdet.evaluation import task_metrics

    m = task_metrics(torch.tensor([0.1, 0.2], dtype=torch.float64), torch.tensor([0.0, 0.0]))
    assert m["auc"] != m["auc"] and m["ne"] != m["ne"]  # NaN: undefined without positives
    assert abs(m["logloss"] - float(-(np.log(0.9) + np.log(0.8)) / 2)) < 1e-9


def _chromium():
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def _render(path, screenshot=None):
    """Opens a report in headless Chromium; returns (figures declared, figures decoded, page text)."""
    webdriver = pytest.importorskip("selenium.webdriver")
    opts = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        opts.add_argument(arg)
    opts.binary_location = _chromium()
    service = webdriver.ChromeService(executable_path=shutil.which("chromedriver"))
    driver = webdriver.Chrome(options=opts, service=service)
    try:
        driver.get(f"file://{path}")
        declared = int(driver.execute_script("return document.body.dataset.figures"))
        decoded = driver.execute_script(
            "return Array.from(document.querySelectorAll('img.figure'))"
            ".filter(i => i.complete && i.naturalWidth > 100 && i.naturalHeight > 100).length")
        if screenshot:
            height = driver.execute_script("return document.body.scrollHeight")
            driver.set_window_size(1400, height + 100)
            driver.save_screenshot(str(screenshot))
        return declared, decoded, driver.find_element("tag name", "body").text
    finally:
        driver.quit()


needs_chromium = pytest.mark.skipif(not (_chromium() and shutil.which("chromedriver")),
                                    reason="Chromium and chromedriver not installed (apt: chromium chromium-driver)")


@needs_chromium
def test_report_renders_every_figure_in_chromium(hdet_run):
    declared, decoded, text = _render(hdet_run / "report.html", hdet_run / "report.png")
    # Training loss, per-replica window losses, explored hyperparameters, reliability curves.
    assert declared == 4
    assert decoded == declared
    for heading in ("Held-out metrics", "Segments", "by user activity level", "by item popularity bucket", "by tab"):
        assert heading in text
    # The per-group LR figure is drawn from hdet.jsonl, where the replicas fan out around the base.
    rec = read_jsonl(hdet_run / "hdet.jsonl")[0]["hparams"]["lr/transformer"]
    assert min(rec["values"]) < rec["base"] < max(rec["values"])
    # The default spread is geometric (hdet.space=log): the base is the replicas' geometric mean.
    assert abs(np.exp(np.mean(np.log(rec["values"]))) - rec["base"]) < 1e-6 * rec["base"] + 1e-12


@pytest.mark.slow  # trains one more run; the single-run report rendering test stays in the default suite
@needs_chromium
def test_comparison_report_renders(hdet_run, tmp_path, data_cache):
    plain = tmp_path / "plain"
    proc = run_train(plain, *FAST, "trainer.nproc=2", "trainer.sharding_group_size=2", data_cache=data_cache)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = tmp_path / "compare"
    ev = run_evaluate(f"runs=[{hdet_run},{plain}]", f"out={out}", "labels=[hdet,plain]", data_cache=data_cache)
    assert ev.returncode == 0, ev.stderr[-3000:]
    assert "reused" in ev.stdout  # the HDET run's eval.json scored the same day: not rescored
    assert (plain / "eval.json").exists() and (plain / "report.html").exists()
    declared, decoded, text = _render(out / "report.html")
    # Overlaid training loss, base LR per group, reliability; the HDET run's replica losses and hparams.
    assert declared == 5 and decoded == declared
    assert "hdet" in text and "plain" in text


@pytest.mark.slow  # more multi-process runs than the default suite has time for; `make test-all` runs it
def test_bad_run_directories_fail_with_a_clear_message(tmp_path, hdet_run, data_cache):
    missing = run_evaluate(f"run_dir={tmp_path / 'nope'}", data_cache=data_cache)
    assert missing.returncode == 2 and "no such directory" in missing.stderr
    # A diverged run has no checkpoint: named, and nothing is written into it.
    diverged = tmp_path / "diverged"
    shutil.copytree(hdet_run, diverged, ignore=shutil.ignore_patterns("checkpoint", "eval.json", "predictions.parquet",
                                                                     "report.*"))
    s = read_json(diverged / "summary.json")
    s["status"] = "diverged"
    (diverged / "summary.json").write_text(__import__("json").dumps(s))
    before = sorted(os.listdir(diverged))
    proc = run_evaluate(f"run_dir={diverged}", data_cache=data_cache)
    assert proc.returncode == 2 and "summary.json: status 'diverged'" in proc.stderr
    assert sorted(os.listdir(diverged)) == before
    bad_day = run_evaluate(f"run_dir={hdet_run}", "days=[20990101]", data_cache=data_cache)
    assert bad_day.returncode == 2 and "20990101" in bad_day.stderr and "not in" in bad_day.stderr
    neither = run_evaluate(data_cache=data_cache)
    assert neither.returncode == 2 and "run_dir=DIR or runs=" in neither.stderr


# ----------------------------------------------------------------------------------------------
# The report on real data (no true probabilities), its axes and its sections: built from eval.json
# content directly, no run needed.

_METRICS = {"auc": 0.71, "ne": 0.93, "logloss": 0.21, "calibration": 1.02, "ece": 0.01, "positive_rate": 0.05,
            "count": 40000}
_CURVE = {"predicted": [0.01, 0.03, 0.2], "observed": [0.0, 0.05, 0.25], "count": [2000, 2000, 2000]}


def _artifacts(tmp_path, label, oracle):
    """A RunArtifacts with an eval.json as the evaluation writes it; ``oracle``: synthetic data
    (the generator's true probabilities scored too) or real data (no oracle anywhere)."""
    from recsys_hdet.evaluation.run_artifacts import RunArtifacts

    run = RunArtifacts(str(tmp_path), label)
    run.summary = {"status": "completed", "steps": 6, "examples": 24, "train_loss": {"avg": 0.6},
                   "examples_per_sec": 77.0, "wall_seconds": 3.8, "peak_rss_mb": 481.0}
    run.metrics = [{"step": s, "examples": 4 * s, "loss": {"like": 0.6, "avg": 0.6}, "lr": {"dense": 1e-3}}
                   for s in (1, 2, 3, 6)]
    rnd = {"status": "present", "label": "unbiased estimate", "rows": 8, "eval": {"like": _METRICS}}
    run.evaluation = {"eval": {"like": _METRICS}, "gauc_user": {"like": {"gauc": 0.66, "groups": 5, "rows": 40}},
                      "random_exposure": rnd, "reliability": {"like": _CURVE}, "days": ["20220422"],
                      "segments": {"tab": {"tab 1": {"like": _METRICS}}}}
    if oracle:
        run.evaluation["oracle"] = {"like": {"ne": 0.9, "logloss": 0.2}}
        rnd["oracle"] = {"like": {"ne": 0.9, "logloss": 0.2}}
    return run


def _tables(page):
    """Each <table> of a page as a list of rows, each a list of cell texts (header row first)."""
    import re

    return [[re.findall(r"<t[dh]>(.*?)</t[dh]>", row) for row in re.findall(r"<tr>(.*?)</tr>", table)]
            for table in re.findall(r"<table>(.*?)</table>", page)]


def test_report_on_real_data_has_no_oracle_columns_and_says_why(tmp_path):
    from recsys_hdet.evaluation.report import render_comparison, render_run

    page = render_run(_artifacts(tmp_path, "real", oracle=False))
    assert "generator's true probabilities" not in page and "floor no model can beat" not in page
    assert "Real data: no true probabilities" in page and "oracle NE and NE gap columns are omitted" in page
    for table in _tables(page):
        head, rows = table[0], table[1:]
        assert "oracle NE" not in head and "NE gap" not in head
        for i, column in enumerate(head):  # no column without a single value
            assert any(row[i] != "–" for row in rows), (column, table)
    # Synthetic data keeps the oracle columns, filled, and the text explaining them.
    page = render_run(_artifacts(tmp_path, "synthetic", oracle=True))
    assert "<th>oracle NE</th><th>NE gap</th>" in page and "+0.0300" in page
    assert "generator's true probabilities" in page
    assert "Real data" not in page
    # A comparison of both: the oracle columns stay for the synthetic run, the real one is named.
    page = render_comparison([_artifacts(tmp_path, "synthetic", oracle=True),
                              _artifacts(tmp_path, "real", oracle=False)])
    assert "no oracle for real" in page


def test_examples_axis_unit_follows_the_run_size():
    from recsys_hdet.evaluation.report_figures import examples_axis_unit

    assert examples_axis_unit(24) == (1.0, "examples")
    assert examples_axis_unit(9_999) == (1.0, "examples")
    assert examples_axis_unit(208_896) == (1e3, "examples (thousands)")
    assert examples_axis_unit(5_000_000) == (1e6, "examples (millions)")


def test_reliability_curves_are_linear_and_leave_empty_bins_out(tmp_path):
    import matplotlib.pyplot as plt

    from recsys_hdet.evaluation.report_figures import reliability_figure, reliability_points

    run = _artifacts(tmp_path, "real", oracle=False)
    # A bin without examples (and one without a value) between bins with an observed rate of 0 and 1.
    run.evaluation["reliability"] = {"like": {"predicted": [0.02, 0.3, None, 0.6], "observed": [0.0, 0.0, None, 1.0],
                                              "count": [5, 0, 0, 5]}}
    pts = reliability_points(run.evaluation["reliability"]["like"])
    assert pts["predicted"] == [0.02, 0.6] and pts["observed"] == [0.0, 1.0] and pts["empty"] == 2
    fig, caption = reliability_figure([run])
    try:
        (ax,) = fig.axes
        assert ax.get_xscale() == "linear" and ax.get_yscale() == "linear"
        (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
        curve = [line for line in ax.get_lines() if line.get_label() != "perfect calibration"]
        assert len(curve) == 1
        xs, ys = curve[0].get_data()
        assert list(xs) == [0.02, 0.6] and list(ys) == [0.0, 1.0]  # the empty bins are not drawn
        assert all(x0 < x < x1 for x in xs) and all(y0 < y < y1 for y in ys)  # every point inside the axes
        notes = " ".join(t.get_text() for t in ax.texts)
        assert "2 bins of 5 examples" in notes and "2 empty (not drawn)" in notes
        assert "not drawn" in caption
    finally:
        plt.close(fig)


def test_every_report_section_has_a_heading(tmp_path):
    """Each section (<h2> or <h3>) holds at most one figure and never a table and a figure together:
    the random-exposure table and every figure after it have their own heading."""
    import re

    from recsys_hdet.evaluation.report import render_comparison, render_run

    run = _artifacts(tmp_path, "real", oracle=False)
    hdet = _artifacts(tmp_path, "hdet", oracle=True)
    hdet.hdet = [{"step": s, "losses": [0.5, 0.6], "excluded": [],
                  "hparams": {"lr/dense": {"values": [1e-3, 2e-3], "base": 1.4e-3}}} for s in (5, 10)]
    for page, figures in ((render_run(run), 3), (render_run(hdet), 4), (render_comparison([run, hdet]), 5)):
        body = page.split("<body", 1)[1]
        sections = re.split(r"<h[23]>", body)[1:]
        assert sum(s.count("<figure>") for s in sections) == body.count("<figure>") == figures
        for s in sections:
            assert s.count("<figure>") <= 1, s[:80]
            assert not ("<table>" in s and "<figure>" in s), s[:80]
        for heading in ("Training loss", "Calibration (reliability curves)", "Random exposure (unbiased estimate)"):
            assert f"<h2>{heading}</h2>" in page


def _predictions(rows=400, seed=0):
    rng = np.random.default_rng(seed)
    tabs = ["tab 10", "tab 2", "tab 1", "out of vocabulary"]
    pops = ["tail", "cold (unseen in training)", "head", "torso"]
    data = {"user_activity": [["high_active", "low_active"][i % 2] for i in range(rows)],
            "item_popularity": [pops[i % 4] for i in range(rows)], "tab_segment": [tabs[i % 4] for i in range(rows)],
            "user_id_raw": rng.integers(0, 30, rows), "is_rand": (np.arange(rows) % 5 == 0).astype(np.int8)}
    for t in TASKS:
        p = rng.uniform(0.05, 0.95, rows).astype(np.float32)
        data[f"pred_{t}"], data[f"oracle_{t}"] = p, p
        data[f"label_{t}"] = (rng.uniform(size=rows) < p).astype(np.float32)
    return pl.DataFrame(data)


def test_segments_come_in_natural_order():
    from recsys_hdet.evaluation import evaluate_frame

    out = evaluate_frame(_predictions(), TASKS)
    assert list(out["segments"]["tab"]) == ["out of vocabulary", "tab 1", "tab 2", "tab 10"]
    assert list(out["segments"]["item_popularity"]) == ["head", "torso", "tail", "cold (unseen in training)"]


def test_a_clean_evaluation_warns_nothing(tmp_path):
    """Every UserWarning an error, in a fresh process (torch warns about a read-only array once per process)."""
    _predictions().write_parquet(tmp_path / "p.parquet")
    code = ("import polars as pl; from recsys_hdet.evaluation import evaluate_frame; "
            f"evaluate_frame(pl.read_parquet({str(tmp_path / 'p.parquet')!r}), {TASKS!r}); print('ok')")
    proc = run_command([sys.executable, "-W", "error::UserWarning", "-c", code], timeout=300,
                       env={k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"})
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-3000:]


def test_the_report_names_its_commit_checkpoint_and_time(hdet_run):
    text = (hdet_run / "report.html").read_text()
    ev = read_json(hdet_run / "eval.json")
    assert ev["checkpoint"] == str(hdet_run / "checkpoint") and ev["checkpoint_steps"] > 0 and ev["evaluated_at"]
    assert f"commit <code>{read_json(hdet_run / 'summary.json')['code']}</code>" in text
    assert f"checkpoint <code>{hdet_run / 'checkpoint'}</code> (step {ev['checkpoint_steps']:,})" in text
    assert f"evaluated {ev['evaluated_at']}" in text


def test_a_comparison_shows_each_task_s_paired_difference(hdet_run, tmp_path):
    """A second 'run' with the first run's artifacts and its like predictions made worse: the comparison
    reports like's NE difference with an interval above 0, and 0 difference on the untouched tasks."""
    from recsys_hdet.evaluation.report import render_comparison
    from recsys_hdet.evaluation.run_artifacts import RunArtifacts
    from recsys_hdet.evaluation.task_metrics import paired_ne_difference

    other = tmp_path / "other"
    other.mkdir()
    for name in ("summary.json", "eval.json", "metrics.jsonl"):
        shutil.copy(hdet_run / name, other / name)
    df = pl.read_parquet(hdet_run / "predictions.parquet")
    worse = df.with_columns((pl.col("pred_like") * 0.5 + 0.25).alias("pred_like"))
    worse.write_parquet(other / "predictions.parquet")
    page = render_comparison([RunArtifacts(str(hdet_run), "a"), RunArtifacts(str(other), "b")])
    d = paired_ne_difference(df["label_like"].to_numpy(), worse["pred_like"].to_numpy(), df["pred_like"].to_numpy())
    assert d["low"] > 0
    assert "Differences against a" in page and f"{d['diff']:+.4f} [{d['low']:+.4f}, {d['high']:+.4f}]" in page
    assert "+0.0000 [+0.0000, +0.0000]" in page  # contribution and long_dwell: the same predictions


def test_every_explored_hyperparameter_panel_has_a_legend(monkeypatch):
    from types import SimpleNamespace

    from recsys_hdet.evaluation import report_figures

    figures = []
    monkeypatch.setattr(report_figures, "_figure", lambda fig, caption: figures.append(fig) or "fig")
    records = [{"step": s, "hparams": {name: {"base": 0.01, "values": [0.008, 0.0125]} for name in
                                       ("lr/embedding", "lr/transformer", "dropout", "weight_decay", "temperature")}}
               for s in (5, 10, 15)]
    assert report_figures.fig_hparams(SimpleNamespace(hdet=records, metrics=[])) == "fig"
    panels = [ax for ax in figures[0].axes if ax.get_visible()]
    assert len(panels) == 10 and all(ax.get_legend() is not None for ax in panels)


def test_a_run_saves_its_data_root_absolute(hdet_run, tiny_dataset):
    """Evaluating or exporting a run works from any directory: its saved config names the data set as it
    resolved it, not relative to where it was started (nor through an environment variable)."""
    from omegaconf import OmegaConf

    root = OmegaConf.load(hdet_run / ".hydra" / "config.yaml").data.root
    assert os.path.isabs(root) and "${" not in root and os.path.samefile(root, tiny_dataset)


def test_the_learning_rate_figure_labels_each_group_with_its_schedule_as_trained(monkeypatch):
    """A plain run's LR figure: each group's line names its schedule (RunDir.SUMMARY's lr.schedule), a group on its
    own decay is marked where its anneal starts, and the comparison's panels name a run's own decay."""
    from types import SimpleNamespace

    from recsys_hdet.evaluation import report_figures

    figures = []
    monkeypatch.setattr(report_figures, "_figure", lambda fig, caption: figures.append((fig, caption)) or "fig")
    shared = {"schedule": "one_cycle", "shared": True, "pct_start": 0.3, "decay_start": 0.3, "shape": "cos"}
    own = {**shared, "shared": False, "decay_start": 0.7, "shape": "linear"}
    schedule = {"embedding": own, "transformer": shared}
    metrics = [{"step": s, "lr": {"embedding": 0.01 * s, "transformer": 0.001}} for s in (10, 50, 100)]
    run = SimpleNamespace(hdet=[], metrics=metrics, label="run",
                          summary={"total_steps": 100, "lr": {"schedule": schedule}})
    assert report_figures.fig_hparams(run) == "fig"
    fig, caption = figures[-1]
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels == ["embedding: own decay: held to 0.7, then linear", "transformer: one-cycle, cos from 0.3"]
    assert [line.get_xdata()[0] for line in fig.axes[0].lines if line.get_linestyle() == ":"] == [70.0]
    assert "own decay: embedding" in caption
    before = SimpleNamespace(hdet=[], metrics=metrics, label="old", summary={})  # a run from before lr.schedule
    assert report_figures.fig_hparams(before) == "fig"
    assert [t.get_text() for t in figures[-1][0].axes[0].get_legend().get_texts()] == ["embedding", "transformer"]
    assert report_figures.fig_base_lrs([run, before]) == "fig"
    panels = {ax.get_title(): [t.get_text() for t in ax.get_legend().get_texts()] for ax in figures[-1][0].axes
              if ax.get_visible()}
    assert panels == {"lr/embedding": ["run (own decay: held to 0.7, then linear)", "old"],
                      "lr/transformer": ["run", "old"]}
