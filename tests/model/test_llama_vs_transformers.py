"""Our packed-step model against transformers' logits on tiny random models of every supported kind."""

from __future__ import annotations

import pytest
import torch
from helpers.models import KINDS, VOCAB, build_tiny_model

from bulkrun.engine.core.params import SamplingParams
from bulkrun.engine.core.request import Request
from bulkrun.engine.core.scoring import ScoringState
from bulkrun.engine.worker.kv_cache import KVCache
from bulkrun.engine.worker.step_inputs import build_step_inputs
from bulkrun.model.linear import pack_linears_for_cpu
from bulkrun.model.loader import load_model
from bulkrun_kernels import cpu_build, get_ops
from bulkrun_kernels.reference import plan_attention

BLOCK_SIZE = 4


@pytest.fixture(scope="module", params=sorted(KINDS))
def checkpoint(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    return build_tiny_model(request.param, folder), folder


@pytest.fixture(params=["onednn", "plain", "native-ops"])
def models(request, checkpoint):
    """Our model with the CPU's prepacked oneDNN linears, with plain F.linear (both on the reference
    ops), and with oneDNN linears on the CPU native ops."""
    hf, folder = checkpoint
    backend = "cpu" if request.param == "native-ops" else "reference"
    if backend == "cpu" and not cpu_build.load():  # no compiler here; tests/cpu_kernels says so
        pytest.skip(f"CPU native kernels unavailable: {cpu_build.load_error()}")
    ours = load_model(folder, get_ops(backend), torch.float32, torch.device("cpu"))
    if request.param != "plain" and not pack_linears_for_cpu(ours):
        pytest.skip("oneDNN is not available in this torch build")
    return hf, ours


def _hf_logits(hf, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([tokens])).logits[0]


class PagedRun:
    """Drives our model step by step over a shuffled (non-contiguous) block pool, like the runner."""

    def __init__(self, model, num_blocks=64, seed=0):
        self.model, self.device = model, model.norm.device
        self.cache = KVCache(model.cfg, num_blocks, BLOCK_SIZE, torch.float32, self.device)
        self.free = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed)).tolist()

    def request(self, rid: str, tokens: list[int]) -> Request:
        return Request(rid, SamplingParams(), list(tokens), len(tokens))

    def step(self, work: list[tuple[Request, int]]) -> list[torch.Tensor]:
        """Compute each (request, n) chunk; return every computed row's logits, per request."""
        for r, n in work:
            while len(r.block_table) * BLOCK_SIZE < r.num_computed_tokens + n:
                r.block_table.append(self.free.pop())
            r.scoring = ScoringState(
                score_start=r.num_computed_tokens + 1
            )  # ask for logits at every computed row
            r.token_ids.append(0)  # a placeholder target so the last row is scored too
        inputs = build_step_inputs([(r, n, False) for r, n in work], BLOCK_SIZE)
        md = inputs.metadata
        if self.model.ops.backend == "reference":
            md.plan = plan_attention(
                md.block_tables, md.query_start_loc, md.seq_lens, BLOCK_SIZE, torch.float32
            )
        for name in ("positions", "slot_mapping", "block_tables", "query_start_loc", "seq_lens"):
            setattr(md, name, getattr(md, name).to(self.device))
        with torch.inference_mode():
            logits = self.model(
                inputs.input_ids.to(self.device), md, self.cache.layers, inputs.logits_indices.to(self.device)
            )
        out = []
        for span, (r, n) in zip(inputs.score_spans, work, strict=True):
            out.append(logits[span.first_row : span.first_row + n].cpu())
            r.token_ids.pop()
            r.num_computed_tokens += n
        return out


def test_single_prompt_prefill_matches(models):
    hf, ours = models
    tokens = torch.randint(3, VOCAB, (23,), generator=torch.Generator().manual_seed(1)).tolist()
    run = PagedRun(ours)
    (got,) = run.step([(run.request("a", tokens), len(tokens))])
    torch.testing.assert_close(got, _hf_logits(hf, tokens), atol=1e-4, rtol=1e-4)


def test_mixed_packed_steps_match(models):
    """Prefill chunks and decodes of four sequences packed together over three steps."""
    hf, ours = models
    gen = torch.Generator().manual_seed(2)
    full = {name: torch.randint(3, VOCAB, (n,), generator=gen).tolist() for name, n in
            [("a", 9), ("b", 30), ("c", 4), ("d", 13)]}  # fmt: skip
    run = PagedRun(ours)
    a, b, c = (run.request(k, full[k][:n]) for k, n in [("a", 7), ("b", 11), ("c", 3)])
    d = run.request("d", full["d"])
    got = {k: [] for k in full}
    # step 1: a's whole prompt, b's first chunk, c's prompt
    for k, rows in zip("abc", run.step([(a, 7), (b, 11), (c, 3)]), strict=True):
        got[k].append(rows)
    # step 2: a decodes, b's second chunk (mid-block start), c decodes, d's first chunk
    a.token_ids.append(full["a"][7]), c.token_ids.append(full["c"][3])
    b.token_ids.extend(full["b"][11:])
    for k, rows in zip("abcd", run.step([(a, 1), (b, 14), (c, 1), (d, 5)]), strict=True):
        got[k].append(rows)
    # step 3: a decodes again, b's last chunk, d's rest
    a.token_ids.append(full["a"][8])
    for k, rows in zip("abd", run.step([(a, 1), (b, 5), (d, 8)]), strict=True):
        got[k].append(rows)
    for k, tokens in full.items():
        expected = _hf_logits(hf, tokens)
        torch.testing.assert_close(torch.cat(got[k]), expected[: len(tokens)], atol=1e-4, rtol=1e-4)
