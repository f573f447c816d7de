"""HDET: Hyperparameter-Divergent Ensemble Training (see docs/method.md).

Modules: ``config`` (the one config dataclass; no torch), ``engine`` (replicas, syncs, the controller),
``signals``, ``scheduler`` (the one-cycle base HDET moves), ``integration`` / ``explored`` /
``warm_init`` (HDET built into a training job). Nothing is imported here, so that ``config`` loads
without the engine.
"""
