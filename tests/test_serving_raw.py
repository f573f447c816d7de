"""The raw-request program (issue 49, item 5: ``export ... raw_program=true`` writes ``raw_model.pt2``).

A run trained on the raw KuaiRand-schema fixtures (tests/fixtures/kuairand, converted as the converter does)
is exported with the raw program. A scoring log and feature files hold the fixtures' rows (twice, a second
apart) and rows the model never saw: a new user, video, author, music, tab, tag and string values, KuaiRand's
-124 sentinel, a negative count and duration, a zero width, an empty tag list and author, a leap-day upload
date in YYYYMMDD form, an upload after the request, a user and a video with no feature row, a new day. The
request a serving system would send for those rows, scored by the program in a process that cannot import
torchrec, polars or the project, matches ``predict`` (convert through the model's vocabularies, then the
processed program) on every row and task within 1e-6. benchmarks/gpu_check.py's step 7 (the raw program moved
to a device, read with torch alone) runs with the device cpu on a request saved from the same raw files.
"""

import datetime as dt
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import polars as pl
import pytest

from conftest import REPO, run_torch_alone, run_train

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "kuairand")
LOGS = [os.path.join(FIXTURES, f) for f in ("log_standard_4_08_to_4_21_pure.csv", "log_standard_4_22_to_5_08_pure.csv",
                                            "log_random_4_22_to_5_08_pure.csv")]
USERS = os.path.join(FIXTURES, "user_features_pure.csv")
VIDEOS = os.path.join(FIXTURES, "video_features_basic_pure.csv")
TASKS = ["contribution", "like", "long_dwell"]


@pytest.fixture(scope="module")
def trained_and_exported(tmp_path_factory, data_cache):
    """A directory with the fixtures converted (``data/``), trained one short epoch on one rank (``run/``) and
    exported with the raw program (``model/``)."""
    from data_tools.convert import convert

    base = tmp_path_factory.mktemp("raw_serving")
    convert(LOGS, USERS, VIDEOS, str(base / "data"))
    proc = run_train(base / "run", "data=kuairand", f"data.root={base / 'data'}", "trainer.nproc=1",
                     "trainer.sharding_group_size=1", "data.batch_size=8", data_cache=data_cache)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    # the command, as a user exports: raw_program=true reaches the artifact
    proc = subprocess.run([sys.executable, "-m", "recsys_hdet.export", f"run_dir={base / 'run'}",
                           f"out={base / 'model'}", "raw_program=true"], capture_output=True, text=True)
    assert proc.returncode == 0 and os.path.isfile(base / "model" / "raw_model.pt2"), proc.stderr[-3000:]
    return base


def _strings(path):
    return pl.read_csv(path, infer_schema=False)


