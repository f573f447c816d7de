"""Names shared by the model, the trainer, the retraining job and the studies (defined once here).

Import-light (no torch), so the retraining job's ``status`` and the studies' reports can use it.
"""

from data_tools.schema import TASKS  # the label columns, in the order the model's heads use

# The optimizer's parameter groups: each gets its own LR (and, under HDET, its own spread).
DENSE_GROUPS = ("transformer", "non_embedding", "no_decay")
PARAM_GROUPS = ("embedding", *DENSE_GROUPS)
# The two axes an LR search moves apart (the range tests, the studies' starts): the embedding tables, and the
# dense groups together (their ratios kept).
LR_AXES = {"embedding": ("embedding",), "dense": DENSE_GROUPS}

__all__ = ["DENSE_GROUPS", "LR_AXES", "PARAM_GROUPS", "TASKS"]
