"""The two tiers of tests: which tests are slow, and the guard that keeps that rule honest.

Slow: a test that starts a process (subprocess.Popen, a multiprocessing Process: a fork Pool, torch's
spawn), trains a model, or takes seconds. conftest.py marks them `slow` at collection from the tables
below (a whole module, or single tests of a module by name), so `python -m pytest -m "not slow"` runs
the fast tier in minutes and `-m slow` the rest; a test already marked `@pytest.mark.slow` stays so.
The guard (an autouse fixture in conftest.py) fails a test of the fast tier that starts a process,
naming it: a new test that starts one must be added here (or marked), or it fails in the fast tier.
`GEODT_TIERS_RECORD=FILE` records such tests to FILE instead of failing them (to find the slow ones).
"""
from __future__ import annotations

import fnmatch
import multiprocessing.process
import os
import subprocess

import pytest

# Modules every test of which starts processes or trains (the real executor, calibration, benchmarks' runs).
SLOW_MODULES: frozenset[str] = frozenset({
    # the real executor: DiLoCo runs of processes on gloo, their faults, checkpoints and WAN
    "test_async_checkpoint.py", "test_async_real.py", "test_ckpt_keep.py", "test_checkpoint_cadence.py",
    "test_crashes.py", "test_faults.py", "test_quorum_checkpoint.py", "test_quorum_real.py",
    "test_real_adaptive.py", "test_real_continue_kinds.py", "test_real_continue_resume.py",
    "test_real_cpulimit.py", "test_real_diloco.py", "test_real_failures.py", "test_real_membership_faults.py",
    "test_real_nodeloss.py", "test_real_nodes.py", "test_real_runs.py", "test_real_sharding.py",
    "test_real_sync.py", "test_real_wan.py", "test_real_wan_failures.py", "test_real_wan_liveness.py",
    "test_streaming.py", "test_streaming_torchft.py", "test_validate.py", "test_forkserver_workers.py",
    # calibration: timed training steps, device and link processes
    "test_calibrate_cli.py", "test_calibrate_step.py", "test_calibrate_scenario.py", "test_calibration_journey.py",
    "test_step_compile.py",
    # a Dask cluster of processes
    "test_sweep_cluster.py",
})

