"""Multiple-choice rows scored in the engine on the default model give the log-likelihoods, acc and
acc_norm that lm-evaluation-harness's recipe gives with plain transformers (fp32)."""

from __future__ import annotations

import pytest
from helpers.multiple_choice import ROWS, hf_choice_loglikelihoods, lm_eval_acc
from helpers.tasks import load_hf_model

from bulkrun.engine.core.config import EngineConfig
from bulkrun.engine.core.params import EngineRequest, SamplingParams
from bulkrun.engine.load import load_engine
from bulkrun.tasks.base import RowError
from bulkrun.tasks.multiple_choice import choice_columns, encode_choices, parse_row

pytestmark = pytest.mark.slow

TOL = 1e-3  # fp32 sums of a few log-probabilities, in another summation order


@pytest.fixture(scope="module")
def hf_model(default_model_dir):
    return load_hf_model(default_model_dir)


@pytest.fixture(scope="module")
def engine(default_model_dir):
    return load_engine(str(default_model_dir), EngineConfig(kv_cache_bytes=32 << 20, dtype="float32"))


def test_engine_scores_equal_lm_eval_recipe_with_transformers(engine, tokenizer, hf_model):
    def encode(text):
        return tokenizer.encode(text, add_special_tokens=False)

    prefix = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    requests, parsed, errors = [], {}, {}
    for number, fields in enumerate(ROWS):
        try:
            row = parse_row(fields, "choices", "answer")
        except RowError as exc:
            errors[number] = exc.kind
            continue
        context_ids, ids = encode_choices(encode, fields["question"], row.choices, prefix)
        parsed[number] = row
        params = SamplingParams(max_tokens=0)
        requests.append(EngineRequest(str(number), context_ids, params, continuations=ids))
    assert errors == {5: "expected_out_of_range", 6: "empty_choices"}
    assert any(len(c) > 3 for r in requests for c in r.continuations)  # multi-token choices

    for output in engine.generate(requests):
        number = int(output.request_id)
        row = parsed[number]
        columns = choice_columns(row, [sum(lps) for lps in output.continuation_logprobs])
        expected = hf_choice_loglikelihoods(hf_model, tokenizer, ROWS[number]["question"], row.choices)
        assert columns["loglikelihoods"] == pytest.approx(expected, abs=TOL)
        assert (columns["correct"], columns["correct_norm"]) == lm_eval_acc(expected, row.choices, row.gold)
