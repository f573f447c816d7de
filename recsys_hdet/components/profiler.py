"""A window of training steps recorded with ``torch.profiler`` (``trainer.profile``)."""

from __future__ import annotations

from typing import Optional

import torch

from recsys_hdet.run_dir import RunDir


class StepProfiler:
    """``trainer.profile.steps > 0``: rank 0 records steps [skip, skip + steps) with torch.profiler
    and writes ``profile.txt`` (operators by self CPU time) into the run directory. The profiler's
    own overhead slows those steps: not for throughput numbers."""

    def __init__(self, skip: int, steps: int, path: str) -> None:
        self.skip, self.steps, self.path = skip, steps, path
        self.prof: Optional[torch.profiler.profile] = None

    @classmethod
    def from_config(cls, spec, run_dir: str) -> Optional["StepProfiler"]:
        """``trainer.profile``: None when its ``steps`` is 0."""
        if int(spec.steps) <= 0:
            return None
        return cls(int(spec.skip), int(spec.steps), RunDir(run_dir).path(RunDir.PROFILE))

    def before_step(self, step: int) -> None:
        if step == self.skip:
            self.prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            self.prof.__enter__()
        elif step == self.skip + self.steps:
            self.close()

    def close(self) -> None:
        if self.prof is None:
            return
        self.prof.__exit__(None, None, None)
        table = self.prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40)
        with open(self.path, "w") as f:
            f.write(f"torch.profiler, rank 0, steps {self.skip}..{self.skip + self.steps - 1}\n{table}\n")
        self.prof = None
