"""ModelRunner.execute: sampled tokens, their logprobs, and continuation scores against transformers."""

from __future__ import annotations

import pytest
import torch
from helpers.models import VOCAB, build_tiny_model

from bulkrun.engine.core.config import EngineConfig
from bulkrun.engine.core.params import SamplingParams
from bulkrun.engine.core.request import Request
from bulkrun.engine.core.scheduler import SchedulerOutput
from bulkrun.engine.core.scoring import ScoringState
from bulkrun.engine.worker.runner import ModelRunner
from bulkrun.model.config import UnsupportedModelError

BLOCK = 4


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama_untied")
    hf = build_tiny_model("llama_untied", folder)
    runner = ModelRunner(str(folder), EngineConfig(block_size=BLOCK, kv_cache_bytes=1 << 20, dtype="float32"))
    return hf, runner


def _request(rid, tokens, blocks, **params):
    r = Request(rid, SamplingParams(**params), list(tokens), len(tokens))
    r.block_table = list(blocks)
    return r


def _hf_logprobs(hf, tokens):
    with torch.no_grad():
        return hf(torch.tensor([tokens])).logits[0].log_softmax(-1)


def test_runner_exposes_what_the_engine_needs(setup):
    _, runner = setup
    assert runner.block_size == BLOCK and runner.max_model_len == 256
    # one block of the budget is kept back for the padding rows of captured decode steps
    assert runner.num_blocks == (1 << 20) // (2 * 2 * BLOCK * 2 * 32 * 4) - 1
    assert runner.padding_block == runner.num_blocks
    limits = runner.limits  # what a report prints: the budget chosen for the device and the cache
    assert (limits.device, limits.max_num_batched_tokens, limits.max_num_seqs) == ("cpu", 2048, 256)
    assert limits.num_kv_blocks == runner.num_blocks and limits.kv_cache_bytes == 1 << 20
    assert 2 in runner.eos_token_ids
    assert runner.tokenizer.encode("w5 w6", add_special_tokens=False) == [5, 6]


@pytest.mark.parametrize("logprobs", [True, False], ids=["sampled-row", "plain-greedy-row"])
@pytest.mark.parametrize("screened", [True, False], ids=["greedy-head", "full-head"])
def test_greedy_sample_logprob_and_scores(setup, monkeypatch, logprobs, screened):
    """Scores come from the scored rows whether the sample row is drawn, screened by the greedy
    head, or takes the argmax of the full head's logits (the GPU's path)."""
    hf, runner = setup
    if not screened:
        monkeypatch.setattr(runner, "greedy_head", None)
    gen = torch.Generator().manual_seed(3)
    prompt = torch.randint(3, VOCAB, (10,), generator=gen).tolist()
    other = torch.randint(3, VOCAB, (9,), generator=gen).tolist()
    gen_req = _request("g", prompt, [7, 2, 11], logprobs=logprobs)
    # a scoring child: a 6-token prompt + a 3-token continuation, computed in one chunk
    score_req = _request("s", other, [5, 9, 0])
    score_req.scoring = ScoringState(score_start=6)  # score token_ids[6:] = the 3-token continuation
    out = runner.execute(SchedulerOutput([(gen_req, 10, True), (score_req, 9, False)]))
    expected = _hf_logprobs(hf, prompt)[-1]
    assert out.sampled == {"g": int(expected.argmax())}
    if logprobs:
        assert out.sampled_logprobs["g"] == pytest.approx(float(expected.max()), abs=1e-4)
    ref = _hf_logprobs(hf, other)
    want = [float(ref[p, other[p + 1]]) for p in range(5, 8)]
    assert out.score_logprobs["s"] == pytest.approx(want, abs=1e-4)


def test_decode_after_prefill_reads_the_cache(setup):
    hf, runner = setup
    prompt = list(range(10, 17))
    r = _request("d", prompt, [20, 3], seed=5)
    first = runner.execute(SchedulerOutput([(r, 7, True)])).sampled["d"]
    r.num_computed_tokens = 7
    r.token_ids.append(first)
    second = runner.execute(SchedulerOutput([(r, 1, True)])).sampled["d"]
    expected = _hf_logprobs(hf, prompt + [first])[-1].argmax()
    assert [first, second] == [int(_hf_logprobs(hf, prompt)[-1].argmax()), int(expected)]
    assert "d" not in runner.execute(SchedulerOutput([(r, 1, False)])).sampled


def test_unsupported_model_is_refused(tmp_path):
    import json

    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]})
    )
    with pytest.raises(UnsupportedModelError, match="gpt2"):
        ModelRunner(str(tmp_path), EngineConfig())
