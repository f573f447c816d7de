"""HDET: Hyperparameter-Divergent Ensemble Training (docs/hdet.md, docs/method.md): the replicas a data-parallel
run has anyway explore each parameter group's learning rate inside the run.

Two forms, each a plug-in behind :mod:`recsys_hdet.lr_control` (the import contracts keep them apart):

- :mod:`recsys_hdet.hdet.range_test` (``hdet=enabled``): the LR range test on the replicas before the pass
  (``sweep``: the sweep and commit, model-agnostic; ``rule``: how a curve is read, shared with ``lr_find``;
  ``job``: the sweep in a training job, its restore and its record);
- :mod:`recsys_hdet.hdet.controller` (``hdet=controller``): the paper's spread, averaging and controller
  (``engine``, ``signals``, ``statistics``, ``scheduler``, ``rounds``; ``integration`` / ``explored`` /
  ``warm_init`` build it into a training job).

Shared: ``config`` (the ``hdet`` config group's dataclasses; no torch) and ``hparams`` (which replica holds which
value). Nothing is imported here, so that ``config`` loads without either form.
"""
