"""Token ids of a label as it would follow a given prompt.

A BPE tokenizer can merge across the prompt/label boundary, so tokenizing the label alone may give
other ids than the model would see. We tokenize (prompt tail + label) together and take the suffix,
after checking that the tail re-tokenizes to the prompt's own last ids and that those ids are a prefix
of the joint tokenization. Only a short tail is re-tokenized: merges never reach back further than the
last pre-token, and with a chat template every prompt ends alike, so the result is cached.
Where the prompt's ids are not a prefix (the label merges with the prompt's end) the label is
tokenized on its own and the fallback is counted.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

TAIL_LENGTHS = (4, 8, 16, 32)  # tails tried, shortest first: a tail starting mid-word may not verify
CACHE_SIZE = 4096


def label_text(prompt_tail_text: str, label: str) -> str:
    """The continuation text: a space after a prompt ending in a non-space (`Label:` -> ` bug`),
    the bare label after whitespace (a chat template's `assistant\\n`)."""
    if prompt_tail_text and not prompt_tail_text[-1].isspace():
        return " " + label
    return label


def on_new_line(prompt_tail_text: str, text: str) -> str:
    """`text` at the start of a line: a line break first unless the prompt ends in whitespace."""
    if prompt_tail_text and not prompt_tail_text[-1].isspace():
        return "\n" + text
    return text


@dataclass
class ContinuationTokenizer:
    tokenizer: object
    texts: tuple[str, ...]  # the labels (or any texts to follow the prompt)
    join: Callable[[str, str], str] = label_text  # (prompt tail text, text) -> what follows
    fallbacks: int = 0  # items whose labels had to be tokenized separately
    # tail ids -> (continuations, exact)
    _cache: OrderedDict = field(default_factory=OrderedDict)

    def __call__(self, prompt_ids: list[int]) -> list[list[int]]:
        """One id list per text, for a prompt of these ids."""
        found = None
        for length in TAIL_LENGTHS:
            tail = tuple(prompt_ids[-length:])
            found = self._cache.get(tail)
            if found is None:
                found = self._joint(list(tail))
                if found is not None:
                    self._remember(tail, found)
            else:
                self._cache.move_to_end(tail)
            if found is not None or len(tail) == len(prompt_ids):
                break
        if found is None:  # no tail re-tokenized to itself
            found = self._separate(prompt_ids[-TAIL_LENGTHS[-1] :])
        continuations, exact = found
        self.fallbacks += not exact
        return continuations

    def _joint(self, tail_ids: list[int]) -> tuple[list[list[int]], bool] | None:
        """Suffix ids of (tail + label); None when the tail alone does not re-tokenize to itself."""
        tail_text = self._decode(tail_ids)
        if self._encode(tail_text) != tail_ids:
            return None
        joint = [self._encode(tail_text + self.join(tail_text, label)) for label in self.texts]
        n = len(tail_ids)
        if all(ids[:n] == tail_ids and len(ids) > n for ids in joint):
            return [ids[n:] for ids in joint], True
        return self._separate(tail_ids)  # a merge across the boundary: a longer tail would hit it too

    def _separate(self, tail_ids: list[int]) -> tuple[list[list[int]], bool]:
        tail_text = self._decode(tail_ids)
        return [self._encode(self.join(tail_text, label)) for label in self.texts], False

    def _remember(self, tail: tuple[int, ...], value) -> None:
        self._cache[tail] = value
        if len(self._cache) > CACHE_SIZE:
            self._cache.popitem(last=False)

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def scoring_request(request_id: str, prompt_ids: list[int], continuations: list[list[int]],
                    max_model_len: int, what: str):  # fmt: skip
    """One engine request scoring every continuation after the prompt (its KV computed once); a
    prompt that cannot hold its longest continuation is a row error."""
    from bulkrun.engine.core.params import EngineRequest, SamplingParams
    from bulkrun.exceptions import RowError

    if len(prompt_ids) + max(len(c) for c in continuations) > max_model_len:
        raise RowError(
            "prompt_too_long",
            f"prompt of {len(prompt_ids)} tokens plus {what} exceeds the model's context of "
            f"{max_model_len} tokens",
        )
    return EngineRequest(
        request_id, list(prompt_ids), SamplingParams(max_tokens=0), continuations=continuations
    )
