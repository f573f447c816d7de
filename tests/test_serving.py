"""Export and predict: a trained run leaves the training world.

The tiny HDET run (4 workers, tables sharded over 2 sharding groups) is exported with the command;
its held-out day is scored with the artifact in a fresh process and matches the trained model's
``predictions.parquet`` row by row; the program loads and runs in a subprocess that cannot import
torchrec, Hydra, omegaconf, polars or this project; ids the model never saw are scored through the
out-of-vocabulary row and counted; bad input exits 2 naming the file, row and column, writing nothing.
"""

import json
import os
import subprocess
import sys

import numpy as np
import polars as pl
import pytest

from conftest import run_command

TASKS = ["contribution", "like", "long_dwell"]


def _cli(module, *args, data_cache, timeout=300):
    env = {**os.environ, "RECSYS_HDET_DATA": data_cache, "PYTHONWARNINGS": "ignore"}
    return run_command([sys.executable, "-m", module, *args], env=env, timeout=timeout)


@pytest.fixture(scope="module")
def exported(hdet_run, tmp_path_factory, data_cache):
    out = tmp_path_factory.mktemp("serving") / "model"
    proc = _cli("recsys_hdet.export", f"run_dir={hdet_run}", f"out={out}", data_cache=data_cache)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return out


def _held_out_day(hdet_run):
    with open(hdet_run / "eval.json") as f:
        (day,) = json.load(f)["days"]
    return day


def test_the_exported_model_scores_the_held_out_day_as_the_trained_model_did(hdet_run, exported, tmp_path, data_cache, tiny_dataset):
    manifest = json.loads((exported / "manifest.json").read_text())
    assert manifest["tasks"] == TASKS and manifest["checkpoint_steps"] > 0 and manifest["train_days"]
    assert manifest["commit"] != "" and manifest["exported_at"] and manifest["dense_normalization"]["days"] == manifest["train_days"]
    day, root = _held_out_day(hdet_run), tiny_dataset
    out = tmp_path / "scores.parquet"
    proc = _cli("recsys_hdet.predict", f"model_dir={exported}", f"input={root}", f"day={day}", f"out={out}",
                data_cache=data_cache)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "out-of-vocabulary row): none" in proc.stdout
    scores, trained = pl.read_parquet(out), pl.read_parquet(hdet_run / "predictions.parquet")
    assert scores.height == trained.height > 0
    assert (scores["user_id_raw"] == trained["user_id_raw"]).all() and (scores["time_ms"] == trained["time_ms"]).all()
    for t in TASKS:
        diff = np.abs(scores[f"pred_{t}"].to_numpy().astype(np.float64) - trained[f"pred_{t}"].to_numpy())
        assert diff.max() < 1e-5, (t, diff.max())
        assert (scores[f"label_{t}"] == trained[f"label_{t}"]).all()


# Run with every project and training-stack import refused: the artifact needs torch (and json) alone.
_MINIMAL = r"""
import importlib.abc, json, sys
BLOCKED = ("torchrec", "fbgemm_gpu", "hydra", "omegaconf", "polars", "pyarrow", "recsys_hdet", "data_tools", "pipelines")
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is not allowed here")
sys.meta_path.insert(0, Refuse())
import torch
model_dir, inputs, out = sys.argv[1:4]
manifest = json.load(open(f"{model_dir}/manifest.json"))
program = torch.export.load(f"{model_dir}/{manifest['program']}").module()
args = torch.load(inputs, weights_only=True)
with torch.no_grad():
    probs = program(args["dense"], args["ids"], args["values"], args["offsets"])
torch.save(probs, out)
print("loaded", sorted(m.split(".")[0] for m in sys.modules if m.split(".")[0] in BLOCKED))
"""


