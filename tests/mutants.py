"""The wiring mutants each test is meant to catch, and a script that checks that it does.

    .venv/bin/python tests/mutants.py            # every mutant (87; see docs/contributing.md for the last full run's time)
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
           "    dmp._dmp_wrapped_module.register_comm_hook(reduction, reduce_dense_gradients)\n",
           "",
           ["tests/test_hdet_train.py::test_a_non_finite_replica_in_a_real_run_is_excluded_restored_and_training_goes_on"]),
    Mutant("G", "warm-init noise never applied", "recsys_hdet/hdet/integration.py",
           "if cfg.trainer.warm_start and float(h.warm_init.nu) > 0:",
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
           "exposure=str(cfg.data.train_exposure),",
           "exposure=\"all\",",
           ["tests/test_random_exposure.py::test_train_on_standard_exposure_then_evaluate_the_random_slice"]),
    Mutant("K", "the loader reads is_rand but keeps the random-exposure rows", "recsys_hdet/components/day_arrays.py",
           "standard = df.select(standard_rows).to_series().to_numpy()",
           "standard = np.ones(df.height, dtype=bool)",
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
    Mutant("S1", "predict: an id equal to its table's size kept (one past the last row) instead of OOV",
           "recsys_hdet/serving/predict.py",
           "past = pl.col(col) >= rows",
           "past = pl.col(col) > rows",
           ["tests/test_serving.py::test_predict_scores_an_id_at_the_table_size_through_the_fallback_row"]),
    Mutant("S2", "predict: a tag equal to its table's size kept in the list instead of OOV",
           "recsys_hdet/serving/predict.py",
           "pl.when(pl.element() >= rows)",
           "pl.when(pl.element() > rows)",
           ["tests/test_serving.py::test_an_id_equal_to_the_table_size_is_out_of_vocabulary_and_size_minus_one_is_itself"]),
    Mutant("S3", "predict: a string categorical or hour past its table clipped to its last category",
           "recsys_hdet/serving/predict.py",
           "fallback = OOV_ROW if col in id_features else 0",
           "fallback = OOV_ROW if col in id_features else rows - 1",
           ["tests/test_serving.py::test_an_id_equal_to_the_table_size_is_out_of_vocabulary_and_size_minus_one_is_itself"]),
    Mutant("S4", "predict: every feature past its table through row 1 (a real category for hour and strings)",
           "recsys_hdet/serving/predict.py",
           "fallback = OOV_ROW if col in id_features else 0",
           "fallback = OOV_ROW",
           ["tests/test_serving.py::test_predict_scores_an_id_at_the_table_size_through_the_fallback_row"]),
    Mutant("S5", "predict: a tag list whose largest id equals the table size not counted as unknown",
           "recsys_hdet/serving/predict.py",
           "past = pl.col(col).list.max().fill_null(-1) >= rows",
           "past = pl.col(col).list.max().fill_null(-1) > rows",
           ["tests/test_serving.py::test_an_id_equal_to_the_table_size_is_out_of_vocabulary_and_size_minus_one_is_itself"]),
    Mutant("S6", "the exported program standardizes the dense values in float32", "recsys_hdet/serving/program.py",
           "x = (dense.to(torch.float64) - self.dense_mean) / self.dense_std",
           "x = (dense - self.dense_mean.to(torch.float32)) / self.dense_std.to(torch.float32)",
           ["tests/test_serving.py::test_the_exported_program_standardizes_in_float64_as_the_loader_does"]),
    Mutant("S7", "the exported program holds the dense means in float32", "recsys_hdet/serving/program.py",
           "self.register_buffer(\"dense_mean\", torch.tensor(list(dense_mean), dtype=torch.float64))",
           "self.register_buffer(\"dense_mean\", torch.tensor(list(dense_mean), dtype=torch.float32))",
           ["tests/test_serving.py::test_the_exported_program_standardizes_in_float64_as_the_loader_does"]),
    Mutant("S8", "a failed export leaves its staging directory (cleanup skipped)", "data_tools/fileio.py",
           "    except BaseException:\n        shutil.rmtree(stage, ignore_errors=True)\n        raise\n",
           "    except BaseException:\n        raise\n",
           ["tests/test_serving.py::test_an_export_that_fails_after_staging_leaves_nothing_behind"]),
    Mutant("S9", "a failed publish with overwrite=true leaves the old model renamed aside (not put back)",
           "data_tools/fileio.py",
           "        os.rename(aside, final)  # the old one back",
           "        pass  # the old one back",
           ["tests/test_serving.py::test_an_export_that_fails_after_staging_leaves_nothing_behind"]),
    Mutant("S10", "overwrite=true deletes the existing model before the new one is written",
           "recsys_hdet/serving/artifact.py",
           "    with staged_directory(out, replace=overwrite) as tmp:\n",
           "    if overwrite:\n        __import__('shutil').rmtree(out, ignore_errors=True)\n"
           "    with staged_directory(out, replace=overwrite) as tmp:\n",
           ["tests/test_serving.py::test_an_export_that_fails_after_staging_leaves_nothing_behind"]),
    # (end of serving mutants)
    # Issue 50, operations and data: the gate, the registry, the settings check, row groups, conversion.
    Mutant("P1", "the gate lets an NE equal to gate.max_ne through", "pipelines/gate.py",
           "if ne >= float(g.max_ne):",
           "if ne > float(g.max_ne):",
           ["tests/test_retrain.py::test_gate_thresholds_hold_exactly_at_their_boundaries"]),
    Mutant("P2", "the gate lets an undefined (None) calibration through", "pipelines/gate.py",
           "if cal is None or not low <= cal <= high:",
           "if cal is not None and not low <= cal <= high:",
           ["tests/test_retrain.py::test_gate_refuses_missing_or_non_finite_metrics_and_a_missing_summary"]),
    Mutant("P3", "the gate refuses an interval whose low end only reaches gate.ne_tolerance", "pipelines/gate.py",
           "return low is not None and math.isfinite(low) and low > tolerance",
           "return low is not None and math.isfinite(low) and low >= tolerance",
           ["tests/test_retrain.py::test_gate_thresholds_hold_exactly_at_their_boundaries"]),
    Mutant("P4", "the gate checks NE for None only (a NaN NE passes the max_ne test)", "pipelines/gate.py",
           "if ne is None or not math.isfinite(ne):",
           "if ne is None:",
           ["tests/test_retrain.py::test_gate_refuses_missing_or_non_finite_metrics_and_a_missing_summary"]),
    Mutant("P5", "the gate publishes when the run's summary is missing", "pipelines/gate.py",
           "if summary is None or summary.get(\"status\") != \"completed\":",
           "if summary is not None and summary.get(\"status\") != \"completed\":",
           ["tests/test_retrain.py::test_gate_refuses_missing_or_non_finite_metrics_and_a_missing_summary"]),
    Mutant("P6", "the gate's calibration bounds exclusive (a calibration at a bound refused)", "pipelines/gate.py",
           "if cal is None or not low <= cal <= high:",
           "if cal is None or not low < cal < high:",
           ["tests/test_retrain.py::test_gate_thresholds_hold_exactly_at_their_boundaries"]),
    Mutant("P7", "the registry unlinks current before making the new link", "pipelines/registry.py",
           "        os.symlink(os.path.join(\"versions\", version), tmp_link)\n",
           "        if os.path.lexists(self.current_link):\n            os.remove(self.current_link)\n"
           "        os.symlink(os.path.join(\"versions\", version), tmp_link)\n",
           ["tests/test_registry.py::test_a_repoint_that_fails_midway_leaves_current_on_the_old_complete_version"]),
    Mutant("P8", "the registry repoints current by remove, then rename (not one atomic replace)",
           "pipelines/registry.py",
           "            os.replace(tmp_link, self.current_link)\n",
           "            if os.path.lexists(self.current_link):\n                os.remove(self.current_link)\n"
           "            os.rename(tmp_link, self.current_link)\n",
           ["tests/test_registry.py::test_a_repoint_that_fails_midway_leaves_current_on_the_old_complete_version"]),
    Mutant("P9", "a failed repoint leaves its temporary link in the registry", "pipelines/registry.py",
           "            with suppress(OSError):\n                os.remove(tmp_link)\n",
           "            pass\n",
           ["tests/test_registry.py::test_a_repoint_that_fails_midway_leaves_current_on_the_old_complete_version"]),
    Mutant("P10", "the settings check leaves out optim.lr only when LRs are NOT carried (flipped)",
           "pipelines/settings.py",
           "skip = JOB_KEYS + ((\"optim.lr\",) if carry_lr else ())",
           "skip = JOB_KEYS + ((\"optim.lr\",) if not carry_lr else ())",
           ["tests/test_retrain.py::test_the_max_lrs_are_left_out_of_the_settings_check_only_when_they_are_carried"]),
    Mutant("P11", "the settings check always leaves out optim.lr (a changed max LR passes)", "pipelines/settings.py",
           "skip = JOB_KEYS + ((\"optim.lr\",) if carry_lr else ())",
           "skip = JOB_KEYS + (\"optim.lr\",)",
           ["tests/test_retrain.py::test_the_max_lrs_are_left_out_of_the_settings_check_only_when_they_are_carried"]),
    Mutant("P12", "the settings check leaves out every key that merely starts like a job key", "pipelines/settings.py",
           "return any(key == s or key.startswith(s + \".\") for s in skip)",
           "return any(key.startswith(s) for s in skip)",
           ["tests/test_retrain.py::test_the_max_lrs_are_left_out_of_the_settings_check_only_when_they_are_carried"]),
    Mutant("P13", "every day's row groups dealt in the same order (the day dropped from the seed)",
           "recsys_hdet/components/dataset.py",
           "rng = np.random.default_rng([int(seed), int(day), _DEAL_TAG])",
           "rng = np.random.default_rng([int(seed), _DEAL_TAG])",
           ["tests/test_row_groups.py::test_each_day_deals_its_row_groups_in_its_own_order_each_to_one_rank"]),
    Mutant("P14", "each rank draws its own deal order (the rank in the seed: groups read twice or never)",
           "recsys_hdet/components/dataset.py",
           "rng = np.random.default_rng([int(seed), int(day), _DEAL_TAG])",
           "rng = np.random.default_rng([int(seed), int(day), _DEAL_TAG, rank])",
           ["tests/test_row_groups.py::test_each_day_deals_its_row_groups_in_its_own_order_each_to_one_rank"]),
    Mutant("P15", "a rank does not read the shared row groups", "recsys_hdet/components/dataset.py",
           "groups = np.sort(np.concatenate([dealt[rank::world_size], shared]))",
           "groups = np.sort(dealt[rank::world_size])",
           ["tests/test_row_groups.py::test_each_day_deals_its_row_groups_in_its_own_order_each_to_one_rank"]),
    Mutant("P16", "the stream deals every day by its first day's date", "recsys_hdet/components/dataloader.py",
           "self.reserve_rows, self.seed, day, self.shuffle, rows=rows)",
           "self.reserve_rows, self.seed, self.days[0], self.shuffle, rows=rows)",
           ["tests/test_row_groups.py::test_the_stream_deals_each_day_by_its_own_date"]),
    Mutant("P17", "a day written whole ignores the configured row-group size", "data_tools/day_files.py",
           "day_query(date, day_date, None).sink_parquet(path, row_group_size=row_group_rows)",
           "day_query(date, day_date, None).sink_parquet(path)",
           ["tests/test_data_tools.py::test_both_ways_of_writing_a_day_cut_it_into_the_configured_row_groups[whole_day]"]),
    Mutant("P18", "a day sorted in time ranges ignores the configured row-group size", "data_tools/day_files.py",
           "pl.scan_parquet(parts).sink_parquet(path, row_group_size=row_group_rows)",
           "pl.scan_parquet(parts).sink_parquet(path)",
           ["tests/test_data_tools.py::test_both_ways_of_writing_a_day_cut_it_into_the_configured_row_groups[chunked]"]),
    Mutant("P19", "an appended day is written in the default row groups, not the data set's", "data_tools/append.py",
           "string_base=src_old.get(\"string_vocabs\"),\n"
           "                             row_group_rows=int((old.get(\"layout\") or {}).get(\"row_group_rows\", "
           "C.ROW_GROUP_ROWS)))",
           "string_base=src_old.get(\"string_vocabs\"))",
           ["tests/test_append_days.py::test_an_appended_day_is_cut_into_the_data_sets_row_groups"]),
    Mutant("P20", "meta.json records the default row-group size, not the one the files were written in",
           "data_tools/write_processed.py",
           "\"layout\": {\"version\": C.LAYOUT_VERSION, \"row_group_rows\": row_group_rows},",
           "\"layout\": {\"version\": C.LAYOUT_VERSION, \"row_group_rows\": C.ROW_GROUP_ROWS},",
           ["tests/test_data_tools.py::test_both_ways_of_writing_a_day_cut_it_into_the_configured_row_groups[whole_day]"]),
    Mutant("P21", "the gate publishes a completed run that was never scored (no metrics checked)", "pipelines/gate.py",
           "        if not reasons:  # a completed run must have been scored: nothing unchecked is published",
           "        if False:",
           ["tests/test_retrain.py::test_gate_refuses_missing_or_non_finite_metrics_and_a_missing_summary"]),
    # (end of operations and data mutants)
    # Issue 46: the range test on the replicas, the widened finder.
    Mutant("RT1", "the range test leaves the swept weights in place (no restore of the step-0 state)",
           "recsys_hdet/hdet/range_test_job.py", "        model_state.load_state_dict(saved)\n", "        pass\n",
           ["tests/test_hdet_range_test.py::test_after_the_commit_the_run_is_the_plain_run_at_the_committed_lrs_bit_for_bit"]),
    Mutant("RT2", "the pass starts where the sweep left the data stream", "recsys_hdet/hdet/range_test_job.py",
           "        stream.load_state_dict(position)\n", "        pass\n",
           ["tests/test_hdet_range_test.py::test_after_the_commit_the_run_is_the_plain_run_at_the_committed_lrs_bit_for_bit"]),
    Mutant("RT3", "every replica sweeps the embedding axis", "recsys_hdet/hdet/range_test.py",
           "        return names[replica % len(names)]", "        return names[0]",
           ["tests/test_hdet_range_test.py::test_each_axis_finds_its_planted_edge_with_the_other_axis_misset_100x"]),
    Mutant("RT4", "the other axis is held at its max LR, not at x low", "recsys_hdet/hdet/range_test.py",
           "rising if axis == swept else self.low", "rising if axis == swept else 1.0",
           ["tests/test_hdet_range_test.py::test_each_axis_finds_its_planted_edge_with_the_other_axis_misset_100x"]),
    Mutant("RT5", "an axis's curve pools every rank, not its replicas'", "recsys_hdet/hdet/range_test.py",
           "curves[ranks].double().mean(0)", "curves.double().mean(0)",
           ["tests/test_hdet_range_test.py::test_the_plan_sweeps_one_axis_per_replica_and_holds_the_other_low_and_pools_replicas"]),
    Mutant("RT6", "the committed LRs ignore the suggestion (the configured rates kept)", "recsys_hdet/hdet/range_test_job.py",
           "max_lrs[g] * axes[axis]['multiplier']", "max_lrs[g] * 1.0",
           ["tests/test_hdet_range_test.py::test_after_the_commit_the_run_is_the_plain_run_at_the_committed_lrs_bit_for_bit"]),
    Mutant("RT7", "lr_find's default sweep back to x0.01-x100", "recsys_hdet/config_schema.py",
           "    low: float = 0.001\n    high: float = 10000.0\n", "    low: float = 0.01\n    high: float = 100.0\n",
           ["tests/test_lr_find.py::test_the_widened_default_range_suggests_above_x10_where_the_loss_still_falls_at_x100"]),
    Mutant("RT8", "range_edge flags only the exact end, not a step from it", "recsys_hdet/components/range_rule.py",
           "    step_ratio = (high / low) ** (within_steps / (sweep_steps - 1))", "    step_ratio = 1.0",
           ["tests/test_lr_find.py::test_the_suggestion_is_a_tenth_of_the_multiplier_the_best_loss_was_trained_at"]),
    Mutant("RT9", "the sweep's dense gradients averaged over the world (the replicas' sweeps share a gradient)",
           "recsys_hdet/hdet/range_test_job.py", "within(handles.sharding_group)", "within(handles.process_group)",
           ["tests/test_hdet_range_test.py::test_after_the_commit_the_run_is_the_plain_run_at_the_committed_lrs_bit_for_bit"]),
    Mutant("RT10", "every axis read with fastai's 10 (the per-axis divisors ignored)", "recsys_hdet/hdet/range_test.py",
           "divisor = float(plan.divisors[axis])", "divisor = 10.0",
           ["tests/test_hdet_range_test.py::test_each_axis_is_read_with_its_own_divisor"]),
    Mutant("RT11", "the product's dense divisor back to fastai's 10 (the studies pin 20)", "recsys_hdet/hdet/config.py",
           '"dense": 20.0}', '"dense": 10.0}',
           ["tests/test_lr_recovery.py::test_the_range_test_contender_and_the_widened_finder_sweep_the_product_s_default_range"]),
    Mutant("SP1", "a run recorded while hdet=enabled loaded the controller keeps that spelling (a resumed study refuses "
           "every finished controller run)", "studies/results.py",
           '    return ["hdet=controller" if o == "hdet=enabled" else o for o in overrides]', "    return list(overrides)",
           ["tests/test_study_results.py::test_a_run_recorded_while_hdet_enabled_loaded_the_controller_compares_as_hdet_controller"]),
    Mutant("CL1", "the resource tracker started under train.log's pipes (every run's command ends 10 s late)",
           "recsys_hdet/components/console_log.py", "        resource_tracker.ensure_running()\n", "",
           ["tests/test_train.py::test_the_console_log_closes_without_waiting_on_the_resource_tracker"]),
    Mutant("J1", "the retraining job trains without checking the day files first", "pipelines/retrain.py",
           "                check_inputs(root)  # every file the days' runs will read, before anything trains\n", "",
           ["tests/test_retrain_checks.py::test_a_damaged_input_file_ends_the_job_as_bad_input_before_any_worker_starts"]),
    Mutant("J2", "the dry run skips the day's setup (its settings comparison)", "pipelines/retrain.py",
           "        for note in setup_day(cfg, registry, plans[0], all_days, current=current).notes:\n", "        for note in []:\n",
           ["tests/test_retrain_checks.py::test_the_dry_run_exits_as_the_run_does_and_an_execution_key_is_noted"]),
    Mutant("RG1", "a version's manifest lists none of its files (nothing to verify)", "pipelines/registry.py",
           "FILES: dict(sorted(files.items()))}", "FILES: {}}",
           ["tests/test_registry_checks.py::test_a_damaged_checkpoint_shard_of_the_current_version_is_refused_before_any_worker_starts[truncated]"]),
    Mutant("RG2", "the job trains without verifying the files of the version it warm-starts from", "pipelines/retrain.py",
           "    if current is not None and not plans[0].cold_start:\n", "    if False:\n",
           ["tests/test_registry_checks.py::test_a_damaged_checkpoint_shard_of_the_current_version_is_refused_before_any_worker_starts[truncated]"]),
    Mutant("RG3", "a file is verified by its size only (one altered byte of the same size passes)",
           "recsys_hdet/serving/manifest.py",
           'if file_record(path)["sha256"] != recorded.get("sha256"):', "if False:",
           ["tests/test_registry_checks.py::test_a_damaged_checkpoint_shard_of_the_current_version_is_refused_before_any_worker_starts[one-byte-altered]"]),
    Mutant("RG4", "an older version's damaged manifest stops the job (its trained days read from it)", "pipelines/day_plan.py",
           "manifest = registry.intact_manifest(v)", "manifest = registry.manifest(v)",
           ["tests/test_registry_checks.py::test_an_older_versions_truncated_manifest_never_stops_the_job"]),
    Mutant("RG5", "a gap in the days trains by default", "pipelines/day_plan.py",
           "    if not allow:\n", "    if False:\n",
           ["tests/test_registry_checks.py::test_a_day_missing_before_the_new_one_is_refused_unless_allowed"]),
    Mutant("RG6", "current is repointed at a damaged version", "pipelines/registry.py",
           "damage = self.verify(version)", "damage = None",
           ["tests/test_registry_checks.py::test_a_damaged_checkpoint_shard_of_the_current_version_is_refused_before_any_worker_starts[truncated]"]),
    Mutant("RG7", "the job cold-starts a new registry on a typo'd path", "pipelines/retrain.py",
           "if not registry.exists() and not cfg.create:", "if False:",
           ["tests/test_retrain.py::test_dry_run_prints_the_plan_and_changes_nothing"]),
    Mutant("RG8", "rollback takes the lock on a typo'd path (creating it)", "pipelines/registry_commands.py",
           "if not registry.exists():  # before the lock", "if False:  # before the lock",
           ["tests/test_retrain.py::test_command_line_errors_and_statuses"]),
    Mutant("RG9", "the daily settings check skips an adopted run of another preset (its config never compared)",
           "pipelines/settings.py",
           'comparable = parent.get("experiment") == experiment or parent.get("adopted_from") is not None',
           'comparable = parent.get("experiment") == experiment',
           ["tests/test_retrain_checks.py::test_an_adopted_run_of_another_preset_is_compared_key_by_key"]),
    Mutant("W1", "the raw program maps an unseen id to the missing row", "recsys_hdet/serving/raw_program.py",
           "torch.full_like(raw, OOV_ROW))", "torch.full_like(raw, MISSING_ROW))",
           ["tests/test_serving_raw.py::test_the_raw_program_scores_raw_requests_as_convert_and_predict_do"]),
    Mutant("L1", "an interval without a finite step logged as loss 0.0", "recsys_hdet/trainer.py",
           "stats[:num_tasks] / good_steps  #", "stats[:num_tasks] / good_steps.clamp(min=1)  #",
           ["tests/test_lr_find.py::test_a_sweep_whose_model_turned_non_finite_logs_nan_and_suggests_from_its_finite_steps"]),
    Mutant("V1", "the converter keeps the last of a repeated video's rows", "data_tools/feature_tables.py",
           '.unique(subset="video_id", keep="first", maintain_order=True)', '.unique(subset="video_id", keep="last", maintain_order=True)',
           ["tests/test_convert_catalog.py::test_a_repeated_video_keeps_its_first_row_wherever_it_is_in_the_file"]),
    Mutant("C1", "between two training-metric computations the collapse check sees no NE (a sweep runs on past a "
           "collapse)", "recsys_hdet/trainer.py",
           "ne_all = {t: entropy_ne(float(mean[i]), float(positives[i]), rows)",
           "ne_all = {t: math.nan + 0 * entropy_ne(float(mean[i]), float(positives[i]), rows)",
           ["tests/test_rollback.py::test_a_planted_collapse_to_the_base_rate_is_rolled_back_and_the_run_completes"]),
    Mutant("C2", "the interval's positive counts are never restarted (the collapse check's rate is the pass's)",
           "recsys_hdet/components/train_metrics.py",
           "out, self._positives = self._positives.cpu(), torch.zeros_like(self._positives)",
           "out = self._positives.cpu()",
           ["tests/test_train_metrics.py::test_interval_metrics_are_those_of_every_rank_s_rows_since_the_last_compute"]),
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