def _scoring_files(tmp_path):
    """A log of the fixtures' rows twice (the copy 1 s later) and the rows below, and the feature files with
    the new user and video rows. 1 of 118 log rows lacks a user row and 1 a video row (under the converter's 1%)."""
    log = pl.concat([_strings(f) for f in LOGS])
    later = log.with_columns((pl.col("time_ms").cast(pl.Int64) + 1000).cast(pl.String))
    zeros = {c: "0" for c in log.columns}
    extra = [  # user, video, date, hourmin, tab
        ("7", "8", "20220422", "2359", "9"),   # new user, new video (new author, music, tag, type), new tab
        ("8", "9", "20220601", "5", "0"),      # sentinels, a negative count; empty tags and author; a new day
        ("99", "0", "20220601", "1200", "1"),  # a user with no feature row
        ("0", "99", "20220601", "1201", "1"),  # a video with no feature row
        ("1", "1", "20220601", "0", "4"),      # known ids on a new day
        ("2", "8", "20220422", "1530", "2"),
    ]
    rows = [{**zeros, "user_id": u, "video_id": v, "date": d, "hourmin": h, "tab": t, "is_like": str(i % 2),
             "time_ms": str(1650600000000 + 7919 * i)} for i, (u, v, d, h, t) in enumerate(extra)]
    pl.concat([log, later, pl.DataFrame(rows)]).write_csv(tmp_path / "log.csv")
    users = _strings(USERS)
    blank = {c: None for c in users.columns}
    new_users = [{**blank, "user_id": "7", "user_active_degree": "super_active"},
                 {**blank, "user_id": "8", "user_active_degree": "high_active", "is_lowactive_period": "-124",
                  "is_live_streamer": "1", "is_video_author": "0", "follow_user_num": "-3",
                  "follow_user_num_range": "(0,10]", "fans_user_num": "2", "fans_user_num_range": "[1,10)",
                  "friend_user_num": "-124", "friend_user_num_range": "0", "register_days": "15",
                  "register_days_range": "8-14"}]
    pl.concat([users, pl.DataFrame(new_users, schema=users.schema)]).write_csv(tmp_path / "users.csv")
    videos = _strings(VIDEOS)
    new_videos = [
        {"video_id": "8", "author_id": "99", "video_type": "LIVE", "upload_dt": "20200229", "upload_type": "Web",
         "visible_status": "public", "video_duration": "-5", "server_width": "0", "server_height": "720",
         "music_id": "7777", "music_type": "9", "tag": "77,8"},
        {"video_id": "9", "author_id": None, "video_type": "NORMAL", "upload_dt": "2022-06-30",
         "upload_type": "ShortImport", "visible_status": "public", "video_duration": "1500.5",
         "server_width": "1080", "server_height": "720", "music_id": "4500", "music_type": "9", "tag": None},
    ]
    pl.concat([videos, pl.DataFrame(new_videos, schema=videos.schema)]).write_csv(tmp_path / "videos.csv")
    return tmp_path / "log.csv", tmp_path / "users.csv", tmp_path / "videos.csv"


# The program alone: every training-stack and project import refused (conftest.run_torch_alone).
_SCORE = r"""
model_dir, request, out = sys.argv[1:4]
manifest = json.load(open(f"{model_dir}/manifest.json"))
program = torch.export.load(f"{model_dir}/{manifest['raw_program']['file']}").module()
with torch.no_grad():
    torch.save(program(torch.load(request, weights_only=True)), out)
"""


def test_the_raw_program_scores_raw_requests_as_convert_and_predict_do(trained_and_exported, tmp_path):
    import torch

    from recsys_hdet.serving.predict import predict
    from recsys_hdet.serving.raw_request import raw_request

    model = trained_and_exported / "model"
    manifest = json.loads((model / "manifest.json").read_text())
    assert manifest["files"]["raw_model.pt2"]["bytes"] == os.path.getsize(model / "raw_model.pt2")
    log, users, videos = _scoring_files(tmp_path)
    request, keys = raw_request(log, users, videos, manifest)
    assert list(request) != list(manifest["raw_program"]["inputs"])  # another key order than the program's
    assert sorted(request) == sorted(manifest["raw_program"]["inputs"])
    torch.save(request, tmp_path / "request.pt")
    proc = run_torch_alone(_SCORE, model, tmp_path / "request.pt", tmp_path / "probs.pt")
    assert proc.returncode == 0 and "loaded []" in proc.stdout, proc.stderr[-3000:]
    probs = torch.load(tmp_path / "probs.pt").numpy()

    got = predict(str(model), str(log), str(tmp_path / "scores.parquet"), users=str(users), videos=str(videos),
                  say=lambda line: None)
    unseen = got["unknown_ids"]
    for feature in ("user_id", "video_id", "author_id", "music_id", "tab", "tag", "user_active_degree", "video_type"):
        assert unseen[feature] > 0, (feature, unseen)  # each kind of id the model never saw is scored
    raw = keys.with_columns([pl.Series(f"raw_{t}", probs[:, i]) for i, t in enumerate(TASKS)])
    joined = raw.join(pl.read_parquet(tmp_path / "scores.parquet"), on=["user_id_raw", "video_id_raw", "time_ms"])
    assert joined.height == raw.height == got["rows"] == 118
    worst = 0.0
    for t in TASKS:
        diff = np.abs(joined[f"raw_{t}"].to_numpy().astype(np.float64) - joined[f"pred_{t}"].to_numpy())
        worst = max(worst, float(diff.max()))
        assert joined[f"raw_{t}"].n_unique() > 20, t  # the rows score differently: the comparison can tell
    print(f"raw program vs convert + predict: max |difference| {worst:.3g}, {joined.height} rows x {len(TASKS)} tasks")
    assert worst < 1e-6, worst


