"""``python -m recsys_hdet.predict model_dir=MODEL_DIR data.root=DIR [day=YYYYMMDD] out=scores.parquet``, or
``... log=LOG.csv users=USERS.csv videos=VIDEOS.csv out=...`` (``recsys-hdet-predict``): scores a processed
data set's day (or ``log=`` a processed day file) or a raw KuaiRand-schema log with an exported model
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
    from recsys_hdet.config import require_given
    from recsys_hdet.serving.manifest import ArtifactError
    from recsys_hdet.serving.predict import PredictError, predict

    require_given(cfg, {"model_dir": "MODEL_DIR", "out": "SCORES.parquet"})
    try:
        predict(str(cfg.model_dir), rows_to_score(cfg), str(cfg.out), cfg.users, cfg.videos, int(cfg.batch_size),
                cfg.day)
    except (ArtifactError, PredictError, DataError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(ExitStatus.USAGE)


def rows_to_score(cfg: DictConfig) -> str:
    """``data.root`` (a processed data set's directory) or ``log`` (a file: a raw log, or a processed day file):
    exactly one (PredictError otherwise)."""
    import os

    from recsys_hdet.serving.predict import PredictError

    if (cfg.data.root is None) == (cfg.log is None):
        raise PredictError("give exactly one of data.root=DIR (a processed data set, with day=YYYYMMDD) or log=FILE "
                           "(a raw log CSV with users= and videos=, or a processed day file)")
    if cfg.data.root is not None and os.path.isfile(str(cfg.data.root)):
        raise PredictError(f"data.root={cfg.data.root}: a file; data.root is a processed data set's directory "
                           "(a file to score is log=FILE)")
    if cfg.log is not None and os.path.isdir(str(cfg.log)):
        raise PredictError(f"log={cfg.log}: a directory; a processed data set is data.root=DIR")
    return str(cfg.data.root if cfg.data.root is not None else cfg.log)


# The spellings before the one convention, each refused naming the new one.
OLD_SPELLINGS = {"input=": "data.root=DIR (a processed data set) or log=CSV (a raw log)"}


def run() -> None:
    from recsys_hdet.config import command_usage

    run_hydra_command(main, lambda: _composed, lambda: command_usage(__doc__, "usage: python -m recsys_hdet.predict key=value ...", "predict"), OLD_SPELLINGS, config_name="predict")


if __name__ == "__main__":
    run()
