"""DualPipe: bidirectional pipeline parallelism (DeepSeek-V3 technical report, section 3.2.1)."""
from __future__ import annotations

from typing import Optional

from .pipeline import PipelineBase


class DualPipe(PipelineBase):
    """DualPipe over ``num_ranks`` (even) pipeline ranks.

    ``modules = (stage_r, stage_{PP-1-r})`` on pipeline rank r: micro-batches enter at both ends
    (rank 0 feeds stage 0 of ``module[0]``, rank PP-1 feeds stage 0 of its ``module[1]``), so every
    stage is held twice (parameters 2x) and the two copies' gradients must be summed by the caller.

    ``step(*inputs, num_chunks, criterion=None, labels=[], return_outputs=False) -> (loss, outputs)``

    * inputs: required only on the first and the last rank; each splits into num_chunks / 2
      micro-batches along ``batch_dim``.
    * num_chunks: micro-batches of the whole step (both ends together), even, >= 2 * num_ranks.
    * criterion: ``criterion(*outputs, *labels) -> scalar``; required on the first/last rank.
    * labels: on the first rank they belong to the inputs of the last rank, and vice versa.
    * loss: ``[num_chunks / 2]`` per-micro-batch losses on the first rank (for the last rank's
      inputs) and on the last rank (for the first rank's inputs), else None.
    * outputs: with ``return_outputs``, the last stage's outputs, concatenated, on the same ranks.
    """

    KIND = "DualPipe"

    def _check_num_ranks(self) -> None:
        if self.num_ranks % 2 != 0:
            raise ValueError(f"DualPipe: needs an even number of pipeline ranks, got {self.num_ranks}")

    def _check_num_chunks(self, num_chunks: int) -> Optional[str]:
        if num_chunks <= 0 or num_chunks % 2 != 0 or num_chunks < 2 * self.num_ranks:
            return (f"DualPipe.step: num_chunks must be even and >= 2 * num_ranks = {2 * self.num_ranks}, "
                    f"got {num_chunks}")
        return None

    def _micro_batches_per_source(self, num_chunks: int) -> int:
        return num_chunks // 2