# gpu_check's step 7 as the GPU machine runs it: torch alone (conftest.run_torch_alone), the device cpu here.
_STEP_7 = r"""
repo, model_dir = sys.argv[1:3]
sys.path.insert(0, repo)
from benchmarks.gpu_check import check_raw_program
print("step 7:", check_raw_program(model_dir, "cpu", seconds=0.2))
"""


@pytest.mark.slow  # the default run's budget (under 10 minutes on 2 cores): run by `make test-recovery` in CI
def test_gpu_check_runs_the_saved_raw_request_with_torch_alone_and_fails_on_a_difference(trained_and_exported,
                                                                                          tmp_path):
    """benchmarks/gpu_check.py step 7 with the device "cpu" (the GPU machine gives "cuda"): the request
    ``--save-raw-inputs`` writes beside the artifact (the raw log's rows of the held-out day, made a request by
    recsys_hdet.serving.raw_request) is read in a process that cannot import polars, torchrec or the project,
    scored by the moved program within 1e-5 of the saved probabilities, and timed (a positive rate). Saved
    probabilities 1e-3 off fail the step; an artifact without raw_model.pt2 is a SKIP."""
    import re

    import torch

    from benchmarks import gpu_check

    model = tmp_path / "model"
    shutil.copytree(trained_and_exported / "model", model)
    manifest = json.loads((model / "manifest.json").read_text())
    log, users, videos = _scoring_files(tmp_path)
    assert gpu_check.main(["--artifact", str(model), "--save-raw-inputs", str(log), str(users), str(videos)]) == 0
    saved = torch.load(model / gpu_check.RAW_INPUTS_FILE, weights_only=True)
    held_out = _strings(log).filter(pl.col("date") == manifest["eval_days"][-1]).height
    assert 0 < held_out < 118 and saved["probs"].shape == (held_out, len(TASKS))
    assert sorted(saved["request"]) == sorted(manifest["raw_program"]["inputs"])

    proc = run_torch_alone(_STEP_7, REPO, model)
    assert proc.returncode == 0 and "loaded []" in proc.stdout, proc.stderr[-3000:]
    found = re.search(r"max \|cpu - cpu\| (\S+) over (\d+) rows x 3 tasks .* forward rows/s: cpu ([\d,]+) at batch",
                      proc.stdout)
    assert found, proc.stdout
    assert float(found[1]) < 1e-5 and int(found[2]) == held_out and float(found[3].replace(",", "")) > 0, found[0]

    saved["probs"] += 1e-3
    torch.save(saved, model / gpu_check.RAW_INPUTS_FILE)
    with pytest.raises(RuntimeError, match="differ from the CPU's"):
        gpu_check.check_raw_program(str(model), "cpu", seconds=0.01)
    os.remove(model / "raw_model.pt2")
    assert gpu_check.check_raw_program(str(model), "cpu").startswith("SKIP")


def _rows(request, start, stop):
    """Rows start..stop-1 of a request (their tags with them)."""
    offsets = request["tag_offsets"]
    part = {k: v[start:stop] for k, v in request.items() if not k.startswith("tag_")}
    return {**part, "tag_values": request["tag_values"][int(offsets[start]): int(offsets[stop])],
            "tag_offsets": offsets[start: stop + 1] - offsets[start]}


