"""The wiring mutants each test is meant to catch, and a script that checks that it does.

    .venv/bin/python tests/mutants.py            # every mutant (about 12 minutes on 2 cores)
    .venv/bin/python tests/mutants.py A C        # some of them

For each mutant: the repository is copied to a scratch directory, one product line is replaced
(the line must be there exactly once, so a refactor that moves it makes this script say so instead
of silently testing nothing), and the named tests run there. A mutant is killed when they fail.
Not collected by pytest (the file name does not start with ``test_``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass(frozen=True)
class Mutant:
    key: str
    what: str
    path: str
    original: str
    mutated: str
    tests: Sequence[str]


MUTANTS = (
    Mutant("A", "plain runs never average their embedding replicas", "recsys_hdet/components/replicas.py",
           "if every and (step % every == 0 or step == self.total_steps):",
           "if False:",
           ["tests/test_train.py::test_two_process_run_writes_the_artifact_contract"]),
    Mutant("B", "HDET silently off at alpha = 0", "recsys_hdet/lr_control.py",
           "if bool(cfg.hdet.enabled):",
           "if bool(cfg.hdet.enabled) and float(cfg.hdet.alpha) > 0:",
           ["tests/test_hdet_train.py::test_alpha_zero_reproduces_the_plain_run_exactly"]),
    Mutant("C", "the rank's 'state is finite' flag ignored in the engine's sync", "recsys_hdet/hdet/engine.py",
           "mine = torch.tensor([signal, 1.0 if self.state_is_finite() else 0.0, train_window], dtype=torch.float64)",
           "mine = torch.tensor([signal, 1.0, train_window], dtype=torch.float64)",
           ["tests/test_hdet_engine.py::test_a_non_finite_replica_is_excluded_and_training_goes_on"]),
    Mutant("D", "dense state averaged over the replica group instead of the world", "recsys_hdet/components/replicas.py",
           "average_(self.dense_tensors, self.world_group, include)",
           "average_(self.dense_tensors, self.replica_group, include)",
           ["tests/test_replicas.py::test_embedding_replicas_average_to_bit_identical_copies"]),
    Mutant("E", "HDET's converge averages a non-finite rank in", "recsys_hdet/hdet/integration.py",
           "averager.average_dense(include=layout.rank not in excluded_ranks)",
           "averager.average_dense(include=True)",
           ["tests/test_hdet_train.py::test_a_non_finite_replica_in_a_real_run_is_excluded_restored_and_training_goes_on"]),
    Mutant("F", "DDP's own gradient all-reduce (one rank's NaN poisons all)", "recsys_hdet/distributed.py",
           "    dmp._dmp_wrapped_module.register_comm_hook(pgs.world, hooks[dense_gradients])\n",
           "",
           ["tests/test_hdet_train.py::test_a_non_finite_replica_in_a_real_run_is_excluded_restored_and_training_goes_on"]),
    Mutant("G", "warm-init noise never applied", "recsys_hdet/hdet/integration.py",
           "if cfg.trainer.get(\"warm_start\") and float(h.warm_init.nu) > 0:",
           "if False:",
           ["tests/test_hdet_train.py::test_warm_start_is_pretrained_on_first_use_and_each_replica_gets_its_own_noise"]),
    Mutant("H", "hdet.signal=serving ignored (the training loss scored)", "recsys_hdet/hdet/integration.py",
           "signal = weighted_task_mean(served if self.signal == \"serving\" else per_task, self.task_weights)",
           "signal = weighted_task_mean(per_task, self.task_weights)",
           ["tests/test_hdet_train.py::test_serving_signal_judges_replicas_by_the_served_loss"]),
    Mutant("I", "hdet.signal=probe ignored (the window training loss scored)", "recsys_hdet/hdet/engine.py",
           "signal = self.signal.measure(train_window)",
           "signal = train_window",
           ["tests/test_hdet_train.py::test_probe_signal_scores_every_replica_on_the_same_rows"]),
    Mutant("J", "data.train_exposure=standard ignored by the trainer (random-exposure rows trained on)",
           "recsys_hdet/trainer.py",
           "exposure=str(cfg.data.get(\"train_exposure\", \"all\")),",
           "exposure=\"all\",",
           ["tests/test_random_exposure.py::test_train_on_standard_exposure_then_evaluate_the_random_slice"]),
    Mutant("K", "the loader reads is_rand but keeps the random-exposure rows", "recsys_hdet/components/dataloader.py",
           "df = df.filter(standard_rows).drop(RAND_COLUMN)",
           "df = df.drop(RAND_COLUMN)",
           ["tests/test_random_exposure.py::test_standard_exposure_drops_the_random_rows_from_the_stream"]),
    Mutant("L", "the random-exposure slice scored on every held-out row", "recsys_hdet/evaluation/segments.py",
           "part = df.filter(pl.col(RAND_COLUMN) == 1)",
           "part = df",
           ["tests/test_random_exposure.py::test_random_exposure_slice_equals_the_metrics_of_the_is_rand_rows"]),
    Mutant("M", "the metrics.jsonl records never reach TensorBoard", "recsys_hdet/trainer.py",
           "tensorboard.log_metrics(record)",
           "pass",
           ["tests/test_train.py::test_tensorboard_scalars_are_the_metrics_records"]),
    Mutant("N", "the hdet.jsonl records never reach TensorBoard", "recsys_hdet/hdet/integration.py",
           "self._tensorboard.log_hdet(record)",
           "pass",
           ["tests/test_hdet_train.py::test_alpha_zero_reproduces_the_plain_run_exactly"]),
    Mutant("P", "HDET averages the embedding replicas only at syncs even with no spread", "recsys_hdet/hdet/integration.py",
           "elif scheduler.is_spread(\"embedding\"):",
           "else:",
           ["tests/test_hdet_train.py::test_alpha_zero_reproduces_the_plain_run_exactly"]),
    Mutant("Q", "a rollback restores nothing (the diverged state trains on)", "recsys_hdet/components/rollback.py",
           "self.model_state.load_state_dict(self.good)",
           "pass",
           ["tests/test_rollback.py::test_a_planted_divergence_is_rolled_back_and_the_run_completes"]),
    Mutant("R", "a rollback leaves the learning rates as they were", "recsys_hdet/components/rollback.py",
           "self.lr_control.cut_learning_rates(self.lr_factor)",
           "pass",
           ["tests/test_rollback.py::test_a_planted_divergence_is_rolled_back_and_the_run_completes"]),
    Mutant("S", "a branch starts from the checkpoint's data position with a fresh model", "recsys_hdet/trainer.py",
           "checkpoints.load(str(branch_from), pieces=(\"model\", \"loader\", \"rng\", \"loop\"))",
           "checkpoints.load(str(branch_from), pieces=(\"loader\", \"rng\", \"loop\"))",
           ["tests/test_branch.py::test_a_branch_at_the_same_lr_is_the_trunk_and_a_changed_lr_takes_over_at_the_branch"]),
    Mutant("O", "a resumed TensorBoard writer purges nothing (duplicated steps)", "recsys_hdet/components/tensorboard.py",
           "purge_step=int(start_step) + 1)",
           "purge_step=None)",
           ["tests/test_tensorboard.py::test_a_resumed_writer_continues_the_curves_without_duplicated_steps"]),
    Mutant("T", "anneal-then-probe does not restore the replica's state", "recsys_hdet/hdet/signals.py",
           "            self.state.load_state_dict(saved)\n",
           "            pass\n",
           ["tests/test_hdet_signals.py::test_anneal_then_probe_puts_the_state_and_the_generator_back_bit_for_bit"]),
    Mutant("U", "averaged-iterate probe scores the last iterate", "recsys_hdet/hdet/signals.py",
           "            for t, a in zip(self.tensors, self.tail.average):\n                t.copy_(a)\n",
           "            for t, a in zip(self.tensors, self.tail.average):\n                pass\n",
           ["tests/test_hdet_signals.py::test_each_new_signal_picks_the_higher_lr_where_the_last_iterate_picks_the_lower"]),
    Mutant("V", "score=effect moves by significance (no min_t gate, whole steps)", "recsys_hdet/hdet/statistics.py",
           "return -trust * min(max(relative / effect_scale, -1.0), 1.0)",
           "return -trust * math.copysign(1.0, relative)",
           ["tests/test_hdet_engine.py::test_effect_controller_rests_where_a_consistent_difference_is_negligible_and_regression_does_not"]),
    Mutant("W", "trainer.dense_gradients=local still all-reduces the dense gradients", "recsys_hdet/distributed.py",
           "hooks = {\"allreduce\": finite_mean_allreduce_hook, \"local\": local_gradient_hook}",
           "hooks = {\"allreduce\": finite_mean_allreduce_hook, \"local\": finite_mean_allreduce_hook}",
           ["tests/test_hdet_train.py::test_local_dense_gradients_train_apart_between_syncs_and_end_on_one_model"]),
    Mutant("X", "discounted credit probes every replica at the same point (its offset ignored)", "recsys_hdet/hdet/signals.py",
           "t.add_(z, alpha=self.width * u)",
           "t.add_(z, alpha=self.width)",
           ["tests/test_hdet_signals.py::test_discounted_credit_probes_the_averaged_iterate_moved_along_the_discounted_displacements"]),
    Mutant("Y", "a replica's offset read without the window's permutation", "recsys_hdet/hdet/engine.py",
           "return float(self.offsets[name][self.state[name].permutation[h.axis.replica_of_rank[self.rank]]])",
           "return float(self.offsets[name][h.axis.replica_of_rank[self.rank]])",
           ["tests/test_hdet_engine.py::test_my_offset_is_the_offset_of_the_value_this_rank_trains_with"]),
    Mutant("Z", "after explore-then-commit's hand-over the embedding replicas are never averaged", "recsys_hdet/hdet/integration.py",
           "return self.plain.embedding_sync_every",
           "return 0",
           ["tests/test_hdet_hand_over.py::test_after_the_commit_the_run_is_the_plain_run_branched_from_its_state_at_the_held_lrs"]),
    Mutant("AA", "the hand-over's plain control starts at the pass's start, not at the commit step", "recsys_hdet/hdet/integration.py",
           "self.plain.start_at(step)",
           "self.plain.start_at(0)",
           ["tests/test_hdet_hand_over.py::test_after_the_commit_the_run_is_the_plain_run_branched_from_its_state_at_the_held_lrs"]),    # Issue 50, serving: export, predict, the exported program.
    # (end of serving mutants)
    # Issue 50, operations and data: the gate, the registry, the settings check, row groups, conversion.
    # (end of operations and data mutants)
)


def check(m: Mutant, scratch_root: str) -> str:
    scratch = os.path.join(scratch_root, m.key)
    shutil.copytree(REPO, scratch, ignore=shutil.ignore_patterns(".venv", ".cache", "outputs", ".git", "__pycache__"))
    path = os.path.join(scratch, m.path)
    text = open(path).read()
    if text.count(m.original) != 1:
        return f"NOT APPLIED: the line occurs {text.count(m.original)} times in {m.path}"
    with open(path, "w") as f:
        f.write(text.replace(m.original, m.mutated))
    env = {**os.environ, "PYTHONPATH": scratch, "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-m", "slow or not slow", *m.tests],
                          cwd=scratch, env=env, capture_output=True, text=True)
    lines = proc.stdout.strip().splitlines() or ["(no output)"]
    # The first failure line pytest prints ("E   ..."), so the reader sees why the tests failed.
    why = next((l.strip() for l in lines if l.startswith("E ") and "Error" in l or l.startswith("E   assert")), "")
    verdict = "killed" if proc.returncode == 1 else "SURVIVED" if proc.returncode == 0 else f"error {proc.returncode}"
    return f"{verdict}: {lines[-1]}" + (f" ({why[:160]})" if why else "")


def main(keys: Sequence[str]) -> int:
    chosen = [m for m in MUTANTS if not keys or m.key in keys]
    survived = 0
    with tempfile.TemporaryDirectory() as scratch_root:
        for m in chosen:
            started = time.monotonic()
            result = check(m, scratch_root)
            seconds = time.monotonic() - started
            survived += not result.startswith("killed")
            print(f"{m.key} | {m.path} | {m.what} | {' '.join(t.split('::')[-1] for t in m.tests)} | {result} | {seconds:.0f} s",
                  flush=True)
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
