"""dualpipe: DualPipe / DualPipeV pipeline parallelism with a native schedule planner and simulator."""
from ._version import __version__

# runtime (same names as deepseek-ai/DualPipe)
from .dualpipe import DualPipe
from .dualpipev import DualPipeV
from .comm import set_p2p_tensor_shapes, set_p2p_tensor_dtype
from .utils import WeightGradStore, run_backward

# planner + simulator
from .schedule import SCHEDULES, SimResult, compare, plan, simulate

__all__ = [
    "__version__", "DualPipe", "DualPipeV", "set_p2p_tensor_shapes", "set_p2p_tensor_dtype",
    "WeightGradStore", "run_backward", "SCHEDULES", "SimResult", "compare", "plan", "simulate",
]
