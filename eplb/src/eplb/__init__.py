"""eplb: expert-parallel load balancer with the API of DeepSeek's EPLB and a C++ planner."""
from ._version import __version__

# the original API
from .planner import rebalance_experts

# plans with timing, per-batch token split, metrics
from .planner import Plan, plan_experts, redistribute_tokens
from .planner import Metrics, evaluate

__all__ = ["__version__", "rebalance_experts", "Plan", "plan_experts", "redistribute_tokens",
           "Metrics", "evaluate"]
