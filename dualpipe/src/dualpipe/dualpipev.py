"""DualPipeV: DualPipe "cut in half" into a V shape (one input end, parameters 1x)."""
from __future__ import annotations

from typing import Optional

from .pipeline import PipelineBase


class DualPipeV(PipelineBase):
    """DualPipeV over P pipeline ranks holding 2P stages.

    ``modules = (stage_r, stage_{2P-1-r})`` on pipeline rank r: activations go down the ranks
    through ``module[0]`` and come back up through ``module[1]``; the last rank hands its
    ``module[0]`` outputs to its ``module[1]`` without communication.

    ``step(*inputs, num_chunks, criterion=None, labels=[], return_outputs=False) -> (loss, outputs)``

    * inputs, labels, criterion: required only on the first rank; split into num_chunks micro-batches.
    * num_chunks: micro-batches, >= 2 * num_ranks.
    * loss: ``[num_chunks]`` per-micro-batch losses on the first rank, else None.
    * outputs: with ``return_outputs``, the last stage's outputs on the first rank.
    """

    KIND = "DualPipeV"

    def _check_num_chunks(self, num_chunks: int) -> Optional[str]:
        if num_chunks <= 0 or num_chunks < 2 * self.num_ranks:
            return f"DualPipeV.step: num_chunks must be >= 2 * num_ranks = {2 * self.num_ranks}, got {num_chunks}"
        return None

    def _micro_batches_per_source(self, num_chunks: int) -> int:
        return num_chunks
