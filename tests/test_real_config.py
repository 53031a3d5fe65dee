"""The executor's input files: plan.csv and the scenario sections it reads; bad input exits 2."""
from __future__ import annotations

from pathlib import Path

import pytest

from real.core.config import ConfigError, load_plan, load_run_spec
from real.process.cli import main as real_main

PLAN = """strategy,node,gpus,batch_size,local_steps,step_s,tokens_per_round,comm_s
baseline,a,1,2,3,0.05,192,0.01
baseline,b,1,2,4,0.05,256,0.01
"""
SCENARIO = """name = "t"
seed = 1
nodes = [{ name = "a" }]
[model]
preset = "tiny"
seq_len = 32
dtype = "fp32"
[training]
rounds = 2
local_steps = 3
batch_size = 2
[network]
bandwidth_gbps = 1.0
[diloco]
inner_lr = 1e-3
warmup_steps = 2
averaging = "tokens"
"""


def write(tmp_path: Path, plan: str = PLAN, scenario: str = SCENARIO) -> tuple[Path, Path]:
    (tmp_path / "plan.csv").write_text(plan)
    (tmp_path / "scenario.toml").write_text(scenario)
    return tmp_path / "plan.csv", tmp_path / "scenario.toml"


def test_reads_plan_and_scenario(tmp_path):
    plan_path, scenario_path = write(tmp_path)
    plan = load_plan(plan_path)
    assert plan.strategy == "baseline" and plan.comm_s == 0.01
    assert [(n.node, n.local_steps, n.tokens_per_round(plan.seq_len)) for n in plan.nodes] == [("a", 3, 192), ("b", 4, 256)]
    assert (plan.seq_len, plan.rounds, plan.collective, plan.payload_dtype) == (32, None, None, None)
    spec = load_run_spec(scenario_path)
    assert (spec.seed, spec.training.rounds, spec.model.seq_len) == (1, 2, 32)
    assert spec.diloco.averaging == "tokens" and spec.diloco.outer_lr == 0.7  # default kept
    assert spec.diloco.betas == (0.9, 0.95)


@pytest.mark.parametrize("edit, message", [
    (("averaging = \"tokens\"", "averaging = \"mean\""), "diloco.averaging: expected one of uniform, tokens"),
    (("warmup_steps = 2", "warmup_steps = 2\nwarmpu = 3"), "diloco.warmpu: unknown key"),
    (("rounds = 2", "rounds = 0"), "training.rounds: expected a positive integer"),
    (("dtype = \"fp32\"", "dtype = \"fp8\""), "model.dtype: expected one of bf16, fp16, fp32"),
    (("seq_len = 32", "seq_lne = 32"), "model.seq_lne: unknown key"),
    (("inner_lr = 1e-3", "inner_lr = -1.0"), "diloco.inner_lr: expected a positive finite number"),
])
def test_bad_scenario_names_file_and_key(tmp_path, edit, message):
    _, scenario_path = write(tmp_path, scenario=SCENARIO.replace(*edit))
    with pytest.raises(ConfigError) as err:
        load_run_spec(scenario_path)
    assert str(err.value).startswith(f"{scenario_path}: {message}")


@pytest.mark.parametrize("plan, message", [
    (PLAN.replace(",comm_s", ""), "column comm_s: missing"),
    (PLAN.replace("baseline,b,1,2,4", "baseline,b,1,two,4"), "line 3: batch_size: expected a number"),
    (PLAN.replace("baseline,b,1,2,4", "baseline,b,1,2,0"), "line 3: local_steps: expected an integer >= 1"),
    (PLAN.replace("0.05,256,0.01", "0.05,256,0.02"), "comm_s: expected the same value on every row"),
    (PLAN.replace("baseline,b", "C,b"), "strategy: expected the same value on every row"),
    (PLAN.replace("baseline,b", "baseline,a"), "node: expected unique node names"),
    (PLAN.replace("comm_s\n", "comm_s,sharding\n").replace("0.01\n", "0.01,auto\n"),
     "line 2: sharding: expected one of none, zero1, zero2, fsdp, got 'auto'"),
    (PLAN.replace("comm_s\n", "comm_s,activation_checkpointing\n").replace("0.01\n", "0.01,selective\n"),
     "line 2: activation_checkpointing: expected one of none, full"),
    (PLAN.replace("comm_s\n", "comm_s,outer_state\n").replace("0.01\nbaseline", "0.01,cpu\nbaseline")
     .replace("0.01\n", "0.01,device\n"), "outer_state: expected the same value on every row"),
])


