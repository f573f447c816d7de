"""The range test on the replicas (``hdet=enabled``; docs/hdet.md): ``sweep`` (each replica sweeps one axis, every
rank commits the same rates; knows no model), ``rule`` (how a range test's curve is read, shared with
``python -m recsys_hdet.lr_find``), ``check`` (whether a curve's answer is to be trusted on this model), ``job`` (the
sweep in a training job: the step-0 restore, the record, the commit reused on resume). Imports nothing of the
controller."""
