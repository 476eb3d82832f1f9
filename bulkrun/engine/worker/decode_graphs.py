"""CUDA graphs for decode-only steps: the model's forward captured once per padded batch size.

A decode step of a small model is dozens of kernel launches, each behind Python argument checks;
replaying a captured graph issues them all at once. A step of n sequences runs the graph of the
smallest captured size >= n: its inputs are copied into static buffers, the rows past n are
padding (token 0 at position 0, writing into a block the scheduler never hands out, attending to
that one slot), and the first n rows of the static output are the step's hidden states.

Graphs are captured only with the Triton kernels (capture_wanted), after a warm-up of every size under
torch.cuda.set_sync_debug_mode("error"). Mixed and prefill steps, steps larger than the largest graph, steps whose longest context is
past the graphs' block-table width and every step after a failed capture run eagerly. That width
is the split-KV kernel's long-partition length, the context below which it splits a decode step by
occupancy alone: so a graph's split (fixed at capture from its shapes) is the one an eager step of
the same batch would choose, and long contexts, which the eager step splits by their real length,
are not cut for a length they do not have. Without capture (the CPU, tests) the same padded static-buffer path runs
eagerly, so it is checked against the unpadded one everywhere.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager, suppress

import torch

from bulkrun.model.attention_metadata import AttentionMetadata
from bulkrun_kernels.reference import plan_attention

log = logging.getLogger(__name__)

MAX_CAPTURED_BATCH = 512  # larger decode batches are bound by their matmuls, not by launches


def graph_batch_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, then every multiple of 8 up to max_num_seqs (capped at MAX_CAPTURED_BATCH)."""
    top = min(max_num_seqs, MAX_CAPTURED_BATCH)
    sizes = [s for s in (1, 2, 4) if s < top] + list(range(8, top + 1, 8))
    if not sizes or sizes[-1] < top:
        sizes.append(top)
    return sizes


def graph_context_tokens() -> int:
    """Contexts a captured step covers: the Triton kernel's long-partition length."""
    from bulkrun_kernels.paged_attention import LONG_PARTITION_KEYS  # imports triton: CUDA only

    return LONG_PARTITION_KEYS


def capture_wanted(device_type: str, cuda_graphs: bool, backend: str) -> bool:
    """Graphs where they can be captured: CUDA, asked for, and the Triton kernels (the reference
    kernels plan each step on the host, which a captured graph cannot replay)."""
    return device_type == "cuda" and cuda_graphs and backend == "triton"


class GraphCapture:
    """The CUDA calls a capture makes (tests pass a fake: this machine has no GPU)."""

    def sync_errors(self):
        return _sync_debug_errors()

    def synchronize(self) -> None:
        torch.cuda.synchronize()

    def new_graph(self):
        return torch.cuda.CUDAGraph()

    @contextmanager
    def capture(self, graph, pool):
        """torch.cuda.graph without its failure mode: when the captured code raises, torch's
        context leaves the capture stream current and the capture open; here the capture is
        ended, the graph reset and the caller's stream restored before the error goes on."""
        torch.cuda.synchronize()
        with torch.cuda.stream(torch.cuda.Stream()):
            graph.capture_begin(*(() if pool is None else (pool,)))
            try:
                yield
            except BaseException:
                with suppress(Exception):  # an invalidated capture still ends (CUDA returns an error)
                    graph.capture_end()
                graph.reset()
                raise
            graph.capture_end()


