# Two commands a newcomer needs (see README): `make demo` and `make test`.
# Both create .venv at the repo root on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# DEVICE=cpu (default): fbgemm-gpu-cpu, torchrec without its CUDA-only metadata dependency.
# DEVICE=cuda: fbgemm-gpu and torchrec from pip (on a machine with CUDA 12 drivers).
DEVICE ?= cpu
ifeq ($(filter $(DEVICE),cpu cuda),)
$(error DEVICE=$(DEVICE): must be cpu or cuda)
endif
STAMP := $(VENV)/.installed-$(DEVICE)

.PHONY: setup demo test test-recovery test-all clean-data

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first and pinned, so nothing can pull a different (multi-GB CUDA) build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[$(DEVICE),test,mlflow]"
	test $(DEVICE) = cuda || $(PY) -m pip install -q --no-deps torchrec==1.8.0
	$(PY) -c "import torch, torchrec, fbgemm_gpu, polars, hydra; print('setup ok: torch', torch.__version__, 'torchrec', torchrec.__version__)"
	touch $(STAMP)

# One new run directory per demo, named as every run directory (recsys_hdet/run_dir.py, TIME_FORMAT); the
# evaluation writes report.html there and prints its path.
ifndef DEMO_RUN
DEMO_RUN := outputs/demo/$(shell date +%Y-%m-%d_%H-%M-%S)
endif
demo: $(STAMP)
	$(PY) -m recsys_hdet.train +experiment=demo run_dir=$(DEMO_RUN)
	$(PY) -m recsys_hdet.evaluate run_dir=$(DEMO_RUN)

# The import contracts (pyproject.toml [tool.importlinter], docs/architecture.md) first, then the tests.
test: $(STAMP)
	$(VENV)/bin/lint-imports
	$(PY) -m pytest -q

# The crash-recovery end-to-end runs (kill -9 and resume, rollback, the retraining job's kills) and the
# README's own path (convert, train, evaluate, export, predict, adopt, retrain; about 80 s alone) and the range
# test's hand-over (after the commit, the plain run bit for bit, its branches, its report; about 2 minutes) and its
# three-replica pooling; and, for the default run's 10-minute budget, the product guards that train a run of their
# own (the registry's checks, MLflow's store, adopt's settings, a study's --verify, the planted rollbacks, adopt
# freeze_lr's day): slow-marked, and run by CI beside `make test`.
test-recovery: $(STAMP)
	$(PY) -m pytest -q -m slow tests/test_resume.py \
		tests/test_retrain.py::test_three_days_a_bad_day_a_rerun_a_concurrent_job_and_kills \
		tests/test_readme_path.py \
		tests/test_hdet_range_test.py::test_after_the_commit_the_run_is_the_plain_run_at_the_committed_lrs_bit_for_bit \
		tests/test_hdet_range_test.py::test_three_replicas_sweep_the_embedding_twice_and_pool_it \
		tests/test_registry_checks.py tests/test_tracking.py tests/test_adopt_freeze_lr.py \
		tests/test_cli_args.py::test_adopt_holds_the_runs_settings_against_the_days_preset \
		tests/test_fair_comparison.py::test_verify_reproduces_a_tiny_recorded_run_and_reports_a_planted_one_ulp_change \
		tests/test_rollback.py::test_a_planted_divergence_is_rolled_back_and_the_run_completes \
		tests/test_rollback.py::test_a_planted_collapse_to_the_base_rate_is_rolled_back_and_the_run_completes \
		tests/test_serving_raw.py::test_gpu_check_runs_the_saved_raw_request_with_torch_alone_and_fails_on_a_difference \
		tests/test_lr_find.py::test_a_sweep_whose_model_turned_non_finite_logs_nan_and_suggests_from_its_finite_steps \
		tests/test_lr_recovery.py::test_the_committed_study_report_from_its_results_file

# Includes the slow end-to-end runs.
test-all: $(STAMP)
	$(PY) -m pytest -q -m "slow or not slow"

clean-data:
	rm -rf .cache/data
