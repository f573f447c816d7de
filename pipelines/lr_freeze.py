"""Frozen learning rates (``adopt freeze_lr=true``): the max LRs a run trained with the range test on the replicas
(``hdet=enabled``) committed become the job's ``overrides``, so that every later day trains plain at them
instead of sweeping again.

- :func:`committed_rates`: the commit the adopted run's final model records (its checkpoint meta's
  ``lr_commitment``, :data:`recsys_hdet.lr_control.COMMITMENT`); RetrainError naming the run and why when it
  records none (a plain run, HDET's controller, a run from before commits were recorded).
- :func:`frozen_overrides`: the run's overrides less its HDET and max-LR entries, plus ``hdet=disabled`` and
  ``optim.lr.<group>=<committed rate>`` for each group.
- :func:`frozen_config`: what the days are compared with (:func:`pipelines.settings.changed_settings`): the
  run's recorded config with the frozen rates and the ``hdet`` node the frozen overrides compose
  (:data:`FROZEN_CONFIG` in the version; the version's manifest records the freeze as ``lr_frozen``).

To sweep again the job's ``overrides`` go back to ``hdet=enabled`` (a changed setting: one day with
``allow_config_change=true``).
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Mapping, Sequence

from omegaconf import DictConfig, OmegaConf

from pipelines.day_plan import RetrainError
from recsys_hdet.run_dir import RunDir

FROZEN_CONFIG = "frozen_config.yaml"  # in the adopted version: the config the days are compared with
RANGE_TEST = "range_test"  # the commit's form (recsys_hdet.hdet.range_test.job.FORM)
REPLACED = ("hdet", "optim.lr")  # the override keys the freeze replaces (with their sub-keys)


def committed_rates(run) -> Dict[str, Any]:
    """The range-test commit of ``run`` (:func:`recsys_hdet.evaluation.load_run`'s): ``committed`` (the max LR per
    group it trained with) and ``start`` (the configured ones), read from its final model's meta. RetrainError
    saying why when it committed none (``adopt`` names the run)."""
    from recsys_hdet.components.model_checkpoint import META_FILE, read_meta
    from recsys_hdet.lr_control import COMMITMENT

    checkpoint = run.files.path(RunDir.CHECKPOINT)
    try:
        commitment = read_meta(checkpoint).get(COMMITMENT)
    except (OSError, ValueError) as e:
        raise RetrainError(f"freeze_lr=true: its final model's meta is unreadable "
                           f"({os.path.join(checkpoint, META_FILE)}: {type(e).__name__}: {e}); nothing was created")
    if not commitment or commitment.get("form") != RANGE_TEST:
        hdet = bool(OmegaConf.select(run.cfg, "hdet.enabled", default=False))
        why = ("it trained plain (hdet.enabled=false)" if not hdet else
               f"its commit is of another form ({commitment.get('form')!r})" if commitment else
               "it trained with HDET on but its final model records no range-test commit (HDET's controller, or "
               "a run from before commits were recorded)")
        raise RetrainError(f"freeze_lr=true freezes the max LRs a run trained with the range "
                           f"test (hdet=enabled) committed, and this run committed none: {why}; {COMMITMENT} missing "
                           f"from {os.path.join(checkpoint, META_FILE)}. Nothing was created: adopt it without "
                           "freeze_lr")
    return {"committed": {g: float(v) for g, v in commitment["committed"].items()},
            "start": {g: float(v) for g, v in (commitment.get(RANGE_TEST) or {}).get("start", {}).items()}}


def _replaced(override: Any) -> bool:
    key = str(override).lstrip("+~").split("=", 1)[0]
    return any(key == k or key.startswith(k + ".") for k in REPLACED)


def frozen_overrides(overrides: Sequence[Any], rates: Mapping[str, float]) -> List[str]:
    """``overrides`` less every entry of HDET (``hdet=enabled``, the sweep's settings) and of the max LRs, then
    ``hdet=disabled`` and each group's rate (``repr``: the float itself)."""
    return ([str(o) for o in overrides if not _replaced(o)] + ["hdet=disabled"]
            + [f"optim.lr.{g}={float(v)!r}" for g, v in sorted(rates.items())])


def frozen_config(recorded: DictConfig, training: DictConfig, rates: Mapping[str, float]) -> DictConfig:
    """The adopted run's ``recorded`` config as the days must train it: its max LRs the frozen ``rates``, its
    ``hdet`` node the one the frozen overrides compose (``training``: the job's ``experiment`` with them)."""
    out = OmegaConf.create(OmegaConf.to_container(recorded, resolve=True))
    out.hdet = OmegaConf.to_container(training.hdet, resolve=True)
    for g, v in rates.items():
        out.optim.lr[g] = float(v)
    return out


def freeze_record(run, commit: Mapping[str, Any], overrides_before: Sequence[Any], overrides: Sequence[str]) -> Dict:
    """The adopted version's manifest entry ``lr_frozen``: what was frozen, from which run, and the config file
    (:data:`FROZEN_CONFIG`) its days are compared with (:func:`pipelines.settings.changed_settings`)."""
    return {"from_run": run.run_dir, "rates": dict(commit["committed"]), "configured": dict(commit["start"]),
            "removed": [str(o) for o in overrides_before if _replaced(o)],
            "added": [o for o in overrides if o not in [str(b) for b in overrides_before]],
            "config": FROZEN_CONFIG}
