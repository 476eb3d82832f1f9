"""OpenAI batch files: request lines in, output and error lines out, in OpenAI's own shapes.

Input line:  {"custom_id": "r1", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": "...", "messages": [...], "max_tokens": 64, ...}}
Output line: {"id": "batch_req_...", "custom_id": "r1", "error": null,
              "response": {"status_code": 200, "request_id": "...", "body": <chat.completion>}}
Error line:  {"id": "batch_req_...", "custom_id": "r1", "response": null,
              "error": {"code": "<kind>", "message": "..."}}
/v1/completions lines (body.prompt) are accepted too and answered as text_completion objects, and
/v1/embeddings lines (body.input: one text; body.dimensions, body.encoding_format "float" | "base64")
are answered as OpenAI's embedding list objects.
"""

from __future__ import annotations

import base64
import hashlib

from bulkrun.exceptions import RowError

CHAT_URL = "/v1/chat/completions"
COMPLETIONS_URL = "/v1/completions"
EMBEDDINGS_URL = "/v1/embeddings"
ROLES = {"system", "user", "assistant", "developer", "tool"}


def parse_request(obj: dict) -> dict:
    """The fields of one request line: custom_id, url, body, and messages or prompt."""
    custom_id = obj.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise RowError("invalid_request", "custom_id must be a non-empty string")
    try:
        return _parse_fields(obj, custom_id)
    except RowError as exc:
        exc.item_id = custom_id  # the error line keeps the request's custom_id
        raise


def _parse_fields(obj: dict, custom_id: str) -> dict:
    url = obj.get("url", CHAT_URL)
    body = obj.get("body")
    if not isinstance(body, dict):
        raise RowError("invalid_request", "body must be an object")
    method = obj.get("method", "POST")
    if method != "POST":
        raise RowError("invalid_request", f"method must be POST, got {method!r}")
    fields = {"custom_id": custom_id, "url": url, "body": body}
    if url == CHAT_URL:
        fields["messages"] = _messages(body.get("messages"))
    elif url == COMPLETIONS_URL:
        prompt = body.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            raise RowError("invalid_request", "body.prompt must be a non-empty string")
        fields["prompt"] = prompt
    elif url == EMBEDDINGS_URL:
        fields.update(_embedding_fields(body))
    else:
        raise RowError(
            "unsupported_endpoint",
            f"url {url!r} is not supported (use {CHAT_URL}, {COMPLETIONS_URL} or {EMBEDDINGS_URL})",
        )
    return fields


def _embedding_fields(body: dict) -> dict:
    text = body.get("input")
    if isinstance(text, list) and len(text) == 1:
        text = text[0]
    if not isinstance(text, str):
        raise RowError("invalid_request", "body.input must be one string (one text per request line)")
    if not text.strip():
        raise RowError("empty_text", "body.input is empty")
    fields = {"input": text, "encoding_format": body.get("encoding_format") or "float"}
    if fields["encoding_format"] not in ("float", "base64"):
        raise RowError("invalid_request", "body.encoding_format must be float or base64")
    dimensions = body.get("dimensions")
    if dimensions is not None:
        if isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 1:
            raise RowError("invalid_request", "body.dimensions must be a positive integer")
        fields["dimensions"] = dimensions
    return fields


def _messages(messages) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise RowError("invalid_request", "body.messages must be a non-empty list")
    out = []
    for message in messages:
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise RowError("invalid_request", "every message needs a role (system/user/assistant)")
        out.append({"role": message["role"], "content": _content_text(message.get("content"))})
    return out


def _content_text(content) -> str:
    """Message content as text; content parts of type "text" are joined (others are refused)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise RowError("invalid_request", "only text content parts are supported")
            texts.append(str(part.get("text", "")))
        return "".join(texts)
    raise RowError("invalid_request", "message content must be a string or text parts")


def _stable_id(prefix: str, custom_id: str) -> str:
    return prefix + hashlib.sha256(custom_id.encode()).hexdigest()[:24]


def output_line(record: dict, model: str, created: int) -> dict:
    """One output-file line from a result record (lists per sample: the job ran with n >= 1)."""
    body = embedding_body(record, model) if record.get("endpoint") == EMBEDDINGS_URL else None
    return _line(record["id"], body or _completion_body(record, model, created))


def embedding_body(record: dict, model: str) -> dict:
    """OpenAI's embeddings response (a list of one embedding object) for an embed result record."""
    vector = record["embedding"]
    if record.get("encoding_format") == "base64":  # little-endian float32, as OpenAI sends it
        import numpy as np

        data = base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
    else:
        data = [float(x) for x in vector]
    tokens = int(record.get("prompt_tokens") or 0)
    return {
        "object": "list",
        "data": [{"object": "embedding", "index": 0, "embedding": data}],
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def _completion_body(record: dict, model: str, created: int) -> dict:
    custom_id = record["id"]
    texts, reasons, generated = (_as_list(record[k]) for k in ("text", "finish_reason", "generated_tokens"))
    prompt_tokens = int(record.get("prompt_tokens") or 0)
    completion_tokens = sum(int(g or 0) for g in generated)
    chat = record.get("endpoint", CHAT_URL) == CHAT_URL
    choices = []
    for index, (text, reason) in enumerate(zip(texts, reasons, strict=True)):
        choice = {"index": index, "finish_reason": reason, "logprobs": None}
        if chat:
            choice["message"] = {"role": "assistant", "content": text, "refusal": None}
        else:
            choice["text"] = text
        choices.append(choice)
    return {
        "id": _stable_id("chatcmpl-" if chat else "cmpl-", custom_id),
        "object": "chat.completion" if chat else "text_completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def _line(custom_id: str, body: dict) -> dict:
    response = {"status_code": 200, "request_id": _stable_id("req_", custom_id), "body": body}
    return {
        "id": _stable_id("batch_req_", custom_id),
        "custom_id": custom_id,
        "response": response,
        "error": None,
    }


def error_line(record: dict) -> dict:
    custom_id = record.get("id") or f"row-{record['row']}"
    error = {"code": record["kind"], "message": f"row {record['row']}: {record['message']}"}
    return {
        "id": _stable_id("batch_req_", custom_id),
        "custom_id": custom_id,
        "response": None,
        "error": error,
    }


def _as_list(value) -> list:
    return list(value) if isinstance(value, list | tuple) else [value]
