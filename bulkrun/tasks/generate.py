"""Free generation: one prompt per row, `--n` samples each (synthetic data), or OpenAI batch lines.

Every sample gets its own seed derived from (job seed, item id, sample index), so a resumed, re-sorted
or differently batched run draws exactly the same samples.

OpenAI batch rows carry their own sampling settings in `body`; those win over the job's settings
(max_tokens / max_completion_tokens, temperature, top_p, n, seed, stop; top_k and min_p too).
Result columns are lists (one entry per sample) for OpenAI rows and for --n > 1.
"""

from __future__ import annotations

from dataclasses import replace

from bulkrun.engine.core.outputs import RequestOutput
from bulkrun.engine.core.params import EngineRequest, SamplingParams
from bulkrun.io.openai_batch import CHAT_URL, EMBEDDINGS_URL
from bulkrun.tasks.base import Item, RawText, RowError, Task, generation_columns, prompt_text, sample_seed
from bulkrun.tasks.chat import row_messages
from bulkrun.tasks.constraints import has_json_column, is_openai_line, output_columns, row_constraint

_BODY_KEYS = ("temperature", "top_p", "top_k", "min_p", "seed")


class GenerateTask(Task):
    name = "generate"

    def render(self, item: Item) -> str | list[dict]:
        fields = item.fields
        if is_openai_line(fields):
            if fields["url"] == EMBEDDINGS_URL:
                raise RowError(
                    "unsupported_endpoint", f"{EMBEDDINGS_URL} lines are answered by `bulkrun embed`"
                )
            return fields["messages"] if fields["url"] == CHAT_URL else RawText(fields["prompt"])
        messages = row_messages(fields, self.ctx)
        if messages is not None:
            return messages
        return prompt_text(fields, self.ctx.prompt_template, self.ctx.text_field)

    def takes_constraints(self) -> bool:
        return True

    def requests(self, item: Item, prompt_ids: list[int]) -> list[EngineRequest]:
        params, n = self._params(item)
        params = replace(params, constraint=row_constraint(self.ctx, item))
        requests = []
        for k in range(n):
            sample = replace(params, seed=sample_seed(params.seed, item.id, k))
            requests.append(EngineRequest(str(k), prompt_ids, sample))
        return requests

    def result(self, item: Item, outputs: list[RequestOutput]) -> dict:
        openai = is_openai_line(item.fields)
        columns = generation_columns(outputs, self.ctx.n, as_lists=openai, reasoning=self.ctx.reasoning)
        as_list = openai or self.ctx.n > 1
        spec = row_constraint(self.ctx, item)
        columns |= output_columns(spec, outputs, has_json_column(self.ctx, item), as_list)
        if openai:
            columns["endpoint"] = item.fields["url"]
        return columns

    def _params(self, item: Item) -> tuple[SamplingParams, int]:
        params, n = self.ctx.sampling, self.ctx.n
        body = item.fields.get("body") if "custom_id" in item.fields else None
        if not body:
            return params, n
        changes = {key: body[key] for key in _BODY_KEYS if body.get(key) is not None}
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        if max_tokens is not None:
            changes["max_tokens"] = max_tokens
        stop = body.get("stop")
        if stop is not None:
            changes["stop"] = (stop,) if isinstance(stop, str) else tuple(stop)
        try:
            params = replace(params, **changes)
            n = int(body.get("n") or n)
        except (TypeError, ValueError) as exc:
            raise RowError("invalid_request", f"bad sampling settings in body: {exc}") from None
        if n < 1:
            raise RowError("invalid_request", f"n must be >= 1, got {n}")
        return params, n
