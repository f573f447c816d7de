"""``python -m recsys_hdet.evaluate``: the offline evaluation's command (see
:mod:`recsys_hdet.evaluation.cli`)."""

import hydra
from omegaconf import DictConfig

from recsys_hdet.config import CONF_DIR, run_hydra_command
from recsys_hdet.evaluation import cli
from recsys_hdet.evaluation.cli import compare_runs, evaluate_run  # noqa: F401 (the importable API)


_composed = False


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="evaluate")
def main(cfg: DictConfig) -> None:
    global _composed
    _composed = True
    cli.main(cfg)


def usage() -> str:
    """``--help``: what the command does and every key (recsys_hdet.config.command_usage)."""
    from recsys_hdet.config import command_usage

    return command_usage(
        "python -m recsys_hdet.evaluate (recsys-hdet-evaluate): score a trained run on its held-out days and\n"
        "write eval.json, predictions.parquet and report.html into the run directory, or compare several runs\n"
        "in one report (docs/outputs.md). Exit status: 0 done, 2 bad arguments or input.",
        "usage: python -m recsys_hdet.evaluate run_dir=DIR [key=value ...]\n"
        "       python -m recsys_hdet.evaluate runs=[DIR,...] [out=DIR2] [key=value ...]", "evaluate")


def run() -> None:
    """``python -m recsys_hdet.evaluate`` and the ``recsys-hdet-evaluate`` command."""
    from data_tools.cli_args import DATA_ROOT_KEY

    run_hydra_command(main, lambda: _composed, usage, DATA_ROOT_KEY, config_name="evaluate")


if __name__ == "__main__":
    run()