def test_bad_plan_names_file_and_column(tmp_path, plan, message):
    plan_path, _ = write(tmp_path, plan=plan)
    with pytest.raises(ConfigError) as err:
        load_plan(plan_path)
    assert str(err.value).startswith(f"{plan_path}: {message}")


def test_cli_bad_input_exits_2_with_one_line_and_writes_nothing(tmp_path, capsys):
    plan_path, scenario_path = write(tmp_path, plan=PLAN.replace("192", "190"))
    out = tmp_path / "out"
    assert real_main(["--plan", str(plan_path), "--scenario", str(scenario_path), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "line 2: tokens_per_round: expected local_steps × batch_size × gpus × seq_len = 192" in err
    assert not out.exists()


def test_cli_missing_data_file_exits_2(tmp_path, capsys):
    plan_path, scenario_path = write(tmp_path)
    out = tmp_path / "out"
    code = real_main(["--plan", str(plan_path), "--scenario", str(scenario_path), "--out", str(out),
                      "--data", str(tmp_path / "nope.txt")])
    assert code == 2
    assert "nope.txt: data file not found" in capsys.readouterr().err
    assert not out.exists()


def test_empty_plan_cells_take_the_scenarios_network_values(tmp_path):
    from real.process.launch import check_inputs
    from real.process.worker import ExecOptions

    scenario = SCENARIO.replace("bandwidth_gbps = 1.0", 'bandwidth_gbps = 1.0\ncollective = "partitioned"\n'
                                                      'payload_dtype = "fp16"')
    plan_path, scenario_path = write(tmp_path, scenario=scenario)
    spec, plan = check_inputs(plan_path, scenario_path, ExecOptions(out_dir=str(tmp_path / "o")))
    assert (plan.rounds, plan.collective, plan.payload_dtype, spec.training.rounds) == (2, "partitioned", "fp16", 2)
    # The plan's own values win over the scenario's (sync-ddp's rounds, network-aware's payload).
    (tmp_path / "plan.csv").write_text(PLAN.replace("comm_s\n", "comm_s,rounds,payload_dtype\n")
                                       .replace("0.01\n", "0.01,5,int8\n"))
    spec, plan = check_inputs(plan_path, scenario_path, ExecOptions(out_dir=str(tmp_path / "o")))
    # the run's rounds are its plan's; the scenario's [training] rounds stay as written
    assert (plan.rounds, plan.collective, plan.payload_dtype, spec.training.rounds) == (5, "partitioned", "int8", 2)


def test_config_reads_toml_with_tomli_on_python_3_10(monkeypatch, tmp_path):
    import importlib
    import sys

    pytest.importorskip("tomli")
    import formats.toml
    import real.core.config

    monkeypatch.setattr(sys, "version_info", (3, 10, 0))
    monkeypatch.setitem(sys.modules, "tomllib", None)  # as on 3.10: no such module
    try:
        assert importlib.reload(formats.toml).tomllib.__name__ == "tomli"
        module = importlib.reload(real.core.config)
        assert module.tomllib.__name__ == "tomli"
        _, scenario_path = write(tmp_path)
        assert module.load_run_spec(scenario_path).training.rounds == 2
    finally:
        monkeypatch.undo()
        importlib.reload(formats.toml)
        importlib.reload(real.core.config)


def test_plan_round_trips_through_the_shared_schema(tmp_path):
    from formats.plan import NodePlan, Plan
    from formats.plan import load_plan as load_schema

    plan = Plan(strategy="C", seq_len=32, comm_s=0.5, rounds=4, collective="partitioned", payload_dtype="int8",
                outer_state="device",
                nodes=(NodePlan("a", 2, 3, 4, 0.1, link_gbps=0.5, cpu_cores=(0, 1), cpu_quota=0.4, sharding="fsdp",
                                activation_checkpointing="full"),
                       NodePlan("b", 1, 2, 5, 0.2, link_gbps=1.0, sharding="none", activation_checkpointing="none")))
    plan.to_frame().to_csv(tmp_path / "plan.csv", index=False)
    assert load_schema(tmp_path / "plan.csv") == plan
    with pytest.raises(ValueError, match="batch_size: expected an integer >= 1"):
        NodePlan("a", 1, 0, 1, 0.1)


def test_plan_layout_cells_resolve_to_none_and_the_scenarios_outer_state(tmp_path):
    """Empty sharding / activation_checkpointing cells mean none; outer_state comes from [diloco]."""
    from real.process.launch import check_inputs
    from real.process.worker import ExecOptions

    scenario = SCENARIO.replace("[training]", "[training]\nsharding = \"auto\"").replace(
        'averaging = "tokens"', 'averaging = "tokens"\nouter_state = "cpu"')
    plan_path, scenario_path = write(tmp_path, scenario=scenario)
    _, plan = check_inputs(plan_path, scenario_path, ExecOptions(out_dir=str(tmp_path / "o")))
    assert [(n.sharding, n.activation_checkpointing) for n in plan.nodes] == [("none", "none")] * 2
    assert plan.outer_state == "cpu"


def test_executor_refuses_a_layout_it_does_not_run(tmp_path):
    """A sharded node runs classic DiLoCo rounds only (real/core/sharding.py); sync-ddp is refused."""
    from real.process.launch import LaunchError, check_inputs
    from real.process.worker import ExecOptions

    plan = ("strategy,node,gpus,batch_size,local_steps,step_s,tokens_per_round,comm_s,sync,sharding\n"
            "sync-ddp,a,2,2,3,0.05,384,0.01,gradients,zero2\n")
    plan_path, scenario_path = write(tmp_path, plan=plan)
    with pytest.raises(LaunchError, match="line 2: sharding: zero2 with sync = gradients \\(sync-ddp\\) is not run"):
        check_inputs(plan_path, scenario_path, ExecOptions(out_dir=str(tmp_path / "o")))
    plan_path.write_text(plan.replace("gradients", "diloco"))
    _, runnable = check_inputs(plan_path, scenario_path, ExecOptions(out_dir=str(tmp_path / "o")))
    assert runnable.nodes[0].sharding == "zero2"


def test_on_the_shaped_wan_the_collectives_leave_time_to_name_the_lost_node_and_stop():
    from real.core.options import SHAPED_STOP_BUDGET_S, ExecOptions

    assert SHAPED_STOP_BUDGET_S == 4.0
    assert ExecOptions(out_dir="o", timeout_s=10.0).collective_timeout_s() == 10.0  # loopback: as given
    assert ExecOptions(out_dir="o", timeout_s=10.0, wan="shaped").collective_timeout_s() == 6.0
    assert ExecOptions(out_dir="o", timeout_s=3.0, wan="shaped").collective_timeout_s() == 1.0
    assert ExecOptions(out_dir="o", timeout_s=0.5, wan="shaped").collective_timeout_s() == 0.5


def test_the_run_spec_holds_the_scenarios_sections_and_the_command_lines_checkpoint_every(tmp_path):
    """RunSpec re-listed 7 keys of [training], [network] and [simulation]; it holds the sections, and
    --checkpoint-every K is resolved into [training] checkpoint_every once (check_inputs), so no reader
    merges the option with the scenario."""
    from dataclasses import fields

    from formats.sections import NetworkConfig, SimulationConfig, TrainingConfig
    from real.core.config import RunSpec
    from real.core.options import ExecOptions
    from real.process.launch import check_inputs

    assert [f.name for f in fields(RunSpec)] == ["seed", "model", "training", "network", "diloco", "simulation"]
    plan_path, scenario_path = write(tmp_path)
    spec, _ = check_inputs(plan_path, scenario_path, ExecOptions(out_dir=str(tmp_path / "o"), checkpoint_every=3))
    assert isinstance(spec.training, TrainingConfig) and spec.training.checkpoint_every == 3
    assert isinstance(spec.network, NetworkConfig) and isinstance(spec.simulation, SimulationConfig)