# module -> test names (fnmatch patterns, without the [parameters]) that start processes or take seconds
# (found by GEODT_TIERS_RECORD over the fast tier, and by --durations: > 20 s each at load 15 on 2 cores)
SLOW_TESTS: dict[str, tuple[str, ...]] = {
    # a fresh interpreter: imports checked without torch (sys.modules['torch'] = None), or a command's process
    "test_help.py": ("test_help_reads_without_torch", "test_run_without_torch_still_says_what_to_install",
                     "test_help_names_no_code"),
    "test_install.py": ("test_core_commands_work_without_torch", "test_torch_commands_without_torch_say_which_extra"),
    "test_light_commands.py": ("test_the_blocker_blocks", "test_a_light_command_runs_without_trying_torch"),
    "test_calibrate_profiles.py": ("test_profiles_module_is_torch_free",),
    "test_catalog.py": ("test_import_does_not_pull_in_torch",),
    "test_paper.py": ("test_paper_modules_do_not_import_torch", "test_paper_command_rewrites_identically"),
    "test_bands.py": ("test_committed_bands_are_what_the_record_gives",
                      "test_simulate_prints_each_strategy_band_and_what_it_rests_on"),
    "test_bench_gpu.py": ("test_the_stages_share_one_budget",),
    "test_leave.py": ("test_a_child_that_leaves_keeps_its_status_and_its_queued_rows",),
    "test_profile_units.py": ("test_a_step_faster_than_any_device_is_refused_in_one_line",),
    "test_simulator_cli.py": ("test_geodt_command_runs", "test_simulator_never_imports_torch"),
    "test_user_files.py": ("test_stale_outputs_are_geodts_own_names_of_dead_writers_only",
                           "test_orphan_stages_beside_a_new_out_only_for_that_out",
                           "test_a_killed_sweeps_stage_goes_with_the_next_sweep_and_nothing_else"),
    "test_whole_lines.py": ("test_processes_printing_together_keep_their_lines_whole",),
    # a sweep's fork pool (--workers > 1), its resume across processes, the executor and validate for real
    "test_simulator_memory.py": ("test_strategy_b_ends_where_nothing_bounds_memory", "test_ten_thousand_nodes_plan"),
    "test_sweep.py": ("test_a_dataset_cut_short_is_redone_not_taken_as_finished",
                      "test_a_part_from_before_comparable_is_redone_on_resume", "test_an_interrupted_sweep_resumes",
                      "test_resume_refuses_other_arguments", "test_same_seed_same_csv_and_resume",
                      "test_two_identical_sweeps_at_once_both_finish_with_one_result"),
    "test_streaming_sim.py": ("test_the_executor_runs_the_fragments_plan_csv_carries",),
    "test_time_to_loss.py": ("test_validate_compares_loss_and_time_to_target",),
    # calibrations and training steps on this CPU
    "test_netcal_wan.py": ("test_a_node_with_a_cpu_quota_syncs_at_that_quota",
                           "test_shaped_calibration_measures_each_dtype_on_the_scenario_links",
                           "test_inner_steps_train_the_model_and_time_each_step"),
    "test_estimate.py": ("test_backward_moves_about_twice_the_forward_bytes_on_the_real_step",),
    "test_estimate_pipeline.py": ("test_the_fact_file_regenerates",),
    "test_model_constants.py": ("test_optimizer_bytes_equal_the_count_on_the_real_step",),
    # seconds of simulation: a journey of every command, the large-work limit, the mutation fuzzer's 250 examples
    "test_journeys.py": ("test_the_simulator_journey_keeps_every_output",),
    "test_first_day.py": ("test_large_work_asks_for_the_flag_and_the_flag_allows_it",),
    "test_fuzz.py": ("test_scenario_mutations",),
}

# Processes the libraries start for themselves: matplotlib lists the system's fonts with fc-list once,
# when it builds its font cache (a fresh install's first figure).
LIBRARY_COMMANDS = ("fc-list",)


def is_slow(module: str, test: str) -> bool:
    """Whether the rule puts test `test` (its name, parameters included) of file `module` in the slow tier."""
    if module in SLOW_MODULES:
        return True
    base = test.split("[")[0]
    return any(fnmatch.fnmatchcase(base, pattern) for pattern in SLOW_TESTS.get(module, ()))


def _command(args) -> str:
    argv = [args] if isinstance(args, str | bytes | os.PathLike) else list(args)
    return " ".join(str(a) for a in argv)[:200]


def guard_fast_tier(node, monkeypatch) -> None:
    """In a test of the fast tier, starting a process fails the test (or is recorded, GEODT_TIERS_RECORD)."""
    record = os.environ.get("GEODT_TIERS_RECORD")  # records every test that starts one, slow or not
    if node.get_closest_marker("slow") is not None and not record:
        return

    def caught(what: str) -> None:
        if record:
            with open(record, "a") as out:
                out.write(f"{node.nodeid}\t{what}\n")
            return
        # pytest.fail raises a BaseException: code under test that catches Exception cannot swallow it
        pytest.fail(f"{node.nodeid} is in the fast tier but starts a process ({what}): mark it slow in "
                    f"tests/tiers.py (SLOW_TESTS) or with @pytest.mark.slow", pytrace=False)

    popen_init = subprocess.Popen.__init__
    process_start = multiprocessing.process.BaseProcess.start

    def guarded_popen(self, args, *rest, **kwargs):
        command = _command(args)
        if not command.split(" ")[0].endswith(LIBRARY_COMMANDS):
            caught(f"subprocess: {command}")
        popen_init(self, args, *rest, **kwargs)

    def guarded_start(self):
        caught(f"multiprocessing: {type(self).__name__} {self.name}")
        process_start(self)

    monkeypatch.setattr(subprocess.Popen, "__init__", guarded_popen)
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", guarded_start)