def test_the_artifact_loads_and_runs_with_torch_alone(hdet_run, exported, tmp_path, tiny_dataset):
    import torch

    from recsys_hdet.serving.artifact import read_manifest
    from recsys_hdet.serving.predict import check_processed, model_inputs

    manifest = read_manifest(str(exported))
    day, root = _held_out_day(hdet_run), tiny_dataset
    df = pl.read_parquet(os.path.join(root, f"day={day}.parquet")).head(700)
    check_processed(df, "held-out day", manifest)
    dense, ids, values, offsets = model_inputs(df, manifest)
    torch.save({"dense": dense, "ids": ids, "values": values, "offsets": offsets}, tmp_path / "inputs.pt")
    proc = subprocess.run([sys.executable, "-c", _MINIMAL, str(exported), str(tmp_path / "inputs.pt"),
                           str(tmp_path / "probs.pt")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "loaded []" in proc.stdout  # none of the refused packages was imported
    probs = torch.load(tmp_path / "probs.pt").numpy()
    trained = pl.read_parquet(hdet_run / "predictions.parquet").head(700)
    for i, t in enumerate(TASKS):
        assert np.abs(probs[:, i] - trained[f"pred_{t}"].to_numpy()).max() < 1e-5


def test_ids_past_the_tables_are_scored_as_out_of_vocabulary_and_counted(hdet_run, exported, tmp_path, tiny_dataset):
    from recsys_hdet.serving.predict import predict

    day, root = _held_out_day(hdet_run), tiny_dataset
    manifest = json.loads((exported / "manifest.json").read_text())
    rows = manifest["tables"]["user_id"]
    df = pl.read_parquet(os.path.join(root, f"day={day}.parquet")).head(50)
    first7 = pl.int_range(pl.len()) < 7
    df.with_columns(pl.when(first7).then(rows + 3).otherwise(pl.col("user_id")).alias("user_id")) \
        .write_parquet(tmp_path / "unseen.parquet")
    df.with_columns(pl.when(first7).then(1).otherwise(pl.col("user_id")).alias("user_id")).write_parquet(tmp_path / "oov.parquet")
    said = []
    unseen = predict(str(exported), str(tmp_path / "unseen.parquet"), str(tmp_path / "a.parquet"), say=said.append)
    oov = predict(str(exported), str(tmp_path / "oov.parquet"), str(tmp_path / "b.parquet"), say=said.append)
    assert unseen["unknown_ids"]["user_id"] == 7 and oov["unknown_ids"]["user_id"] == 0
    assert sum(unseen["unknown_ids"].values()) == 7 and "user_id 7 rows" in said[1]
    a, b = pl.read_parquet(tmp_path / "a.parquet"), pl.read_parquet(tmp_path / "b.parquet")
    for t in TASKS:
        assert (a[f"pred_{t}"] == b[f"pred_{t}"]).all()


def test_a_raw_log_is_scored_as_its_processed_rows_are(hdet_run, exported, tmp_path, tiny_dataset):
    """A raw KuaiRand-schema log of the held-out day, converted through the model's vocabularies, scores
    each impression as the processed day file does (joined on the raw ids and time)."""
    from recsys_hdet.serving.predict import predict

    day = _held_out_day(hdet_run)
    raw = tiny_dataset + ".raw"
    lines = open(os.path.join(raw, "log_synthetic.csv")).read().splitlines(keepends=True)
    date = lines[0].rstrip("\n").split(",").index("date")
    (tmp_path / "log.csv").write_text("".join([lines[0], *[x for x in lines[1:] if x.split(",")[date] == day][:2000]]))
    got = predict(str(exported), str(tmp_path / "log.csv"), str(tmp_path / "raw.parquet"),
                  users=os.path.join(raw, "user_features_synthetic.csv"),
                  videos=os.path.join(raw, "video_features_basic_synthetic.csv"), say=lambda line: None)
    predict(str(exported), os.path.join(tiny_dataset, f"day={day}.parquet"), str(tmp_path / "day.parquet"),
            say=lambda line: None)
    a = pl.read_parquet(tmp_path / "raw.parquet")
    joined = a.join(pl.read_parquet(tmp_path / "day.parquet"), on=["user_id_raw", "video_id_raw", "time_ms"], suffix="_day")
    assert got["rows"] == a.height == joined.height == 2000
    for t in TASKS:
        assert np.abs(joined[f"pred_{t}"].to_numpy() - joined[f"pred_{t}_day"].to_numpy()).max() < 1e-6


DAMAGE = [
    (lambda df: df.drop("log_register_days"), "column 'log_register_days': required column missing"),
    (lambda df: df.with_columns(pl.when(pl.int_range(pl.len()) == 4).then(-2).otherwise(pl.col("video_id"))
                                .alias("video_id")), "row 4: column 'video_id': a negative id"),
    (lambda df: df.with_columns(pl.when(pl.int_range(pl.len()) == 9).then(float("nan")).otherwise(pl.col("aspect_ratio"))
                                .cast(pl.Float32).alias("aspect_ratio")), "row 9: column 'aspect_ratio': NaN or inf"),
    (lambda df: df.with_columns(pl.col("user_id").cast(pl.Float64)), "column 'user_id': dtype Float64"),
]


@pytest.mark.parametrize("damage, named", DAMAGE)
def test_bad_input_is_refused_naming_the_file_row_and_column(hdet_run, exported, tmp_path, tiny_dataset, damage, named):
    from recsys_hdet.serving.predict import PredictError, predict

    bad = tmp_path / "bad.parquet"
    damage(pl.read_parquet(os.path.join(tiny_dataset, f"day={_held_out_day(hdet_run)}.parquet")).head(20)).write_parquet(bad)
    with pytest.raises(PredictError) as e:
        predict(str(exported), str(bad), str(tmp_path / "scores.parquet"))
    assert str(bad) in str(e.value) and named in str(e.value), str(e.value)
    assert os.listdir(tmp_path) == ["bad.parquet"]  # no scores, no scratch left


def test_the_command_exits_2_on_bad_input(hdet_run, exported, tmp_path, data_cache, tiny_dataset):
    bad = tmp_path / "bad.parquet"
    DAMAGE[1][0](pl.read_parquet(os.path.join(tiny_dataset, f"day={_held_out_day(hdet_run)}.parquet")).head(20)) \
        .write_parquet(bad)
    out = tmp_path / "scores.parquet"
    proc = _cli("recsys_hdet.predict", f"model_dir={exported}", f"input={bad}", f"out={out}", data_cache=data_cache)
    assert proc.returncode == 2 and DAMAGE[1][1] in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert not out.exists()


def test_export_refuses_what_it_cannot_export(hdet_run, exported, tmp_path, data_cache, tiny_dataset):
    proc = _cli("recsys_hdet.export", f"run_dir={tmp_path}", f"out={tmp_path / 'm'}", data_cache=data_cache)
    assert proc.returncode == 2 and "not a recsys_hdet run directory" in proc.stderr, proc.stderr[-2000:]
    proc = _cli("recsys_hdet.export", f"run_dir={hdet_run}", f"out={exported}", data_cache=data_cache)
    assert proc.returncode == 2 and "already exists" in proc.stderr, proc.stderr[-2000:]
    proc = _cli("recsys_hdet.predict", f"model_dir={tmp_path}", f"input={tmp_path}", f"out={tmp_path / 's.parquet'}",
                data_cache=data_cache)
    assert proc.returncode == 2 and "is not an exported model" in proc.stderr, proc.stderr[-2000:]