def test_a_request_is_read_by_name_in_batches_from_one_row_and_one_without_an_input_is_refused(trained_and_exported,
                                                                                                 tmp_path):
    """Any key order; a row scores the same alone (one row: the size-1 batch the program must not refuse) as in
    a batch; a request missing an input is refused naming the inputs."""
    import torch

    from recsys_hdet.serving.raw_request import raw_request

    model = trained_and_exported / "model"
    manifest = json.loads((model / "manifest.json").read_text())
    request, _ = raw_request(*_scoring_files(tmp_path), manifest)
    program = torch.export.load(str(model / "raw_model.pt2")).module()
    with torch.no_grad():
        scores = program(request)
        backwards = program(dict(reversed(list(request.items()))))
        alone = torch.cat([program(_rows(request, i, i + 1)) for i in (0, 112, 113)])  # 113: no tags
        first_rows = program(_rows(request, 0, 5))
    assert int(request["tag_offsets"][114] - request["tag_offsets"][113]) == 0
    assert scores.shape == (118, len(TASKS)) and torch.equal(scores, backwards)
    assert torch.allclose(alone, scores[[0, 112, 113]], rtol=0, atol=1e-7)
    assert torch.allclose(first_rows, scores[:5], rtol=0, atol=1e-7)
    with pytest.raises(ValueError) as e:
        program({k: v for k, v in request.items() if k != "upload_dt"})
    assert "upload_dt" in str(e.value)


def test_the_processed_program_scores_one_row_as_in_a_batch(trained_and_exported):
    """model.pt2 too: before, its trace kept the guard batch != 1, and predict's last batch of one row failed."""
    import torch

    from recsys_hdet.serving.predict import model_inputs

    model = trained_and_exported / "model"
    manifest = json.loads((model / "manifest.json").read_text())
    day = pl.read_parquet(trained_and_exported / "data" / "day=20220422.parquet")
    program = torch.export.load(str(model / "model.pt2")).module()
    with torch.no_grad():
        batch = program(*model_inputs(day, manifest))
        alone = torch.cat([program(*model_inputs(day.slice(i, 1), manifest)) for i in range(3)])
    assert torch.allclose(alone, batch[:3], rtol=0, atol=1e-7)


def test_a_truncated_raw_program_is_named_before_anything_is_scored(trained_and_exported, tmp_path):
    from recsys_hdet.serving.manifest import ArtifactError, read_manifest

    model = tmp_path / "model"
    shutil.copytree(trained_and_exported / "model", model)
    data = (model / "raw_model.pt2").read_bytes()
    (model / "raw_model.pt2").write_bytes(data[: len(data) // 2])
    with pytest.raises(ArtifactError) as e:
        read_manifest(str(model))
    assert str(model / "raw_model.pt2") in str(e.value) and "bytes, the manifest records" in str(e.value)


def test_export_refuses_a_raw_program_without_a_vocabulary_and_writes_nothing(trained_and_exported, tmp_path):
    from recsys_hdet.serving.artifact import export_run
    from recsys_hdet.serving.manifest import ArtifactError

    data = tmp_path / "data"
    shutil.copytree(trained_and_exported / "data", data)
    os.remove(data / "vocab" / "tab.parquet")
    with pytest.raises(ArtifactError) as e:
        export_run(str(trained_and_exported / "run"), str(tmp_path / "model"), data_root=str(data), raw_program=True)
    assert str(data / "vocab" / "tab.parquet") in str(e.value) and "raw_program=true" in str(e.value)
    assert sorted(os.listdir(tmp_path)) == ["data"]


def test_day_numbers_are_the_calendars_and_impossible_dates_are_flagged():
    """The program's date arithmetic (YYYYMMDD -> days since 1970-01-01, int64) against Python's calendar on
    every day of 1899..2101 (leap days, century years) and on dates that are none (month 13, April 31,
    February 29 of 1900 and 2100, day 0, 0)."""
    import torch

    from recsys_hdet.serving.raw_program import _day_number

    days = [dt.date(1899, 1, 1) + dt.timedelta(d) for d in range((dt.date(2102, 1, 1) - dt.date(1899, 1, 1)).days)]
    ymd = torch.tensor([d.year * 10000 + d.month * 100 + d.day for d in days])
    number, valid = _day_number(ymd)
    assert valid.all() and number.tolist() == [(d - dt.date(1970, 1, 1)).days for d in days]
    _, valid = _day_number(torch.tensor([20221301, 20220431, 19000229, 21000229, 20220100, 0, -20220101]))
    assert not valid.any()
