"""Provider batch files as each provider documents them: checks for request lines, and result lines
(successes, errors, expirations) built the way OpenAI's Batch API and Anthropic's Message Batches return them."""

import json
import re

ANTHROPIC_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")  # Message Batches: custom_id
OPENAI_BODY_KEYS = {
    "model",
    "messages",
    "max_completion_tokens",
    "max_tokens",
    "temperature",
    "top_p",
    "seed",
    "stop",
    "n",
    "response_format",
}
ANTHROPIC_PARAM_KEYS = {
    "model",
    "max_tokens",
    "messages",
    "system",
    "temperature",
    "top_p",
    "top_k",
    "stop_sequences",
    "output_config",
}


def check_openai_line(obj):
    assert set(obj) == {"custom_id", "method", "url", "body"}
    assert isinstance(obj["custom_id"], str) and obj["custom_id"]
    assert obj["method"] == "POST" and obj["url"] == "/v1/chat/completions"
    body = obj["body"]
    assert set(body) <= OPENAI_BODY_KEYS and {"model", "messages"} <= set(body)
    assert all(
        m["role"] in ("system", "developer", "user", "assistant") and isinstance(m["content"], str)
        for m in body["messages"]
    )


def check_anthropic_entry(obj):
    assert set(obj) == {"custom_id", "params"}
    assert ANTHROPIC_ID.match(obj["custom_id"])
    params = obj["params"]
    assert set(params) <= ANTHROPIC_PARAM_KEYS and {"model", "max_tokens", "messages"} <= set(params)
    assert isinstance(params["max_tokens"], int) and params["max_tokens"] >= 1
    assert params["messages"] and all(m["role"] in ("user", "assistant") for m in params["messages"])


def lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def write_lines(path, objs):
    path.write_text("".join(json.dumps(o) + "\n" for o in objs))
    return path


def openai_ok(custom_id, texts, reason="stop", prompt=7, completion=3):
    choices = [
        {
            "index": i,
            "message": {"role": "assistant", "content": t, "refusal": None},
            "finish_reason": reason,
            "logprobs": None,
        }
        for i, t in enumerate(texts)
    ]
    body = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": choices,
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
    }
    return {
        "id": "batch_req_1",
        "custom_id": custom_id,
        "error": None,
        "response": {"status_code": 200, "request_id": "req_1", "body": body},
    }


def openai_http_error(custom_id, status, err_type, code=None):
    body = {"error": {"message": "bad thing", "type": err_type, "param": None, "code": code}}
    return {
        "id": "batch_req_2",
        "custom_id": custom_id,
        "error": None,
        "response": {"status_code": status, "request_id": "req_2", "body": body},
    }


def openai_error_line(custom_id, code):
    return {
        "id": "batch_req_3",
        "custom_id": custom_id,
        "response": None,
        "error": {"code": code, "message": f"{code} happened"},
    }


def anthropic_ok(custom_id, text, stop_reason="end_turn"):
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "m",
        "content": [{"type": "text", "text": text}],
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {
            "input_tokens": 5,
            "output_tokens": 2,
            "cache_read_input_tokens": 4,
            "cache_creation_input_tokens": 0,
        },
    }
    return {"custom_id": custom_id, "result": {"type": "succeeded", "message": message}}


def anthropic_errored(custom_id, err_type):
    error = {"type": "error", "error": {"type": err_type, "message": "no good"}, "request_id": None}
    return {"custom_id": custom_id, "result": {"type": "errored", "error": error}}
