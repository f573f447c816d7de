"""``python -m recsys_hdet.export run_dir=DIR out=MODEL_DIR [data.root=DIR] [raw_program=true]``
(``recsys-hdet-export``): a completed run as a serving artifact that loads with torch alone
(:mod:`recsys_hdet.serving.artifact`, docs/serving.md); ``raw_program=true`` adds ``raw_model.pt2``, the
program that reads a serving request's raw ids and values (:mod:`recsys_hdet.serving.raw_program`).
Exit status 0 done, 2 a run or setting that cannot be exported (named), nothing written."""

import sys

import hydra
from omegaconf import DictConfig

from recsys_hdet.config import CONF_DIR, run_hydra_command
from data_tools.exit_status import ExitStatus

_composed = False


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="export")
def main(cfg: DictConfig) -> None:
    global _composed
    _composed = True
    from recsys_hdet.config import require_given
    from recsys_hdet.distributed import quiet_library_warnings
    from recsys_hdet.serving.artifact import ArtifactError, export_run

    require_given(cfg, {"run_dir": "DIR", "out": "MODEL_DIR"})

    quiet_library_warnings()
    try:
        manifest = export_run(str(cfg.run_dir), str(cfg.out), cfg.data.root, bool(cfg.overwrite),
                              bool(cfg.raw_program))
    except ArtifactError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(ExitStatus.USAGE)
    from recsys_hdet.tracking import log_export

    log_export(manifest["run_dir"], str(cfg.out))  # into the run's MLflow run, when it has one
    print(f"exported {manifest['run_dir']} (step {manifest['checkpoint_steps']}, commit {manifest['commit']}) "
          f"to {cfg.out}: {manifest['program']}, "
          + (f"{manifest['raw_program']['file']}, " if "raw_program" in manifest else "")
          + f"{len(manifest['vocabularies'])} vocabularies, manifest.json", flush=True)


def run() -> None:
    from recsys_hdet.config import command_usage

    from data_tools.cli_args import DATA_ROOT_KEY

    run_hydra_command(main, lambda: _composed, lambda: command_usage(__doc__, "usage: python -m recsys_hdet.export key=value ...", "export"), DATA_ROOT_KEY, config_name="export")


if __name__ == "__main__":
    run()
