"""The embedding pieces on their own: pooling, the encoder engine's packing, sentence-transformers
profiles, truncation, OpenAI embedding lines, vector shards, RoBERTa positions."""

from __future__ import annotations

import base64
import json

import numpy as np
import pyarrow as pa
import pytest
import torch

from bulkrun.engine.core.config import EngineConfig
from bulkrun.engine.core.encoder_engine import EncoderEngine, encoder_limits
from bulkrun.engine.core.params import EngineRequest, PoolingParams
from bulkrun.engine.worker.pooling import finish, pool_packed
from bulkrun.exceptions import RowError
from bulkrun.io.openai_batch import embedding_body, parse_request
from bulkrun.io.shards import records_table
from bulkrun.model.config import UnsupportedModelError
from bulkrun.model.sentence_transformers_config import read_embedding_profile
from bulkrun.tasks.embed import _truncate


def test_pool_packed_methods():
    hidden = torch.arange(12, dtype=torch.float32).view(6, 2)  # sequences of 1, 2 and 3 rows
    got = pool_packed(hidden, [1, 2, 3], ["mean", "cls", "last"])
    torch.testing.assert_close(got, torch.tensor([[0.0, 1.0], [2.0, 3.0], [10.0, 11.0]]))
    mean = pool_packed(hidden, [1, 2, 3], ["mean"] * 3)
    torch.testing.assert_close(mean[2], hidden[3:].mean(0))


def test_finish_cuts_then_normalizes_per_request():
    pooled = torch.tensor([[3.0, 4.0, 12.0], [3.0, 4.0, 12.0]])
    cut, plain = finish(pooled, [PoolingParams("mean", True, 2), PoolingParams("mean", False)])
    np.testing.assert_allclose(cut, [0.6, 0.8])  # the first 2 dimensions, then unit length
    np.testing.assert_allclose(plain, [3.0, 4.0, 12.0])


class _FakeRunner:
    tokenizer, max_model_len, vocab_size = None, 10, 100

    def __init__(self, tokens: int, seqs: int):
        self.limits = encoder_limits(EngineConfig(max_num_batched_tokens=tokens, max_num_seqs=seqs), "cpu")
        self.steps: list[list[str]] = []

    def embed(self, requests):
        self.steps.append([r.request_id for r in requests])
        return [np.full(2, len(r.prompt_token_ids), dtype=np.float32) for r in requests]


def test_encoder_engine_packs_in_order_under_the_budget():
    runner = _FakeRunner(tokens=8, seqs=3)
    pool = PoolingParams()
    lengths = [5, 3, 1, 1, 1, 1, 9, 2]
    requests = [EngineRequest(str(i), [1] * n, pooling=pool) for i, n in enumerate(lengths)]
    requests.insert(3, EngineRequest("gen", [1, 2]))  # not a pooling request: refused, the rest go on
    requests.insert(5, EngineRequest("long", [1] * 11, pooling=pool))  # longer than the model's 10
    outputs = list(EncoderEngine(runner).stream(requests))
    assert runner.steps == [["0", "1"], ["2", "3", "4"], ["5"], ["6"], ["7"]]  # 9 > budget: alone
    by_id = {o.request_id: o for o in outputs}
    assert by_id["gen"].finish_reason == "error" and "only embeds" in by_id["gen"].error
    assert by_id["long"].finish_reason == "error" and "longer than" in by_id["long"].error
    assert by_id["6"].finish_reason == "pooled" and by_id["6"].embedding[0] == 9


def _write(folder, name, obj):
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))


