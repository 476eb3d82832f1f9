"""Incremental detokenization for stop strings: decode only the newest tokens, with a few earlier
ones as context, so each step costs O(1) tokenizer work however long the output grows."""

from __future__ import annotations

from collections.abc import Sequence

_CONTEXT_TOKENS = 5  # earlier tokens decoded with the new ones so merges and spaces come out right


class StopStringMatcher:
    """Follows one request's output text and finds the first stop string in it."""

    __slots__ = ("tokenizer", "stops", "text", "stopped", "_prefix_offset", "_read_offset", "_max_stop_len")

    def __init__(self, tokenizer, stops: Sequence[str], num_prompt_tokens: int):
        self.tokenizer = tokenizer
        self.stops = tuple(s for s in stops if s)
        self.text = ""  # output text so far (special tokens skipped)
        self.stopped = False  # a stop string was found; text ends just before it
        # Start with the prompt's tail as context so the first output token decodes as it would
        # inside the full sequence (e.g. its leading space).
        self._prefix_offset = max(num_prompt_tokens - _CONTEXT_TOKENS, 0)
        self._read_offset = num_prompt_tokens
        self._max_stop_len = max((len(s) for s in self.stops), default=0)

    def update(self, token_ids: Sequence[int]) -> bool:
        """Take the request's full token ids after new tokens arrived. Returns True (and cuts
        `text` just before the stop string) when a stop string has appeared."""
        delta = self._decode_new(token_ids)
        if not delta or not self.stops:
            return False
        # Only a stop string that ends inside the new text can be new.
        search_from = max(len(self.text) - self._max_stop_len + 1, 0)
        self.text += delta
        cut = min((i for i in (self.text.find(s, search_from) for s in self.stops) if i >= 0), default=-1)
        if cut < 0:
            return False
        self.text = self.text[:cut]
        self.stopped = True
        return True

    def _decode_new(self, token_ids: Sequence[int]) -> str:
        decode = self.tokenizer.decode
        prefix = decode(token_ids[self._prefix_offset : self._read_offset], skip_special_tokens=True)
        full = decode(token_ids[self._prefix_offset :], skip_special_tokens=True)
        # An incomplete UTF-8 sequence decodes to U+FFFD: wait for the bytes that complete it.
        if len(full) <= len(prefix) or full.endswith("\ufffd"):
            return ""
        self._prefix_offset = self._read_offset
        self._read_offset = len(token_ids)
        return full[len(prefix) :]


def decode_output(tokenizer, token_ids: Sequence[int], num_prompt_tokens: int, end: int) -> str:
    """Text of token_ids[num_prompt_tokens:end], decoded with the prompt's tail as context so
    it matches what incremental decoding produces (special tokens skipped)."""
    start = max(num_prompt_tokens - _CONTEXT_TOKENS, 0)
    prefix = tokenizer.decode(token_ids[start:num_prompt_tokens], skip_special_tokens=True)
    full = tokenizer.decode(token_ids[start:end], skip_special_tokens=True)
    if full.startswith(prefix):
        return full[len(prefix) :]
    return tokenizer.decode(token_ids[num_prompt_tokens:end], skip_special_tokens=True)
