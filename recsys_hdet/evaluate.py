"""``python -m recsys_hdet.evaluate``: the offline evaluation's command (see
:mod:`recsys_hdet.evaluation.cli`)."""

import hydra
from omegaconf import DictConfig

from recsys_hdet.config import CONF_DIR
from recsys_hdet.evaluation import cli
from recsys_hdet.evaluation.cli import compare_runs, evaluate_run  # noqa: F401 (the importable API)


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="evaluate")
def main(cfg: DictConfig) -> None:
    cli.main(cfg)


if __name__ == "__main__":
    main()
