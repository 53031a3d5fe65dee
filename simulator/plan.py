"""A plan: per node, the batch size b_i (per GPU) and local steps H_i of one round.

The classes and plan.csv's columns are the executor's schema (real/plan.py, torch-free), so
the plan `geodt plan` prints is the one `geodt run` executes. `Plan.to_frame(scenario)`
writes every value resolved (rounds, collective, payload dtype, per-node link); without a
scenario the values the strategy left to the scenario are empty cells.
"""
from __future__ import annotations

from real.plan import PLAN_COLUMNS, NodePlan, Plan, PlanError, merge_steps, partition_shares

__all__ = ["PLAN_COLUMNS", "NodePlan", "Plan", "PlanError", "merge_steps", "partition_shares"]
