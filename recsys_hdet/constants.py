"""Names shared by the model, the trainer, the retraining job and the studies (defined once here).

Import-light (no torch), so the retraining job's ``status`` and the studies' reports can use it.
"""

from data_tools.schema import TASKS  # the label columns, in the order the model's heads use

# The optimizer's parameter groups: each gets its own LR (and, under HDET, its own spread).
PARAM_GROUPS = ("embedding", "transformer", "non_embedding", "no_decay")

__all__ = ["PARAM_GROUPS", "TASKS"]
