"""The fidelity goals (facts/fidelity.py) and the verdicts `geodt validate` and `geodt profile check` print."""
import math

import pandas as pd
import pytest

from facts.fidelity import GOALS, IDLE_WORST, TIME_TO_TARGET, judge, node_verdict
from geodt.validation import compute_line, validation_table, verdict_lines
from simulator.models.profile_check import profile_verdict


def test_judge_reduces_each_goal_over_the_nodes():
    verdicts = {v.goal.key: v for v in judge([2.0, -4.0, 6.0], [1.0, -7.0, 2.0], [3.0, -12.0, float("nan")],
                                             shaped_wan=True, time_to_target_pct=-25.0)}
    assert [g.key for g in GOALS] == list(verdicts)
    assert (verdicts["round_median"].value_pct, verdicts["round_median"].within) == (4.0, True)
    assert (verdicts["idle_median"].value_pct, verdicts["idle_median"].within) == (2.0, True)
    assert (verdicts["idle_worst"].value_pct, verdicts["idle_worst"].within) == (7.0, False)
    assert verdicts["idle_worst"].line() == ("idle, worst over nodes |error| 7.0% of round (goal ≤ 6% of round): "
                                             "outside by 1.0 points")
    # the node without a predicted sync (NaN) is left out, not counted as 0
    assert (verdicts["sync_median"].value_pct, verdicts["sync_worst"].value_pct) == (7.5, 12.0)
    assert verdicts["time_to_target"].line() == "time to target loss |error| 25.0% (goal ≤ 20%): outside by 5.0 points"


def test_sync_goals_are_not_judged_on_the_loopback_nor_a_missing_target():
    verdicts = {v.goal.key: v for v in judge([0.0], [0.0], [80.0], shaped_wan=False)}
    assert verdicts["sync_worst"].within is None and verdicts["sync_worst"].value_pct is None
    assert "not judged (the sync goals are for a shaped WAN" in verdicts["sync_worst"].line()
    assert verdicts["time_to_target"].within is None
    assert verdicts["round_median"].within is True


def test_node_verdict_names_each_goal_the_node_misses():
    assert node_verdict(4.9, -5.9, 50.0, shaped_wan=False) == "within"  # the sync is not judged off a WAN
    assert node_verdict(-5.5, 6.5, 11.0, shaped_wan=True) == ("outside: round -5.5% (goal ±5%); idle +6.5% of round "
                                                              "(goal ±6% of round); sync +11.0% (goal ±10%)")
    assert node_verdict(1.0, 1.0, float("nan"), shaped_wan=True) == "within"


def _frames(measured_idle_b: float):
    timeline = pd.DataFrame({"strategy": "C", "node": ["a", "b"], "round": [0, 0], "compute_s": [1.0, 2.0],
                             "idle_s": [1.0, 0.0], "comm_s": [0.5, 0.5], "round_start_s": 0.0, "round_end_s": 0.0,
                             "tokens": [64, 128]})
    trace = pd.DataFrame({"strategy": "C", "node": ["a", "b"], "round": [0, 0], "compute_s": [1.0, 2.0],
                          "idle_s": [1.0, measured_idle_b], "comm_s": [0.5, 0.5], "overrun_steps": [0, 0],
                          "tokens": [64, 128]})
    return timeline, trace


def test_validation_csv_holds_each_nodes_round_error_and_verdict():
    table = validation_table(*_frames(measured_idle_b=0.25), time_scale=1.0)
    a, b = table.iloc[0], table.iloc[1]
    assert (a["round_error_pct"], a["verdict"]) == (0.0, "within")
    # b: predicted round 2.5 s, measured 2.75 s: +10% round, idle +10% of the round
    assert b["round_error_pct"] == pytest.approx(10.0)
    assert b["verdict"] == "outside: round +10.0% (goal ±5%); idle +10.0% of round (goal ±6% of round)"
    lines = verdict_lines(table, emulated=True, network="loopback")
    assert len(lines) == len(GOALS) and all(line.startswith("verdict (schedule check (emulated)): ") for line in lines)
    assert "round time, median over nodes |error| 5.0% (goal ≤ 5%): within" in lines[0]
    assert lines[2].endswith("outside by 4.0 points")
    assert verdict_lines(table, emulated=False, network="loopback")[0].startswith("verdict (measured run): ")


def test_profile_verdict_says_whether_the_fit_plans():
    good = pd.DataFrame({"batch_size": [1, 2, 4], "error_pct": [1.0, -7.9, 3.0]})
    assert profile_verdict(good) == "verdict: usable for planning (median leave-one-out error 3.0% ≤ 8%)"
    edge = pd.DataFrame({"batch_size": [1, 2, 4, 8], "error_pct": [1.0, -2.0, 3.0, -17.4]})
    assert profile_verdict(edge).endswith("; batch 8 (-17.4%) beyond 8%: a plan at those batches may be off by as much")
    bad = pd.DataFrame({"batch_size": [1, 2, 4], "error_pct": [1.0, -69.0, 8.5]})
    verdict = profile_verdict(bad)
    assert verdict.startswith("verdict: not usable for planning as it is: the median batch is predicted from the "
                              "others 8.5% off (goal ≤ 8%; batch 2 (-69.0%), 4 (+8.5%))")
    assert math.isclose(IDLE_WORST.limit_pct, 6.0) and TIME_TO_TARGET.statistic == "worst"


def _compute(predicted, measured):
    return pd.DataFrame({"node": ["a", "b", "c"][:len(predicted)], "predicted_compute_s": predicted,
                         "measured_compute_s": measured})


def test_the_compute_line_splits_the_machines_speed_from_a_node_apart():
    # every node about 1.1x its profile, none apart: the profiles' speed, the round goal's part
    shared = compute_line(_compute([10.0, 10.0, 10.0], [10.8, 11.0, 11.0]))
    assert shared == ("compute, measured over predicted: a 1.080, b 1.100, c 1.100; median 1.100× (what the nodes "
                      "share), a furthest from it (0.982×); the nodes ran 1.10× their profiles (median): the profiles' "
                      "speed, not the plan, is off; on a shared machine calibrate again right before the run "
                      "(--passes 3; results/predict-the-run/)")
    # one node 7% apart from the others, the median on its profile: the idle goal's part
    apart = compute_line(_compute([10.0, 10.0, 10.0], [9.3, 10.0, 10.0]))
    assert apart == ("compute, measured over predicted: a 0.930, b 1.000, c 1.000; median 1.000× (what the nodes "
                     "share), a furthest from it (0.930×); a ran 0.930× the others against its profile: its idle "
                     "error follows")
    # within both goals: the split alone
    assert compute_line(_compute([10.0, 10.0], [10.2, 9.9])).endswith("a furthest from it (1.015×)")


def test_the_compute_line_leaves_out_a_node_with_nothing_predicted():
    # c left before its first round: no compute predicted, none to compare
    line = compute_line(_compute([10.0, 10.0, 0.0], [10.0, 10.4, 0.0]))
    assert line.startswith("compute, measured over predicted: a 1.000, b 1.040; median 1.020×")
    assert compute_line(_compute([0.0], [1.0])) is None
