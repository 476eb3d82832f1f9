"""Anthropic Message Batches files: request entries out, results lines back.

Request entry (one per line; a batch's `requests` array is these lines):
    {"custom_id", "params": {"model", "max_tokens", "messages", "system", "temperature", "top_p",
                             "top_k", "stop_sequences", "output_config"}}
Results line (the batch's results_url, JSONL):
    {"custom_id", "result": {"type": "succeeded", "message": {"content": [{"type": "text", "text"}],
                                                              "stop_reason", "usage"}}}
    {"custom_id", "result": {"type": "errored", "error": {"type": "error", "error": {"type", "message"}}}}
    {"custom_id", "result": {"type": "canceled" | "expired"}}
(Anthropic API reference, "Create a Message Batch" and "Retrieve Message Batch results".)
"""

from __future__ import annotations

from bulkrun.io.provider_batch.model import BatchSampling, ParsedLine, RowRefused, UnsupportedOption

NAME = "anthropic"
# Anthropic docs, "Batch processing": a Message Batch is limited to either 100,000 Message requests
# or 256 MB in size, whichever is reached first. MB taken as 10^6 bytes, the smaller reading.
MAX_REQUESTS = 100_000
MAX_BYTES = 256 * 1000 * 1000
FILE_OVERHEAD_BYTES = len('{"requests":[]}')  # the lines are sent wrapped in one JSON body
NATIVE_N = False  # one sample per request: n samples become n requests
SYSTEM_ROLES = ("system", "developer")
TURN_ROLES = ("user", "assistant")
STOP_REASONS = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length"}
# Errors that are not the request's fault (Anthropic "Errors": 429, 500, 529 and timeouts).
RETRYABLE_TYPES = {"api_error", "overloaded_error", "rate_limit_error", "timeout_error"}


def check_sampling(sampling: BatchSampling) -> None:
    if sampling.min_p > 0:
        raise UnsupportedOption("anthropic message requests have no min_p; rerun the export without --min-p")
    if not 0 <= sampling.temperature <= 1:
        raise UnsupportedOption(f"anthropic temperature must be within 0..1, got {sampling.temperature}")
    fmt = sampling.response_format
    if fmt is not None and fmt.kind != "json_schema":
        raise UnsupportedOption(
            "anthropic structured outputs need a JSON schema (json_object has no equivalent)"
        )


def request(custom_id: str, model: str, messages: list[dict], sampling: BatchSampling) -> dict:
    system, turns = [], []
    for message in messages:
        role, content = message.get("role"), message.get("content")
        if not isinstance(content, str) or role not in SYSTEM_ROLES + TURN_ROLES:
            raise RowRefused("unsupported_message", f"anthropic: cannot send a {role!r} message")
        if role in SYSTEM_ROLES:
            system.append(content)
        else:
            turns.append({"role": role, "content": content})
    if not turns:
        raise RowRefused("invalid_request", "anthropic: a request needs at least one user message")
    params = {"model": model, "max_tokens": sampling.max_tokens, "messages": turns}
    if system:
        params["system"] = "\n\n".join(system)
    params["temperature"] = sampling.temperature  # sent always: bulkrun's default (0) is not Anthropic's (1)
    if sampling.top_p < 1.0:
        params["top_p"] = sampling.top_p
    if sampling.top_k > 0:
        params["top_k"] = sampling.top_k
    if sampling.stop:
        params["stop_sequences"] = list(sampling.stop)
    if sampling.response_format is not None:
        schema = sampling.response_format.schema
        params["output_config"] = {"format": {"type": "json_schema", "schema": schema}}
    # Anthropic has no seed: sampled answers cannot be reproduced there, whatever the job's seed.
    return {"custom_id": custom_id, "params": params}


def parse(obj: dict) -> ParsedLine:
    """One results line. Raises KeyError/TypeError/ValueError for a malformed line."""
    custom_id = obj["custom_id"]
    if not isinstance(custom_id, str):
        raise TypeError("custom_id must be a string")
    result = obj["result"]
    kind = result["type"]
    if kind == "succeeded":
        message = result["message"]
        text = "".join(block.get("text", "") for block in message["content"] if block.get("type") == "text")
        reason = str(message.get("stop_reason") or "stop")
        usage = message.get("usage") or {}
        prompt = _prompt_tokens(usage)
        return ParsedLine(
            custom_id, [(0, text, STOP_REASONS.get(reason, reason), usage.get("output_tokens"))], prompt
        )
    if kind == "errored":
        error = result.get("error") or {}
        error = error.get("error", error)  # the documented envelope {"type": "error", "error": {...}}
        error_type = str(error.get("type") or "provider_error")
        return ParsedLine(
            custom_id,
            [],
            error=(
                error_type,
                f"anthropic: {error.get('message', error_type)}",
                error_type in RETRYABLE_TYPES,
            ),
        )
    if kind in ("canceled", "expired"):
        message = f"anthropic: the batch {'was canceled' if kind == 'canceled' else 'expired'} before this request ran"
        return ParsedLine(custom_id, [], error=(f"batch_{kind}", message, True))
    raise ValueError(f"unknown result type {kind!r}")


def _prompt_tokens(usage: dict) -> int | None:
    """Every prompt token, wherever Anthropic's prompt cache put it (read, written or neither)."""
    parts = [usage.get(k) for k in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")]
    if parts[0] is None:
        return None
    return sum(int(p or 0) for p in parts)
