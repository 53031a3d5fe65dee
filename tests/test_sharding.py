"""Issue 15 items 1-3: sharding and recomputation inside a node, in the scenario, the plan, the
memory model and the timing model. Exact numbers are worked by hand from the formulas in
simulator/models/memory.py, simulator/models/timing.py and simulator/models/network.py (the arithmetic is in comments)."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from facts.catalog import get_gpu
from simulator.cli import plan_main, simulate_main
from simulator.models.estimate import OVERLAP_SLOWDOWN
from simulator.models.layout_choice import memory_problem
from simulator.models.memory import (
    LAYOUT_ORDER,
    Layout,
    activation_bytes_per_sample,
    state_bytes,
    step_memory_bytes,
    transient_bytes,
)
from simulator.models.network import HOST_LINK_GBPS, node_outer_step_s, sync_s
from simulator.models.timing import gpu_estimate, intra_node_comm_s, node_timings
from simulator.scenario import builtin_names, load_scenario
from simulator.strategies import STRATEGIES, make_plan

ROOT = Path(__file__).resolve().parents[1]
LLAMA_8B = "llama-3.1-8b"  # facts/presets.py: Meta's Llama-3.1-8B config
# A model with round sizes: h 1024, 4 layers, 8 heads (no GQA), ffn 4096, vocabulary 1000, untied.
# Per layer 2·1024² (q, o) + 2·1024² (k, v) + 3·1024·4096 + 2·1024 = 16,779,264; embedding and head
# 1,024,000 each; final norm 1024: Ψ = 4·16,779,264 + 2·1,024,000 + 1024 = 69,166,080.
TINY = {"hidden_size": 1024, "intermediate_size": 4096, "num_attention_heads": 8, "num_hidden_layers": 4,
        "num_key_value_heads": 8, "tie_word_embeddings": False, "vocab_size": 1000}
PSI = 69_166_080
LAYER = 16_779_264


def scenario_file(tmp_path: Path, nodes: str, model: str, training: str = "", diloco: str = "") -> Path:
    (tmp_path / "tiny.json").write_text(json.dumps(TINY))
    path = tmp_path / "s.toml"
    path.write_text(f'name = "s"\n[model]\n{model}\n[training]\nrounds = 2\nlocal_steps = 10\n{training}\n'
                    f'[diloco]\n{diloco}\n{nodes}')
    return path


def tiny(tmp_path, gpus='{ "h100-sxm" = 4 }', **kw):
    nodes = f'[[nodes]]\nname = "a"\ngpus = {gpus}\n[[nodes]]\nname = "b"\ngpus = {gpus}\n'
    return load_scenario(str(scenario_file(tmp_path, nodes, 'preset = "tiny.json"\nseq_len = 512\ndtype = "bf16"',
                                           **kw)))


def test_state_bytes_divide_as_each_zero_stage_divides_them(tmp_path):
    s = tiny(tmp_path)
    # none: 4Ψ weights + 4Ψ gradients + 8Ψ moments + 2Ψ bf16 copy = 18Ψ
    assert state_bytes(s, Layout("none", devices=4)) == 18 * PSI == 1_244_989_440
    # zero1: 4Ψ + 4Ψ + 8Ψ/4 + 2Ψ = 12Ψ; zero2: 4Ψ + 4Ψ/4 + 8Ψ/4 + 2Ψ = 9Ψ; fsdp: 16Ψ/4 = 4Ψ (no half copy)
    assert state_bytes(s, Layout("zero1", devices=4)) == 12 * PSI == 829_992_960
    assert state_bytes(s, Layout("zero2", devices=4)) == 9 * PSI == 622_494_720
    assert state_bytes(s, Layout("fsdp", devices=4)) == 4 * PSI == 276_664_320
    # the outer state on the device: + 8Ψ unsharded, + 8Ψ/4 = 2Ψ sharded
    assert state_bytes(s, Layout("none", devices=4, outer_state="device")) == 26 * PSI
    assert state_bytes(s, Layout("fsdp", devices=4, outer_state="device")) == 6 * PSI


def _table(dtype: str, checkpointing: str) -> dict:
    import csv

    with (ROOT / "facts" / "step_memory.csv").open() as handle:
        row = next(r for r in csv.DictReader(handle) if (r["dtype"], r["checkpointing"]) == (dtype, checkpointing))
    return {k: float(v) for k, v in row.items() if k not in ("dtype", "checkpointing", "torch_version")}


def _per_sample(t: dict) -> float:
    """The traced activations of the tiny model per sample: seq 512 × per-token bytes (h 1024, kv 1024, f 4096, V 1000)."""
    return 512 * (4 * (t["act_h"] * 1024 + t["act_kv"] * 1024 + t["act_ffn"] * 4096)
                  + t["out_h"] * 1024 + t["out_kv"] * 1024 + t["out_ffn"] * 4096 + t["act_vocab"] * 1000)


def test_fsdp_transient_and_activations_with_and_without_recomputation(tmp_path):
    s = tiny(tmp_path)
    # two gathered layers in bf16 (2 · 2 bytes) + one layer's fp32 gradient (4 bytes): 8 · 16,779,264
    assert transient_bytes(s, Layout("fsdp", devices=4)) == 8 * LAYER == 134_234_112
    assert transient_bytes(s, Layout("zero2", devices=4)) == 0
    # activations: the traced step's (facts/step_memory.csv), with and without recomputation
    none, full = _table("bf16", "none"), _table("bf16", "full")
    assert activation_bytes_per_sample(s, Layout()) == pytest.approx(_per_sample(none), rel=1e-12)
    assert activation_bytes_per_sample(s, Layout(checkpointing="full")) == pytest.approx(_per_sample(full), rel=1e-12)
    assert activation_bytes_per_sample(s, Layout(checkpointing="full")) < activation_bytes_per_sample(s, Layout()) / 2
    # sharded: the ZeRO state, the FSDP transient and the traced activations
    assert step_memory_bytes(s, 3, Layout("fsdp", "full", 4)) == pytest.approx(4 * PSI + 8 * LAYER + 3 * _per_sample(full))


def test_the_unsharded_peak_is_the_traced_steps(tmp_path):
    """Unsharded: max(optimizer step, backward) of the traced step (simulator/models/memory.py)."""
    s = tiny(tmp_path)
    t = _table("bf16", "none")
    backward = t["backward_bytes_per_param"] * PSI + t["fixed_bytes"]
    assert step_memory_bytes(s, 2) == pytest.approx(backward + 2 * _per_sample(t))
    assert step_memory_bytes(s, 0) == pytest.approx(max(t["optimizer_bytes_per_param"] * PSI, backward))


def test_timing_of_each_layout(tmp_path):
    s = tiny(tmp_path)
    node = s.nodes[0]
    gbps = get_gpu("h100-sxm").intra_node_gbps
    ring = 2 * 3 / 4 * 8 / (gbps * 1e9)  # seconds per byte of a 4-device ring all-reduce
    # none, zero1, zero2: a 4Ψ fp32 all-reduce's volume, not overlapped
    for sharding in ("none", "zero1", "zero2"):
        assert intra_node_comm_s(s, node, Layout(sharding, devices=4)) == (pytest.approx(4 * PSI * ring), 0.0)
    # fsdp: gather bf16 twice + reduce-scatter fp32 = Ψ(2·2 + 4)/2 = 4Ψ as a ring all-reduce; exposed: one
    # layer's gather + reduce-scatter, U(2 + 4)/2 = 3U
    total, exposed = intra_node_comm_s(s, node, Layout("fsdp", devices=4))
    assert total == pytest.approx(4 * PSI * ring) and exposed == pytest.approx(3 * LAYER * ring)
    plain, sharded = gpu_estimate(s, "h100-sxm"), gpu_estimate(s, "h100-sxm", Layout("zero1", "full", 4))
    t0, c, t0_sharded, c_full = plain.fixed_s, plain.sample_s, sharded.fixed_s, sharded.sample_s
    assert c_full == pytest.approx(c * 4 / 3)  # one more forward
    spec = get_gpu("h100-sxm")
    assert t0 - t0_sharded == pytest.approx(92 * PSI * (1 - 1 / 4) / (spec.memory_bandwidth_gbs * 1e9))


def test_fsdp_node_overlaps_compute_and_collectives_plus_the_exposed_layer(tmp_path):
    """The collectives run behind the compute and slow it by OVERLAP_SLOWDOWN while they run,
    unless they outlast it (then they are the step); the first gather and last reduce-scatter are exposed."""
    # a 50 Gbit/s link inside the node: its collectives outlast batch 1's compute
    s = tiny(tmp_path, gpus='{ "h100-sxm" = 4 }\nintra_node_gbps = 50', training='sharding = "fsdp"\nactivation_checkpointing = "none"')
    timing = node_timings(s)[0]
    layout = timing.layout
    assert (layout.sharding, layout.checkpointing, layout.devices) == ("fsdp", "none", 4)
    est = gpu_estimate(s, "h100-sxm", layout)
    per_batch_s = est.weights_s + est.launch_s
    comm, exposed = intra_node_comm_s(s, s.nodes[0], layout)
    assert comm > (1 + OVERLAP_SLOWDOWN) * (per_batch_s + est.sample_s)
    assert timing.step_s(1) == pytest.approx(est.optimizer_s + comm + exposed)
    big = int(comm / est.sample_s) + 10
    hidden = comm * (1 - 1 / (1 + OVERLAP_SLOWDOWN))  # the compute time the collectives cost
    assert timing.step_s(big) == pytest.approx(est.optimizer_s + per_batch_s + est.sample_s * big + hidden + exposed)


def test_outer_step_on_cpu_and_on_device(tmp_path):
    s = tiny(tmp_path)
    node = s.nodes[0]
    host = 2.26e-9 * PSI
    assert node_outer_step_s(s, node, Layout("none", devices=4)) == pytest.approx(host)
    # sharded: the host's arithmetic for Ψ plus each device's shard down and up over PCIe, 2 · 4Ψ/4 bytes
    assert node_outer_step_s(s, node, Layout("zero1", devices=4)) == pytest.approx(
        host + 2 * PSI * 8 / (HOST_LINK_GBPS * 1e9))
    # on the device: 32 bytes per parameter of the shard through HBM
    bw = get_gpu("h100-sxm").memory_bandwidth_gbs * 1e9
    assert node_outer_step_s(s, node, Layout("fsdp", devices=4, outer_state="device")) == pytest.approx(
        32 * PSI / 4 / bw)
    assert node_outer_step_s(s, node, Layout("none", devices=4, outer_state="device")) == pytest.approx(32 * PSI / bw)
    # the all-reduce of a sharded node moves the same bytes on its uplink: only the outer step differs
    layouts = [Layout("zero1", devices=4)] * 2
    assert sync_s(s, layouts=layouts) - sync_s(s) == pytest.approx(2 * PSI * 8 / (HOST_LINK_GBPS * 1e9))


def test_auto_picks_no_sharding_for_every_builtin_scenario():
    for name in builtin_names():
        try:
            scenario = load_scenario(name)
        except Exception as exc:  # a built-in whose profiles are made by a command: not this test's business
            pytest.skip(f"{name}: {exc}")
        for timing in node_timings(scenario):
            assert (timing.layout.sharding, timing.layout.checkpointing) == ("none", "none"), (name, timing.node.name)


def test_auto_shards_before_it_recomputes(tmp_path):
    # llama-1b at batch 4 on the paper's cluster: 11 GiB cards need fsdp and recomputation, 24 GiB cards zero2
    # (the traced step's activations, 3.1 GB a sample, leave zero1's 12Ψ no room for 4 samples)
    s = load_scenario("paper", ["model.preset=llama-1b"])
    layouts = {t.node.name: (t.layout.sharding, t.layout.checkpointing) for t in node_timings(s)}
    assert layouts == {"node1": ("fsdp", "full"), "node2": ("fsdp", "full"), "node3": ("zero2", "none"),
                       "node4": ("zero2", "none")}
    order = list(LAYOUT_ORDER)
    for timing in node_timings(s):  # the chosen layout is the first that holds batch 4
        before = order[:order.index((timing.layout.sharding, timing.layout.checkpointing))]
        for sharding, ckpt in before:
            assert memory_problem(s, timing.node, 4, Layout(sharding, ckpt, 4)) is not None


def test_paper_with_llama_1b_plans_every_strategy_and_prints_the_layout(tmp_path, capsys):
    assert simulate_main(["paper", "--set", "model.preset=llama-1b", "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "fsdp+recompute" in out and "zero2" in out
    plan = pd.read_csv(tmp_path / "o" / "plan.csv")
    assert set(plan["strategy"]) == set(STRATEGIES)
    assert set(plan["sharding"]) == {"fsdp", "zero2"} and set(plan["outer_state"]) == {"cpu"}
    assert "auto" not in set(plan["activation_checkpointing"])


def test_a_fixed_layout_that_cannot_hold_the_batch_is_one_line(tmp_path, capsys):
    code = plan_main(["paper", "--set", "model.preset=llama-1b", "--set", "nodes.node3.sharding=none",
                      "--set", "nodes.node3.activation_checkpointing=none", "--strategy", "baseline",
                      "--out", str(tmp_path / "o")])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "training.batch_size: node 'node3' (nodes[2]): a30: batch 4 needs" in err
    assert not (tmp_path / "o").exists()


def test_bad_layout_words_name_the_key(tmp_path, capsys):
    code = plan_main(["paper", "--set", "training.sharding=zero3", "--strategy", "A", "--out", str(tmp_path / "o")])
    assert code == 2
    assert "--set: training.sharding: expected one of auto, none, zero1, zero2, fsdp, got 'zero3'" in \
        capsys.readouterr().err


def test_four_nodes_of_8_h100_train_an_8b_model_at_seq_8192(tmp_path):
    nodes = "".join(f'[[nodes]]\nname = "n{i}"\ngpus = {{ "h100-sxm" = 8 }}\n' for i in range(4))
    path = tmp_path / "s.toml"
    path.write_text(f'name = "8b"\n[model]\npreset = "{LLAMA_8B}"\nseq_len = 8192\ndtype = "bf16"\n'
                    f'[training]\nrounds = 2\nlocal_steps = 10\nbatch_size = 1\n[network]\nbandwidth_gbps = 10\n'
                    + nodes)
    scenario = load_scenario(str(path))
    plan = make_plan(scenario, "baseline")
    # geodt's eager step keeps 81 GB of activations a sample at seq 8192 (traced): no sharding alone holds
    # it in 80 GiB; with recomputation zero2 (the first of the order that fits) does
    assert {(n.sharding, n.activation_checkpointing) for n in plan.nodes} == {("zero2", "full")}
    # fsdp without recomputation: 16Ψ/8 + 8 · the embedding (the largest unit) + one sample's traced
    # activations (h 4096, kv 1024, f 14336, V 128,256, 32 layers, seq 8192), above 80 GiB less the reserve
    psi, embed = 8_030_261_248, 128_256 * 4096
    t = _table("bf16", "none")
    sample = 8192 * (32 * (t["act_h"] * 4096 + t["act_kv"] * 1024 + t["act_ffn"] * 14336) + t["out_h"] * 4096
                     + t["out_kv"] * 1024 + t["out_ffn"] * 14336 + t["act_vocab"] * 128_256)
    need = 2 * psi + 8 * embed + sample
    assert step_memory_bytes(scenario, 1, Layout("fsdp", "none", 8)) == pytest.approx(need)
    memory = get_gpu("h100-sxm").memory_bytes
    assert need > memory - 1e9 - 0.05 * memory
    unsharded = load_scenario(str(path), ["training.sharding=none"])
    with pytest.raises(Exception, match="cannot hold even batch 1"):
        make_plan(unsharded, "baseline")
    # batch 3 needs full sharding and recomputation; every strategy plans it. Batch 4 fits no layout of
    # the traced eager step (its fp32 logits alone, seq 8192 x 128,256 entries, are 10.5 GB a sample)
    three = load_scenario(str(path), ["training.batch_size=3"])
    for strategy in STRATEGIES:
        assert {(n.sharding, n.activation_checkpointing) for n in make_plan(three, strategy).nodes} == {("fsdp", "full")}
    with pytest.raises(Exception, match="batch 4 needs"):
        make_plan(load_scenario(str(path), ["training.batch_size=4"]), "baseline")


def test_a_node_override_wins_and_auto_names_the_last_layout_it_tried(tmp_path, capsys):
    s = load_scenario("paper", ["model.preset=llama-1b", "nodes.node3.sharding=zero2",
                                "nodes.node4.activation_checkpointing=full"])
    plan = make_plan(s, "baseline")
    assert [(n.sharding, n.activation_checkpointing) for n in plan.nodes] == [
        ("fsdp", "full"), ("fsdp", "full"), ("zero2", "none"), ("none", "full")]  # recomputing, node4 needs no sharding
    # one device cannot shard: auto tries none, then recomputation, and names the last
    path = tmp_path / "one.toml"
    path.write_text(f'name = "one"\n[model]\npreset = "{LLAMA_8B}"\nseq_len = 8192\n[training]\nbatch_size = 1\n'
                    '[[nodes]]\nname = "t"\ngpus = { "t4" = 1 }\n')
    assert plan_main([str(path), "--strategy", "A", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "node 't' cannot hold even batch 1: t4: batch 1 needs" in err and "GiB (full recomputation), the GPU" in err
