"""``python -m pipelines.retrain_demo out=DIR``: the scheduled retraining loop, end to end, in minutes.

Into ``DIR/data`` (a small synthetic data set, ``conf/data/retrain_demo.yaml``) and ``DIR/registry``:

1. generate 3 days; the first retraining run (``create=true``: there is no registry yet) cold-starts on them and
   publishes version 1;
2. append the next day (same ground truth, drift continued); retrain: warm start from version 1,
   gate, publish version 2;
3. append a planted bad day (its labels shuffled across rows: the day passes every format check,
   but its labels say nothing about its features); retrain: the gate must reject it;
4. rerun: nothing to do.

Each step runs ``python -m pipelines.retrain`` as a scheduler would, with the default gate, and checks
its exit status;
the demo exits 1 if any step ends otherwise, then prints ``pipelines.retrain status``.
Options (key=value, :mod:`data_tools.cli_args`): ``out`` (required), ``nproc`` (training workers, default 2).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from typing import List, Sequence

import numpy as np
import polars as pl

from pipelines import retrain as R
from recsys_hdet.config import CONF_DIR
from data_tools.cli_args import opt, parse
from data_tools.exit_status import ExitStatus

DEMO_OVERRIDES = ("data=retrain_demo", "trainer.sharding_group_size=1", "trainer.periodic_checkpoint.every_steps=25")
# HDET's controller on the demo data (its keys are its own: each HDET form composes only the keys it reads).
DEMO_CONTROLLER = ("hdet=controller", "hdet.probe_rows=1024", "hdet.sync_every=10")


def shuffle_labels(root: str, day: str, seed: int = 0) -> None:
    """Plants a bad day: permutes the rows' labels (all tasks together) in the day file, atomically."""
    from data_tools.contract import LABEL_PREFIX
    from recsys_hdet.components.dataset import DatasetMeta

    meta = DatasetMeta.load(root)
    path = meta.day_path(day)
    df = pl.read_parquet(path)
    labels = [c for c in df.columns if c.startswith(LABEL_PREFIX)]
    order = np.random.default_rng(seed).permutation(df.height)
    df = df.with_columns(*[pl.Series(c, df[c].to_numpy()[order]) for c in labels])
    df.write_parquet(path + ".tmp")
    os.replace(path + ".tmp", path)


def retrain_command(registry: str, data: str, nproc: int, extra: Sequence[str] = (),
                    train_overrides: Sequence[str] = ()) -> List[str]:
    """The job's command on the demo data: ``extra`` job settings, ``train_overrides`` after the demo's."""
    overrides = ",".join(f"'{o}'" for o in (*DEMO_OVERRIDES, f"trainer.nproc={nproc}", *train_overrides))
    return [sys.executable, "-m", "pipelines.retrain", *extra, f"registry={registry}", f"data.root={data}",
            f"overrides=[{overrides}]"]


def step(title: str, cmd: List[str], expected: int) -> bool:
    print(f"\n=== {title}\n$ {' '.join(cmd)}", flush=True)
    t0 = time.time()
    code = subprocess.call(cmd)
    ok = code == expected
    print(f"=== exit status {code} ({'as expected' if ok else f'EXPECTED {expected}'}), {time.time() - t0:.0f} s",
          flush=True)
    return ok


@dataclasses.dataclass
class DemoArgs:
    out: str = opt("???", "the demo's directory: its data/ and registry/", "DIR")
    nproc: int = opt(2, "training workers", "N")


def main(argv: Sequence[str] | None = None) -> int:
    from omegaconf import OmegaConf

    from data_tools.contract import has_meta
    from data_tools.prepare import append_synthetic_days, ensure_dataset

    args = parse(argv, DemoArgs, "python -m pipelines.retrain_demo", __doc__)
    out = os.path.abspath(args.out)
    nproc = args.nproc
    data, registry = os.path.join(out, "data"), os.path.join(out, "registry")
    spec = OmegaConf.load(os.path.join(CONF_DIR, "data", "retrain_demo.yaml"))
    if not has_meta(data):
        ensure_dataset(data, OmegaConf.to_container(spec.generator), {})
    job = lambda *extra: retrain_command(registry, data, nproc, extra)
    ok = step("1. first run: create the registry, cold start on the first 3 days, publish version 1", job("create=true"),
              ExitStatus.OK)
    (new_day,) = append_synthetic_days(data, 1)
    print(f"\nappended day {new_day} to {data}")
    ok &= step(f"2. a new day ({new_day}): warm start, gate, publish version 2", job(), ExitStatus.OK)
    (bad_day,) = append_synthetic_days(data, 1)
    shuffle_labels(data, bad_day)
    print(f"\nappended day {bad_day} with its labels shuffled (a planted bad day)")
    ok &= step(f"3. the bad day ({bad_day}): the gate must reject it", job(), ExitStatus.REJECTED)
    ok &= step("4. a rerun: nothing to do", job(), ExitStatus.NOTHING_TO_DO)
    print()
    subprocess.call(retrain_command(registry, data, nproc, ["status"]))
    print(f"\nretrain_demo: {'every step ended as expected' if ok else 'A STEP DID NOT END AS EXPECTED'}; "
          f"registry in {registry}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