def test_sentence_transformers_profile(tmp_path):
    assert read_embedding_profile(tmp_path).pooling is None  # a plain directory says nothing
    _write(tmp_path, "modules.json", [{"path": "", "type": "sentence_transformers.models.Transformer"},
                                      {"path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
                                      {"path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}])  # fmt: skip
    _write(
        tmp_path, "1_Pooling/config.json", {"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}
    )
    _write(tmp_path, "sentence_bert_config.json", {"max_seq_length": 128})
    _write(
        tmp_path,
        "config_sentence_transformers.json",
        {"prompts": {"query": "q: "}, "default_prompt_name": "query"},
    )
    profile = read_embedding_profile(tmp_path)
    assert (profile.pooling, profile.normalize, profile.max_length) == ("cls", True, 128)
    assert profile.prompts == {"query": "q: "} and profile.default_prompt_name == "query"
    _write(tmp_path, "1_Pooling/config.json", {"pooling_mode_max_tokens": True})
    with pytest.raises(UnsupportedModelError, match="max_tokens"):
        read_embedding_profile(tmp_path)
    _write(tmp_path, "modules.json", [{"path": "2_Dense", "type": "sentence_transformers.models.Dense"}])
    with pytest.raises(UnsupportedModelError, match="Dense"):
        read_embedding_profile(tmp_path)


def test_truncation_keeps_the_trailing_special_tokens():
    assert _truncate([101, 1, 2, 3, 4, 102], 4, tail=1) == [101, 1, 2, 102]
    assert _truncate([1, 2, 3, 4], 2, tail=0) == [1, 2]


def _line(body):
    return {"custom_id": "x", "url": "/v1/embeddings", "body": {"model": "m", **body}}


def test_openai_embedding_lines():
    fields = parse_request(_line({"input": ["one text"], "dimensions": 8, "encoding_format": "base64"}))
    assert (fields["input"], fields["dimensions"], fields["encoding_format"]) == ("one text", 8, "base64")
    for bad in ({"input": ["a", "b"]}, {"input": 3}, {"input": "a", "dimensions": 0},
                {"input": "a", "encoding_format": "int8"}):  # fmt: skip
        with pytest.raises(RowError):
            parse_request(_line(bad))
    vector = np.array([0.5, -1.25], dtype=np.float32)
    body = embedding_body({"embedding": vector, "prompt_tokens": 3, "encoding_format": "base64"}, "m")
    decoded = np.frombuffer(base64.b64decode(body["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_array_equal(decoded, vector)
    assert body["usage"] == {"prompt_tokens": 3, "total_tokens": 3}


def test_vector_records_become_a_fixed_size_list_column():
    records = [{"row": i, "embedding": np.full(3, i, dtype=np.float16)} for i in range(2)]
    assert records_table(records).schema.field("embedding").type == pa.list_(pa.float16(), 3)
    ragged = [
        {"row": 0, "embedding": np.zeros(2, np.float32)},
        {"row": 1, "embedding": np.zeros(3, np.float32)},
    ]
    assert pa.types.is_list(records_table(ragged).schema.field("embedding").type)


def test_roberta_positions_match_transformers():
    from transformers.models.roberta.modeling_roberta import RobertaEmbeddings

    from bulkrun.model.bert import BertEncoder
    from bulkrun.model.encoder_config import EncoderConfig

    cfg = EncoderConfig.from_hf_dict({"model_type": "xlm-roberta", "vocab_size": 10, "hidden_size": 4,
                                      "intermediate_size": 8, "num_hidden_layers": 0, "num_attention_heads": 1,
                                      "max_position_embeddings": 20, "pad_token_id": 1})  # fmt: skip
    encoder = BertEncoder(cfg, attention=None)
    seqs = [[0, 5, 1, 6, 2], [0, 7, 2]]  # the first holds a pad token (id 1) inside it
    ids = torch.tensor([t for s in seqs for t in s])
    got = encoder.positions(ids, torch.tensor([0, 5, 8], dtype=torch.int32))
    want = [RobertaEmbeddings.create_position_ids_from_input_ids(torch.tensor([s]), 1)[0] for s in seqs]
    assert got.tolist() == torch.cat(want).tolist()
    assert cfg.max_model_len == 18
