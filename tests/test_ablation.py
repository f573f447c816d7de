"""The ablation pipeline: real (tiny) runs, resumability, and the tables it writes."""

import json
import math
import os
import sys

import pytest

from conftest import REPO, read_json, run_command


def run_ablation(out, seeds, *overrides, data_cache):
    env = {**os.environ, "RECSYS_HDET_DATA": data_cache, "PYTHONWARNINGS": "ignore"}
    cmd = [sys.executable, "-m", "studies.ablation", "data=tiny", "trainer.nproc=2", "trainer.sharding_group_size=2",
           *overrides, "--out", str(out), "--configs", "baseline_low", "--no-report", "--seeds", *seeds]
    return run_command(cmd, env=env, timeout=600)


@pytest.mark.slow  # several training runs end to end; `make test-all` runs it
def test_ablation_is_resumable_and_summarizes_over_seeds(tmp_path, tiny_dataset, data_cache):
    out = tmp_path / "study"
    first = run_ablation(out, ["0"], data_cache=data_cache)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    seed0 = out / "runs" / "baseline_low" / "seed0"
    summary_mtime = os.path.getmtime(seed0 / "summary.json")
    # A crashed attempt at seed 1: a .partial directory without summary.json.
    crashed = out / "runs" / "baseline_low" / "seed1.partial"
    crashed.mkdir(parents=True)
    (crashed / "junk").write_text("left by a crash")
    second = run_ablation(out, ["0", "1"], data_cache=data_cache)
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-2000:]
    assert "baseline_low seed 0: finished earlier, skipped" in second.stdout
    assert os.path.getmtime(seed0 / "summary.json") == summary_mtime
    assert not crashed.exists() and (out / "runs" / "baseline_low" / "seed1" / "summary.json").exists()
    assert not (out / "runs" / "baseline_low" / "seed1" / "junk").exists()
    # Different seeds train differently (data order and init), and the table is their mean and std.
    losses = [read_json(out / "runs" / "baseline_low" / f"seed{k}" / "summary.json")["train_loss"]["avg"] for k in (0, 1)]
    assert losses[0] != losses[1]
    result = json.loads((out / "ablation.json").read_text())
    row = next(r for r in result["rows"] if r["config"] == "baseline_low")
    assert row["seeds_run"] == 2 and row["diverged"] == 0
    assert abs(row["train_loss"]["mean"] - sum(losses) / 2) < 1e-12
    assert abs(row["train_loss"]["std"] - abs(losses[0] - losses[1]) / 2 ** 0.5) < 1e-12
    md = (out / "ablation.md").read_text()
    assert "| baseline_low |" in md and "3.294" in md  # the paper's number beside ours
    # Resuming with other overrides would mix two studies in one table: refused, naming the run.
    other = run_ablation(out, ["0"], "data.batch_size=128", data_cache=data_cache)
    assert other.returncode == 2 and "seed0: finished with overrides" in other.stderr


@pytest.mark.slow  # more multi-process runs than the default suite has time for; `make test-all` runs it
def test_a_failing_run_is_reported_and_the_exit_status_says_so(tmp_path, tiny_dataset, data_cache):
    # An override the trainer rejects: the run fails, the pipeline carries on and exits 1 naming it.
    proc = run_ablation(tmp_path / "study", ["0"], "optim.lr.embedding=-1", data_cache=data_cache)
    assert proc.returncode == 1
    assert "baseline_low seed 0 (exit status 2" in proc.stderr
    assert (tmp_path / "study" / "runs" / "baseline_low" / "seed0.partial" / "train.log").exists()


def test_base_vs_schedule_is_one_when_the_controller_follows_the_schedule():
    from studies.ablation import GROUPS, base_vs_schedule

    schedule = lambda step: (0.01 * (1 - step / 1000), 0.9)
    records = [{"step": s, "hparams": {f"lr/{g}": {"next_base": schedule(s)[0] * (0.5 if g == "transformer" else 1.0),
                                                  "velocity": 1e-6} for g in GROUPS}} for s in (100, 200, 300)]
    ratios = base_vs_schedule(records, {g: schedule for g in GROUPS})
    assert abs(ratios["embedding"] - 1.0) < 1e-12 and abs(ratios["transformer"] - 0.5) < 1e-12
    # Syncs before the controller started (velocity 0) do not count.
    assert base_vs_schedule([{**records[0], "hparams": {"lr/embedding": {"next_base": 1.0, "velocity": 0.0}}}],
                            {"embedding": schedule}) == {}


def test_the_report_keeps_the_previous_table_verbatim_and_names_the_controller(tmp_path):
    from studies.ablation import main, previous_table, render_markdown

    previous = tmp_path / "old.md"
    previous.write_text("# old\n\ntext\n\n| configuration | what |\n|---|---|\n| hdet_full | 0.2024 |\n\n| other | table |\n")
    assert previous_table(str(previous)) == ["| configuration | what |", "|---|---|", "| hdet_full | 0.2024 |"]
    result = {"seeds": [0], "rows": [], "hdet_form": {"space": "log", "score": "regression", "alpha": 0.25}}
    md = render_markdown(result, "cmd", "machine", None, str(previous))
    assert "`space=log`, `score=regression`, `alpha=0.25`" in md
    assert md.rstrip().endswith("| hdet_full | 0.2024 |") and "| other | table |" not in md
    # A --previous without a table is refused before any run is trained.
    (tmp_path / "empty.md").write_text("no table here\n")
    assert main(["--out", str(tmp_path / "study"), "--previous", str(tmp_path / "empty.md")]) == 2
    assert not (tmp_path / "study").exists()


def test_the_contrasts_pair_seeds_where_both_completed_and_report_failures_beside():
    from studies.ablation import contrasts, render_markdown

    rows = {"data": "bench", "reserve_rows": 4096, "total_steps": 960, "examples_per_step": 2048}

    def line(name, seed, ne, status="completed"):
        return {"name": f"{name}/seed{seed}", "seed": seed, "status": status, "rows": dict(rows),
                "mean_ne": ne if status == "completed" else None,
                **({"eval": {t: {"ne": ne} for t in ("contribution", "like", "long_dwell")}} if status == "completed" else {})}

    results = {f"hdet_full/seed{s}": line("hdet_full", s, ne) for s, ne in ((0, 0.790), (1, 0.800), (2, 1.0))}
    results.update({f"hdet_no_autolr/seed{s}": line("hdet_no_autolr", s, ne) for s, ne in ((0, 0.785), (1, 0.791), (2, 0.79))})
    (c,) = contrasts(results, [0, 1, 2])  # only this pair has runs on both sides
    assert (c["contender"], c["reference"]) == ("hdet_full", "hdet_no_autolr")
    # Seed 2's contender ended at the base rate: failed, beside the pairing, never a difference of NE 1.
    assert c["seeds"] == [0, 1] and c["failed"] == [2] and c["reference_failed"] == []
    assert c["diff"]["mean"] == pytest.approx(0.007) and c["diff"]["n"] == 2
    half = 12.706 * math.sqrt(((0.005 - 0.007) ** 2 + (0.009 - 0.007) ** 2) / 1) / math.sqrt(2)
    assert c["diff"]["ci95"] == pytest.approx([0.007 - half, 0.007 + half], rel=1e-3)
    md = render_markdown({"seeds": [0, 1, 2], "rows": [], "hdet_form": None, "contrasts": [c]}, "cmd", "m", None)
    assert "| hdet_full - hdet_no_autolr | the controller" in md and "+0.0070 [" in md and "| 1 / 0 |" in md
