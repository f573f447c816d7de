"""Export and predict: a trained run leaves the training world.

The tiny HDET run (4 workers, tables sharded over 2 sharding groups) is exported with the command;
its held-out day is scored with the artifact in a fresh process and matches the trained model's
``predictions.parquet`` row by row; the program loads and runs in a subprocess that cannot import
torchrec, Hydra, omegaconf, polars or this project; ids the model never saw are scored through the
out-of-vocabulary row and counted; bad input exits 2 naming the file, row and column, writing nothing.
"""

import json
import os
import sys

import numpy as np
import polars as pl
import pytest

from conftest import run_command, run_torch_alone

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
    proc = _cli("recsys_hdet.predict", f"model_dir={exported}", f"data.root={root}", f"day={day}", f"out={out}",
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


# Run with every project and training-stack import refused (conftest.run_torch_alone): the artifact needs torch
# (and json) alone.
_SCORE = r"""
model_dir, inputs, out = sys.argv[1:4]
manifest = json.load(open(f"{model_dir}/manifest.json"))
program = torch.export.load(f"{model_dir}/{manifest['program']}").module()
args = torch.load(inputs, weights_only=True)
with torch.no_grad():
    probs = program(args["dense"], args["ids"], args["values"], args["offsets"])
torch.save(probs, out)
"""


def test_the_artifact_loads_and_runs_with_torch_alone(hdet_run, exported, tmp_path, tiny_dataset):
    import torch

    from recsys_hdet.serving.manifest import read_manifest
    from recsys_hdet.serving.predict import check_processed, model_inputs

    manifest = read_manifest(str(exported))
    day, root = _held_out_day(hdet_run), tiny_dataset
    df = pl.read_parquet(os.path.join(root, f"day={day}.parquet")).head(700)
    check_processed(df, "held-out day", manifest)
    dense, ids, values, offsets = model_inputs(df, manifest)
    torch.save({"dense": dense, "ids": ids, "values": values, "offsets": offsets}, tmp_path / "inputs.pt")
    proc = run_torch_alone(_SCORE, exported, tmp_path / "inputs.pt", tmp_path / "probs.pt")
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
    proc = _cli("recsys_hdet.predict", f"model_dir={exported}", f"log={bad}", f"out={out}", data_cache=data_cache)
    assert proc.returncode == 2 and DAMAGE[1][1] in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert not out.exists()


def test_export_refuses_what_it_cannot_export(hdet_run, exported, tmp_path, data_cache, tiny_dataset):
    proc = _cli("recsys_hdet.export", f"run_dir={tmp_path}", f"out={tmp_path / 'm'}", data_cache=data_cache)
    assert proc.returncode == 2 and "not a recsys_hdet run directory" in proc.stderr, proc.stderr[-2000:]
    proc = _cli("recsys_hdet.export", f"run_dir={hdet_run}", f"out={exported}", data_cache=data_cache)
    assert proc.returncode == 2 and "already exists" in proc.stderr, proc.stderr[-2000:]
    proc = _cli("recsys_hdet.predict", f"model_dir={tmp_path}", f"data.root={tmp_path}", f"out={tmp_path / 's.parquet'}",
                data_cache=data_cache)
    assert proc.returncode == 2 and "is not an exported model" in proc.stderr, proc.stderr[-2000:]


@pytest.mark.parametrize("damaged", ["model.pt2", "vocab/video_id.parquet"])
def test_a_truncated_artifact_file_is_named_and_predict_exits_2(hdet_run, exported, tmp_path, data_cache, tiny_dataset,
                                                                 damaged):
    """Issue 49: the manifest records each file's size and sha256; a truncated program or vocabulary (scoring a
    processed data set reads no vocabulary, so it went unnoticed) is refused before anything is scored: exit 2,
    the file named, nothing written. The same bytes with one flipped (the size kept) are refused too."""
    import shutil

    model = tmp_path / "model"
    shutil.copytree(exported, model)
    target = model / damaged
    data = target.read_bytes()
    out = tmp_path / "scores.parquet"
    for broken, why in ((data[: len(data) // 2], "bytes, the manifest records"),
                        (data[:-1] + bytes([data[-1] ^ 1]), "sha256 differs")):
        target.write_bytes(broken)
        proc = _cli("recsys_hdet.predict", f"model_dir={model}", f"data.root={tiny_dataset}", f"out={out}",
                    data_cache=data_cache)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and str(target) in lines[-1] and why in lines[-1], proc.stderr[-2000:]
        assert "Traceback" not in proc.stderr and not out.exists()


# Issue 50: the edges the audit's mutants slipped through. Out of vocabulary exactly at a table's
# size; the program's standardization in float64 at magnitudes where float32 is visibly off; a
# failed export after its staging directory exists.


def _boundary_rows(df, manifest):
    """``df``'s first 6 rows with every id feature's value: rows 0-1 equal to its table size (the first
    id past the table), rows 2-3 the table's last row (size - 1), rows 4-5 as they were; ``tag`` lists
    row 0 [size], row 1 [2, size, size - 1], row 2 [size - 1], row 3 empty."""
    df = df.head(6)
    at = pl.int_range(pl.len())
    cols = []
    for col in manifest["single_features"]:
        size = int(manifest["tables"][col])
        cols.append(pl.when(at < 2).then(size).when(at < 4).then(size - 1).otherwise(pl.col(col)).alias(col))
    df = df.with_columns(cols)
    for col in manifest["multi_features"]:
        size = int(manifest["tables"][col])
        lists = [[size], [2, size, size - 1], [size - 1], []] + df[col].to_list()[4:]
        df = df.with_columns(pl.Series(col, lists, dtype=pl.List(pl.Int64)))
    return df


def _fallback_rows(df, manifest):
    """``_boundary_rows`` with every id written as the row the model must score it through: an id
    feature's out-of-vocabulary row 1, a string categorical's or hour's missing category 0."""
    from recsys_hdet.serving.predict import OOV_ROW

    at = pl.int_range(pl.len())
    cols = []
    for col in manifest["single_features"]:
        fallback = OOV_ROW if col in manifest["vocabularies"] else 0
        cols.append(pl.when(at < 2).then(fallback).otherwise(pl.col(col)).alias(col))
    df = df.with_columns(cols)
    for col in manifest["multi_features"]:
        size = int(manifest["tables"][col])
        df = df.with_columns(pl.Series(col, [[OOV_ROW], [2, OOV_ROW, size - 1]] + df[col].to_list()[2:],
                                       dtype=pl.List(pl.Int64)))
    return df


def test_an_id_equal_to_the_table_size_is_out_of_vocabulary_and_size_minus_one_is_itself(tiny_dataset):
    """to_model_rows (what predict scores): an id == its table's size is the first id without a row,
    so it becomes the out-of-vocabulary row (row 1) for an id feature and the missing category (0)
    for a string categorical or hour (code 0 is no category: codes 1.. are the values); size - 1 is
    the table's last real row and stays. The counts are exactly the rows at the boundary."""
    from recsys_hdet.components.dataset import DatasetMeta
    from recsys_hdet.serving.predict import OOV_ROW, to_model_rows

    meta = DatasetMeta.load(tiny_dataset)
    manifest = {  # what the export writes for a model of this data set (tables = the data set's)
        "single_features": meta.single_features, "multi_features": meta.multi_features,
        "tables": {n: int(s["vocab"]) for n, s in meta.sparse.items()},
        "vocabularies": {n: f"vocab/{n}.parquet" for n in meta.sparse
                         if os.path.isfile(os.path.join(tiny_dataset, "vocab", f"{n}.parquet"))},
    }
    strings = meta.source["string_vocabs"]
    categorical = [c for c in meta.single_features if c not in manifest["vocabularies"]]
    assert "hour" in categorical and set(strings) <= set(categorical) and "user_id" in manifest["vocabularies"]
    for col in strings:  # code = index + 1: 0, the fallback, is "missing", not a value
        assert manifest["tables"][col] == len(strings[col]) + 1, col
    assert manifest["tables"]["hour"] == 25  # hour + 1 for hours 0..23, 0 missing

    df = _boundary_rows(pl.read_parquet(os.path.join(tiny_dataset, f"day={max(meta.days)}.parquet")), manifest)
    fixed, unknown = to_model_rows(df, manifest)
    for col in meta.single_features:
        size = manifest["tables"][col]
        fallback = OOV_ROW if col in manifest["vocabularies"] else 0
        assert fixed[col].to_list() == [fallback, fallback, size - 1, size - 1] + df[col].to_list()[4:], col
        assert unknown[col] == 2, (col, unknown[col])
    for col in meta.multi_features:
        size = manifest["tables"][col]
        assert fixed[col].to_list()[:4] == [[OOV_ROW], [2, OOV_ROW, size - 1], [size - 1], []], col
        assert fixed[col].to_list()[4:] == df[col].to_list()[4:], col
        assert unknown[col] == 2, (col, unknown[col])
    assert fixed.to_dicts() == _fallback_rows(df, manifest).to_dicts()


def test_predict_scores_an_id_at_the_table_size_through_the_fallback_row(hdet_run, exported, tmp_path, tiny_dataset):
    """End to end with the exported model: rows whose every id equals its table's size score exactly
    as the same rows written with the fallback rows (id features' OOV row 1, hour's and the string
    categoricals' missing 0), counted 2 per feature; rows at size - 1 are scored through their own
    row, not the fallback."""
    from recsys_hdet.serving.predict import predict

    manifest = json.loads((exported / "manifest.json").read_text())
    day = pl.read_parquet(os.path.join(tiny_dataset, f"day={_held_out_day(hdet_run)}.parquet"))
    boundary = _boundary_rows(day, manifest)
    fallback = _fallback_rows(boundary, manifest)
    everything_fallback = fallback.with_columns(  # rows 2-3 too: what a wrong size - 1 would score as
        [pl.lit(fallback[c][0], dtype=pl.Int64).alias(c) for c in manifest["single_features"]]
        + [pl.Series(c, [[1]] * 4 + fallback[c].to_list()[4:], dtype=pl.List(pl.Int64)) for c in manifest["multi_features"]])
    scores = {}
    for name, df in (("boundary", boundary), ("fallback", fallback), ("everything_fallback", everything_fallback)):
        df.write_parquet(tmp_path / f"{name}.parquet")
        got = predict(str(exported), str(tmp_path / f"{name}.parquet"), str(tmp_path / f"{name}_scores.parquet"),
                      say=lambda line: None)
        scores[name] = (got, pl.read_parquet(tmp_path / f"{name}_scores.parquet"))
    counted = scores["boundary"][0]["unknown_ids"]
    assert counted == {c: 2 for c in manifest["single_features"] + manifest["multi_features"]}, counted
    assert scores["fallback"][0]["unknown_ids"] == {c: 0 for c in counted}
    a, b, c = (scores[n][1] for n in ("boundary", "fallback", "everything_fallback"))
    for t in TASKS:
        assert np.abs(a[f"pred_{t}"].to_numpy() - b[f"pred_{t}"].to_numpy()).max() < 1e-6, t
        assert (np.abs(a[f"pred_{t}"].to_numpy()[2:4] - c[f"pred_{t}"].to_numpy()[2:4]) > 1e-4).all(), t


def test_the_exported_program_standardizes_in_float64_as_the_loader_does(tiny_dataset, tmp_path):
    """Dense values of magnitude 1e7..1e9 a few units apart, the training days' mean of the same
    magnitude: float32 cannot hold the mean to a unit (its spacing there is 1 to 64), so a program
    standardizing in float32 is off by up to ~1 standard deviation. The exported program (saved and
    loaded) must score every row as the loader's float64 standardization (DenseNormalization.apply)
    fed to the same ranker with an identity standardization does, to 1e-6; float32 misses by ~2e-3."""
    import torch
    from hydra import compose, initialize_config_dir

    from conftest import REPO
    from recsys_hdet.components.dataset import DatasetMeta, DenseNormalization
    from recsys_hdet.models.ranker import build_model
    from recsys_hdet.serving.predict import model_inputs
    from recsys_hdet.serving.program import ServingRanker, export_program

    with initialize_config_dir(config_dir=os.path.join(REPO, "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["data=tiny"])
    meta = DatasetMeta.load(tiny_dataset)
    torch.manual_seed(0)
    ranker = build_model(cfg, meta, device="cpu").eval()
    rng = np.random.default_rng(0)
    d = len(meta.dense)
    mean = (rng.uniform(1e7, 1e9, d) + rng.uniform(0, 1, d)).tolist()
    std = rng.uniform(5, 50, d).tolist()
    raw = (np.asarray(mean) + np.asarray(std) * rng.standard_normal((256, d))).astype(np.float32)
    raw[::7, 3] = np.nan  # missing -> the mean, 0
    manifest = {"dense": list(meta.dense), "single_features": meta.single_features, "multi_features": meta.multi_features}
    df = pl.read_parquet(os.path.join(tiny_dataset, f"day={max(meta.days)}.parquet")).head(256).with_columns(
        [pl.Series(n, raw[:, j], dtype=pl.Float32) for j, n in enumerate(meta.dense)])
    dense, ids, values, offsets = model_inputs(df, manifest)

    torch.export.save(export_program(ServingRanker(ranker, meta.single_features, meta.multi_features, mean, std)),
                      tmp_path / "model.pt2")
    program = torch.export.load(tmp_path / "model.pt2").module()
    identity = ServingRanker(ranker, meta.single_features, meta.multi_features, [0.0] * d, [1.0] * d)
    loader = torch.from_numpy(DenseNormalization(list(meta.dense), mean, std, []).apply(dense.numpy().astype(np.float64)))
    with torch.no_grad():
        got = program(dense, ids, values, offsets).numpy()
        want = identity(loader, ids, values, offsets).numpy()
        # The float32 computation, to show the test can tell: the same rows standardized in float32.
        x32 = (dense - torch.tensor(mean, dtype=torch.float32)) / torch.tensor(std, dtype=torch.float32)
        float32 = identity(torch.nan_to_num(x32, nan=0.0), ids, values, offsets).numpy()
    assert np.isfinite(want).all() and want.shape == (256, len(cfg.tasks))
    assert np.abs(float32 - want).max() > 1e-4  # the magnitudes do separate float32 from float64
    assert np.abs(got - want).max() < 1e-6, np.abs(got - want).max()


@pytest.mark.parametrize("fails_at, existing", [("save", False), ("rename", False), ("save", True), ("rename", True)])
def test_an_export_that_fails_after_staging_leaves_nothing_behind(hdet_run, exported, tmp_path, tiny_dataset,
                                                                 monkeypatch, fails_at, existing):
    """export_run fails once its staging directory (``.model.tmp-*`` beside ``out``) exists: writing the
    program, or renaming the finished staging directory into place. The error reaches the caller and
    the parent directory holds what it held before: no staging directory, no half-written ``out``; an
    existing model replaced with overwrite=true is still there, unchanged."""
    import shutil

    import torch

    from recsys_hdet.serving import artifact

    parent = tmp_path / "models"
    out = parent / "model"
    if existing:
        shutil.copytree(exported, out)
    before = {p.relative_to(parent): p.read_bytes() for p in parent.rglob("*") if p.is_file()} if existing else {}
    seen = []

    class Planted(OSError):
        pass

    def staged(path):
        staging = [n for n in os.listdir(parent) if n.startswith(".model.tmp-") and not n.endswith(".old")]
        seen.append((staging, sorted(os.listdir(parent / staging[0])) if staging else None, os.path.dirname(path)))

    if fails_at == "save":
        def failing_save(program, f, *args, **kwargs):
            staged(str(f))
            raise Planted("disk full while writing the program")
        monkeypatch.setattr(torch.export, "save", failing_save)
    else:
        real_rename = os.rename

        def failing_rename(src, dst, *args, **kwargs):
            # the new model cannot be moved into place; the old one (renamed aside first) can be put back
            if os.path.abspath(dst) != str(out) or str(src).endswith(".old"):
                return real_rename(src, dst, *args, **kwargs)
            staged(str(src) + "/x")
            raise Planted("rename refused")
        monkeypatch.setattr(os, "rename", failing_rename)

    with pytest.raises(Planted):
        artifact.export_run(str(hdet_run), str(out), tiny_dataset, overwrite=existing)
    (staging, inside, where), = seen  # it failed once, with the staging directory there, writing into it
    assert len(staging) == 1 and where == str(parent / staging[0]), (staging, where)
    if fails_at == "rename":
        assert {"model.pt2", "manifest.json", "vocab"} <= set(inside), inside  # everything written but the rename
    assert sorted(os.listdir(parent)) == (["model"] if existing else []), os.listdir(parent)
    after = {p.relative_to(parent): p.read_bytes() for p in parent.rglob("*") if p.is_file()}
    assert after == before
