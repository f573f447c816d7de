"""``python -m recsys_hdet.predict model_dir=MODEL_DIR input=FILE out=scores.parquet`` (``recsys-hdet-predict``):
scores a processed day or a raw KuaiRand-schema log with an exported model
(:mod:`recsys_hdet.serving.predict`, docs/serving.md). Exit status 0 done, 2 bad input or arguments
(the file, row and column named; nothing written)."""

import sys

import hydra
from omegaconf import DictConfig

from recsys_hdet.config import CONF_DIR, run_hydra_command
from data_tools.exit_status import ExitStatus

_composed = False


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="predict")
def main(cfg: DictConfig) -> None:
    global _composed
    _composed = True
    from data_tools.errors import DataError
    from recsys_hdet.serving.artifact import ArtifactError
    from recsys_hdet.serving.predict import PredictError, predict

    try:
        predict(str(cfg.model_dir), str(cfg.input), str(cfg.out), cfg.users, cfg.videos, int(cfg.batch_size), cfg.day)
    except (ArtifactError, PredictError, DataError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(ExitStatus.USAGE)


def run() -> None:
    from recsys_hdet.config import yaml_usage

    run_hydra_command(main, lambda: _composed, lambda: yaml_usage("predict", __doc__))


if __name__ == "__main__":
    run()
