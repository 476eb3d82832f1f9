"""OpenAI Batch API files: /v1/chat/completions request lines out, output and error lines back.

Request line: {"custom_id", "method": "POST", "url": "/v1/chat/completions", "body": {chat completion}}.
Output line:  {"id", "custom_id", "response": {"status_code", "request_id", "body": chat.completion},
               "error": null}
Error line:   {"id", "custom_id", "response": null, "error": {"code", "message"}}
(OpenAI API reference, "Batch": request input object / request output object.)
"""

from __future__ import annotations

from bulkrun.io.provider_batch.model import BatchSampling, ParsedLine, RowRefused, UnsupportedOption

NAME = "openai"
URL = "/v1/chat/completions"
# OpenAI API reference, "Create batch" (input_file_id): "The file can contain up to 50,000 requests,
# and can be up to 200 MB in size." MB taken as 10^6 bytes, the smaller reading.
MAX_REQUESTS = 50_000
MAX_BYTES = 200 * 1000 * 1000
FILE_OVERHEAD_BYTES = 0  # the file is the JSONL itself
NATIVE_N = True  # `n` choices per request
MAX_STOP = 4  # chat completions: "Up to 4 sequences where the API will stop generating"
ROLES = ("system", "developer", "user", "assistant")
# Error codes after which the same request may well succeed: the row is not at fault.
RETRYABLE_CODES = {
    "batch_expired",
    "batch_cancelled",
    "request_timeout",
    "rate_limit_exceeded",
    "server_error",
}


def check_sampling(sampling: BatchSampling) -> None:
    if sampling.top_k > 0:
        raise UnsupportedOption("openai batch requests have no top_k; rerun the export without --top-k")
    if sampling.min_p > 0:
        raise UnsupportedOption("openai batch requests have no min_p; rerun the export without --min-p")
    if not 0 <= sampling.temperature <= 2:
        raise UnsupportedOption(f"openai temperature must be within 0..2, got {sampling.temperature}")
    if len(sampling.stop) > MAX_STOP:
        raise UnsupportedOption(f"openai takes at most {MAX_STOP} stop sequences, got {len(sampling.stop)}")


def request(custom_id: str, model: str, messages: list[dict], sampling: BatchSampling) -> dict:
    for message in messages:
        if message.get("role") not in ROLES or not isinstance(message.get("content"), str):
            raise RowRefused("unsupported_message", f"openai: cannot send a {message.get('role')!r} message")
    body = {
        "model": model,
        "messages": [{"role": m["role"], "content": m["content"]} for m in messages],
        "max_completion_tokens": sampling.max_tokens,  # max_tokens is deprecated for chat completions
        "temperature": sampling.temperature,  # sent always: bulkrun's default (0) is not OpenAI's (1)
    }
    if sampling.top_p < 1.0:
        body["top_p"] = sampling.top_p
    if sampling.seed is not None:
        body["seed"] = sampling.seed
    if sampling.stop:
        body["stop"] = list(sampling.stop)
    if sampling.n > 1:
        body["n"] = sampling.n
    if sampling.response_format is not None:
        body["response_format"] = _response_format(sampling.response_format)
    return {"custom_id": custom_id, "method": "POST", "url": URL, "body": body}


def _response_format(fmt) -> dict:
    if fmt.kind == "json_object":
        return {"type": "json_object"}
    return {
        "type": "json_schema",
        "json_schema": {"name": fmt.name, "schema": fmt.schema, "strict": fmt.strict},
    }


def parse(obj: dict) -> ParsedLine:
    """One output- or error-file line. Raises KeyError/TypeError/ValueError for a malformed line."""
    custom_id = obj["custom_id"]
    if not isinstance(custom_id, str):
        raise TypeError("custom_id must be a string")
    error = obj.get("error")
    if error:
        code = str(error.get("code") or "provider_error")
        return ParsedLine(custom_id, [], error=_error(code, error.get("message")))
    response = obj["response"]
    status, body = int(response["status_code"]), response.get("body") or {}
    if status != 200:
        inner = body.get("error") or {}
        code = str(inner.get("code") or inner.get("type") or f"http_{status}")
        retryable = status in (408, 409, 429) or status >= 500 or code in RETRYABLE_CODES
        return ParsedLine(
            custom_id, [], error=(code, f"openai: HTTP {status}: {inner.get('message', '')}", retryable)
        )
    choices = body["choices"]
    usage = body.get("usage") or {}
    completion = usage.get("completion_tokens")
    # usage counts all choices together: per-choice counts are known only for a single choice
    per_choice = completion if len(choices) == 1 else None
    parsed = [(int(c["index"]), *_text_and_reason(c), per_choice) for c in choices]
    return ParsedLine(custom_id, sorted(parsed), prompt_tokens=usage.get("prompt_tokens"))


def _error(code: str, message) -> tuple[str, str, bool]:
    kind = "batch_canceled" if code == "batch_cancelled" else code  # one spelling for both providers
    return kind, f"openai: {message or code}", code in RETRYABLE_CODES


def _text_and_reason(choice: dict) -> tuple[str, str]:
    message = choice["message"]
    if message.get("content") is None and message.get("refusal"):  # a structured-output refusal
        return str(message["refusal"]), "refusal"
    return message.get("content") or "", str(choice.get("finish_reason") or "stop")