@contextmanager
def _sync_debug_errors():
    before = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(before)


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class DecodeGraphs:
    def __init__(self, runner, sizes: list[int]):
        self.runner = runner
        self.sizes = sorted(sizes)
        n, device = self.sizes[-1], runner.device
        self.input_ids = torch.zeros(n, dtype=torch.long, device=device)
        self.positions = torch.zeros(n, dtype=torch.long, device=device)
        long_rope = runner.builder.long_rope_after is not None  # rotary rows apart from the positions
        self.rope_rows = torch.zeros(n, dtype=torch.long, device=device) if long_rope else None
        self.slot_mapping = torch.zeros(n, dtype=torch.long, device=device)
        self.width = min(runner.max_blocks_per_seq, max(1, graph_context_tokens() // runner.block_size))
        self.block_tables = torch.zeros(n, self.width, dtype=torch.int32, device=device)
        self.query_start_loc = torch.arange(n + 1, dtype=torch.int32, device=device)
        self.seq_lens = torch.ones(n, dtype=torch.int32, device=device)
        self.logits_indices = torch.arange(n, dtype=torch.long, device=device)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}

    @classmethod
    def capture(cls, runner, sizes: list[int], cuda: GraphCapture | None = None) -> DecodeGraphs | None:
        """Capture every size (largest first, sharing one memory pool); None, with one log line,
        when a size cannot be captured (the runner then runs every step eagerly).

        Every size runs once first under torch.cuda.set_sync_debug_mode("error"): a forward that
        would synchronise with the host (which a capture cannot hold) raises there, before any
        capture has begun. A capture that fails anyway ends its capture and leaves its stream
        (GraphCapture.capture), and every graph is dropped, so the process goes on eagerly."""
        cuda = cuda or GraphCapture()
        graphs = cls(runner, sizes)
        try:
            with cuda.sync_errors():
                for size in reversed(graphs.sizes):  # warm up: compile kernels, allocate workspaces
                    graphs._pad_all(size)
                    graphs._forward(size)
            cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - a sync or any other failure: eager, nothing captured
            log.warning("decode steps run eagerly: the forward cannot be captured: %s", _first_line(exc))
            return None
        try:
            pool = None
            for size in reversed(graphs.sizes):
                graphs._pad_all(size)
                graph = cuda.new_graph()
                with cuda.capture(graph, pool):
                    out = graphs._forward(size)
                pool = graph.pool()
                graphs.graphs[size] = (graph, out)
        except Exception as exc:  # noqa: BLE001 - any failure means: run eagerly
            graphs.graphs.clear()
            log.warning("CUDA graph capture failed, decode steps run eagerly: %s", _first_line(exc))
            return None
        return graphs

    def padded_size(self, n: int) -> int | None:
        for size in self.sizes:
            if size >= n:
                return size
        return None

    def run(self, inputs) -> torch.Tensor | None:
        """Hidden states of a decode-only step's rows, or None when no size fits it."""
        n = inputs.num_rows
        size = self.padded_size(n)
        md = inputs.metadata
        width = md.block_tables.shape[1]
        if size is None or width > self.width:
            return None
        self.input_ids[:n].copy_(inputs.input_ids, non_blocking=True)
        self.positions[:n].copy_(md.positions, non_blocking=True)
        if self.rope_rows is not None:
            self.rope_rows[:n].copy_(md.rope_rows, non_blocking=True)
        self.slot_mapping[:n].copy_(md.slot_mapping, non_blocking=True)
        self.block_tables[:n, :width].copy_(md.block_tables, non_blocking=True)
        self.seq_lens[:n].copy_(md.seq_lens, non_blocking=True)
        self._pad(n, size)
        captured = self.graphs.get(size)
        if captured is None:
            return self._forward(size)[:n]
        graph, out = captured
        graph.replay()
        return out[:n]

    def _pad_all(self, size: int) -> None:
        self._pad(0, size)

    def _pad(self, n: int, size: int) -> None:
        """Rows n..size-1: token 0 at position 0 of the padding block, a context of one slot."""
        if n >= size:
            return
        block = self.runner.padding_block
        self.input_ids[n:size] = 0
        self.positions[n:size] = 0
        if self.rope_rows is not None:
            self.rope_rows[n:size] = 0
        self.slot_mapping[n:size] = block * self.runner.block_size
        self.block_tables[n:size, 0] = block
        self.seq_lens[n:size] = 1

    def _forward(self, size: int) -> torch.Tensor:
        runner = self.runner
        md = AttentionMetadata(
            positions=self.positions[:size],
            slot_mapping=self.slot_mapping[:size],
            block_tables=self.block_tables[:size],
            query_start_loc=self.query_start_loc[: size + 1],
            seq_lens=self.seq_lens[:size],
            rope_rows=None if self.rope_rows is None else self.rope_rows[:size],
        )
        if runner.ops.backend == "reference":  # CPU only: the plan is host data, never captured
            md.plan = plan_attention(
                md.block_tables, md.query_start_loc, md.seq_lens, runner.block_size, runner.dtype
            )
        return runner.model.final_hidden(
            self.input_ids[:size], md, runner.kv_cache.layers, self.logits_indices[:size]
        )
