"""recsys-hdet: multi-task feed ranking on TorchRec with HDET."""

# The typed config schema is registered with Hydra's ConfigStore on import, so that any composition
# of conf/ (the commands, a notebook, the tests) finds the schemas its defaults lists name.
from recsys_hdet import config_schema as _config_schema  # noqa: E402,F401
