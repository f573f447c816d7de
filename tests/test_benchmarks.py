"""Smoke test of the benchmark harness: ``python -m benchmarks.run --tiny`` end to end.

It checks that every contender ran and that results.json has the documented shape. No timing
is asserted (the numbers of a tiny run on a loaded CI machine mean nothing).
"""

import json
import os
import sys

import pytest

from conftest import REPO, run_command


@pytest.mark.slow  # several training runs end to end; `make test-all` runs it
def test_benchmark_harness_runs_in_tiny_mode(tiny_dataset, data_cache):
    # Without --out, a tiny (or quick) run writes beside the committed figures, never over them.
    out = os.path.join(REPO, "outputs", "benchmarks", "results-tiny.json")
    if os.path.exists(out):
        os.remove(out)
    bench_md = os.path.join(REPO, "BENCHMARKS.md")
    committed = os.path.join(REPO, "benchmarks", "results.json")
    before, committed_before = open(bench_md).read(), open(committed).read()
    env = {**os.environ, "RECSYS_HDET_DATA": data_cache, "PYTHONWARNINGS": "ignore"}
    proc = run_command([sys.executable, "-m", "benchmarks.run", "--tiny"], env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert open(committed).read() == committed_before
    with open(out) as f:
        r = json.load(f)
    assert set(r["throughput"]) == {"torch_reference", "torchrec_ddp", "hdet_T1000", "hdet_T100"}
    assert all(v > 0 for v in r["throughput"].values())
    assert r["runs"] == 1 and r["mode"] == "tiny" and "cores" in r["machine"]
    assert r["loader_rows_per_sec"] > 0
    assert r["throughput_all"]["hdet_probe_T100"] > 0 and r["probe"]["step_seconds"] > 0
    assert set(r["peak_rss_mb"]) >= {"torch_reference", "torchrec_ddp", "hdet_T1000", "hdet_T100", "scaling_1"}
    assert all(v > 50 for v in r["peak_rss_mb"].values())  # a real process's RSS, in MB
    assert set(r["scaling"]) == {"1", "2"}
    # Both HDET contenders synced at least once (the last step always converges).
    assert r["syncs"]["hdet_T1000"] >= 1 and r["syncs"]["hdet_T100"] >= 1
    assert len(r["converge"]["seconds"]) == len(r["converge"]["sizes_mb"]) >= 2
    # The same model on the same data: the plain-PyTorch reference's loss is in the pipeline's range.
    assert abs(r["train_loss"]["torch_reference"] - r["train_loss"]["torchrec_ddp"]) < 0.05
    # The same-run GEMM peak and the model's arithmetic, and the ratios built on them.
    assert set(r["gemm_peak_gflops"]) >= {"1"} and all(v > 0 for v in r["gemm_peak_gflops"].values())
    assert 0.5e6 < r["flops_per_example"] < 2e6 and r["model_gemm_shapes"]
    assert 0 < r["peak_fraction_1worker"] < 1 and 0 < r["peak_fraction_1worker_1thread"] < 1
    assert r["loader_rows_per_sec_one_core"] > 0 and 0 <= r["data_wait_fraction"] < 1
    assert r["throughput_all"]["scaling_1_1thread"] > 0
    assert "| torchrec_ddp |" in proc.stdout and "same-run GEMM peak" in proc.stdout
    assert open(bench_md).read() == before  # only --write records into BENCHMARKS.md


def test_the_committed_data_scaling_record_has_every_figure_per_size_from_a_clean_commit():
    with open(os.path.join(REPO, "benchmarks", "results.json")) as f:
        r = json.load(f)["data_scaling"]
    assert r["mode"] == "full" and r["commit"]["clean"] and len(r["commit"]["commit"]) == 40
    assert len(r["rows"]) >= 3 and r["rows"] == sorted(r["rows"])
    for key in ("convert_peak_rss_mb", "convert_seconds", "loader_rows_per_sec_one_core",
                "train_peak_rss_mb_per_worker", "train_examples_per_sec"):
        assert len(r[key]) == len(r["rows"]) and all(v > 0 for v in r[key]), key
    assert {"convert_peak_rss_growth", "loader_rank0_of_4_one_core_rows_per_sec_lowest",
            "train_peak_rss_per_worker_growth"} <= set(r["targets"])


@pytest.mark.slow  # generates, converts and loads three small data sets in subprocesses
def test_the_catalog_benchmark_runs_small_and_records_nothing(tmp_path):
    committed = os.path.join(REPO, "benchmarks", "results.json")
    before = open(committed).read()
    proc = run_command([sys.executable, "-m", "benchmarks.scaling_catalog", "--videos", "2000,20000",
                        "--rows-per-day", "3000", "--row-days", "4", "--k27-rows-per-day", "6000",
                        "--k27-train-steps", "0",
                        "--out-dir", str(tmp_path), "--no-record"], timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert open(committed).read() == before
    with open(os.path.join(REPO, "outputs", "benchmarks", "scaling-catalog.json")) as f:
        r = json.load(f)
    assert [s["n_videos"] for s in r["catalog"]] == [2000, 20000] and r["k27"]["rows"] == 18000
    assert r["rows"]["n_videos"] == 2000 and r["rows"]["rows"] == 12000
    for s in r["catalog"] + [r["rows"], r["k27"]]:
        assert s["convert_peak_rss_mb"] >= max(p["peak_rss_mb"] for p in s["convert_phases"].values()) > 0
        assert {"check joins", "video table", "day files"} <= set(s["convert_phases"])
        assert s["loader_0_of_4"]["rows_per_cpu_second"] > 0
    assert {"convert_peak_rss_catalog_growth", "convert_peak_rss_row_growth",
            "k27_shaped_convert_peak_rss_mb"} <= set(r["targets"])


def test_the_committed_catalog_record_has_the_catalog_axis_and_the_27k_shaped_run():
    with open(os.path.join(REPO, "benchmarks", "results.json")) as f:
        r = json.load(f)["data_scaling"]["catalog"]
    assert r["commit"]["clean"] and len(r["commit"]["commit"]) == 40
    videos = [s["n_videos"] for s in r["catalog"]]
    assert videos == sorted(videos) and videos[0] <= 300_000 and videos[-1] >= 32_000_000
    assert len({s["rows"] for s in r["catalog"]}) == 1  # the catalog grows, the rows do not
    k = r["k27"]
    assert k["n_videos"] >= 32_000_000 and k["days"] >= 3 and k["rows_per_day"] >= 10_000_000
    assert r["rows"]["n_videos"] == videos[0] and r["rows"]["rows"] >= 10 * r["catalog"][0]["rows"]
    for s in r["catalog"] + [r["rows"], k]:
        assert s["convert_seconds"] > 0 and s["convert_peak_rss_mb"] > 0 and s["convert_phases"]
    assert {"convert_peak_rss_catalog_growth", "convert_peak_rss_row_growth", "k27_shaped_convert_peak_rss_mb",
            "k27_shaped_train_2x2_peak_rss_mb_per_worker", "loader_rank0_of_4_rows_per_cpu_second_lowest"} \
        <= set(r["targets"])
