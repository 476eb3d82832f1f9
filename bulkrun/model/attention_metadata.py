"""What every attention layer needs to know about one packed step, passed explicitly (no globals)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bulkrun_kernels.reference import AttentionPlan


@dataclass(slots=True)
class SampledRows:
    """The rows of a step whose final hidden state is read (each the last row of its sequence: the
    rows that sample), where that is fewer than all: the last layer runs its attention, o projection
    and MLP for these rows alone (its K/V still come from every row), as nothing reads the others."""

    rows: torch.Tensor  # [N] int64: the packed rows, ascending (the order of the logits rows)
    query_start_loc: torch.Tensor  # [B + 1] int32: sequence s owns rows[query_start_loc[s]:[s+1]] (0 or 1)


@dataclass(slots=True)
class AttentionMetadata:
    positions: torch.Tensor  # [T] int64: each packed token's position in its sequence
    slot_mapping: torch.Tensor  # [T] int64: where each token's K/V goes (block * block_size + offset)
    block_tables: torch.Tensor  # [B, max_blocks] int32, rows padded with 0
    query_start_loc: torch.Tensor  # [B + 1] int32: sequence s owns rows query_start_loc[s]:[s+1]
    seq_lens: torch.Tensor  # [B] int32: context length including this step's tokens
    # [T] int64: each token's row of the rotary table where that is not its position (LongRoPE: a
    # request past the short context reads the long factors' rows, DecoderLM.init_rotary); None:
    # the positions are the rows
    rope_rows: torch.Tensor | None = None
    # Reference (CPU) attention only: the step's grouping of sequences, built once, used by every layer.
    plan: AttentionPlan | None = None
    # where the step's only outputs read are its sampled rows (None: every row's, or every row samples)
    sampled: SampledRows | None = None

    @property
    def rotary_rows(self) -> torch.Tensor:
        return self.positions if self.rope_rows is None else self.rope_rows
