"""The engine's side of constrained decoding: the grammar cache of its tokenizer, and keeping each
constrained request's matcher in step with the tokens the request has really received. No torch.

Called at fixed points of Engine.step: `attach` at intake, `advance` when a step's tokens land, `release`
when a request's output is made. The runner fills and applies the masks (grammar_step.py); it reads the
matchers, which must have accepted every token before the step that samples the next one is launched:
so while a constrained request runs the engine schedules synchronously (`active`), and a token the
engine drops (a request that finished meanwhile) is simply never accepted.
"""

from __future__ import annotations

from typing import Any

from bulkrun.engine.core.request import Request
from bulkrun.engine.structured_output.grammar import DEFAULT_TIME_LIMIT_S, GrammarCache, GrammarTokenizer


class ConstrainedRequests:
    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int | None,
        eos_token_ids,
        time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    ):
        self._tokenizer, self._vocab_size = tokenizer, vocab_size
        self._eos = sorted(eos_token_ids)
        self._time_limit_s = time_limit_s
        self._cache: GrammarCache | None = None
        self.live: dict[str, Request] = {}

    @property
    def cache(self) -> GrammarCache:
        """Compiled grammars of this engine's tokenizer (prepared on first use: about a second)."""
        if self._cache is None:
            vocab = self._vocab_size or len(self._tokenizer)
            tokenizer = GrammarTokenizer.from_hf(self._tokenizer, vocab, self._eos)
            self._cache = GrammarCache(tokenizer, time_limit_s=self._time_limit_s)
        return self._cache

    @property
    def active(self) -> bool:
        return bool(self.live)

    def matcher(self, spec) -> Any:
        """A fresh matcher for `spec`; GrammarError (a ValueError) when it cannot be compiled."""
        return self.cache.matcher(spec)

    def attach(self, request: Request, matcher) -> None:
        request.grammar = matcher
        self.live[request.request_id] = request

    def advance(self, requests: list[Request], samples: list[bool], finished: list[Request], finish) -> None:
        """After a step landed: feed each constrained request's new tokens to its matcher; a request
        whose grammar can take nothing more finishes now (`finish(req, "stop")`), without waiting
        for the model to sample EOS."""
        for req, sample in zip(requests, samples, strict=True):
            matcher = req.grammar
            if matcher is None or not sample:
                continue
            if req.is_finished and req not in finished:
                continue  # finished before this step's token landed: the token was dropped
            for token in req.token_ids[req.num_prompt_tokens + matcher.num_accepted :]:
                if token in req.stop_token_set or not matcher.accept(token):
                    break
            if matcher.is_finished and not req.is_finished:
                finished.append(req)
                finish(req, "stop")

    def release(self, request_id: str) -> None:
        self.live.pop(request_id, None)
