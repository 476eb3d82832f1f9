"""Reasoning output: a model that thinks before it answers gets its thoughts in a `reasoning` column and
only the answer in `text`. Two formats, told apart by the vocabulary (`reasoning_format`):

- think (Qwen3 and its kin: `</think>` is one token). The output splits at the first `</think>`: before
  it (less a leading `<think>`) is the reasoning, after it the answer. An output that opened `<think>`
  (or whose prompt opened it: Qwen3-2507's templates do) and never closed it is all reasoning.
- harmony (gpt-oss: `<|channel|>` and `<|message|>` are single tokens). The output is a series of
  messages, `<|channel|>analysis<|message|>...<|end|><|start|>assistant<|channel|>final<|message|>
  ...<|return|>`; the answer is the final channel's content, the reasoning every other channel's
  (analysis, and commentary where the model writes one). These markers are special tokens, which the
  engine's text leaves out, so the split reads the output's token ids.

Either way, an output cut by max_tokens before its answer began has finish_reason
"length_in_reasoning", so a truncated thought is never passed off as an answer.
"""

from __future__ import annotations

OPEN, CLOSE = "<think>", "</think>"
LENGTH_IN_REASONING = "length_in_reasoning"
START, CHANNEL, CONSTRAIN, MESSAGE = "<|start|>", "<|channel|>", "<|constrain|>", "<|message|>"
_ENDS = ("<|end|>", "<|return|>", "<|call|>")
HARMONY_MARKERS = (START, CHANNEL, CONSTRAIN, MESSAGE, *_ENDS)
FINAL = "final"
_HEADER = "\0header"  # a piece of a message header (role, channel name, recipient): in no column
_OUTSIDE, _IN_HEADER, _IN_CHANNEL, _IN_CONTENT = range(4)  # where the parser is


def reasoning_format(tokenizer) -> Think | Harmony | None:
    """How this model's outputs split into reasoning and answer; None: it does not reason."""
    markers = {m: _single_token(tokenizer, m) for m in HARMONY_MARKERS}
    if markers[CHANNEL] is not None and markers[MESSAGE] is not None:
        return Harmony(tokenizer, {token: m for m, token in markers.items() if token is not None})
    return Think(tokenizer) if _single_token(tokenizer, CLOSE) is not None else None


def _single_token(tokenizer, text: str) -> int | None:
    try:
        ids = tokenizer.encode(text, add_special_tokens=False)
    except (AttributeError, TypeError, ValueError):
        return None
    return ids[0] if len(ids) == 1 else None


class Think:
    """`<think> ... </think>` then the answer."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def split(self, outputs) -> list[tuple[str, str, str | None]]:
        """(reasoning, answer, finish_reason) of each output of one prompt."""
        opened = bool(outputs) and prompt_opens_thinking(self.tokenizer, outputs[0].prompt_token_ids)
        return [split_think(o.text or "", o.finish_reason, opened) for o in outputs]


def split_think(text: str, finish_reason: str | None, prompt_opened: bool = False):
    """(reasoning, answer, finish_reason) of one output of a thinking model."""
    head, closed, tail = text.partition(CLOSE)
    if closed:
        return head.removeprefix(OPEN).lstrip("\n").rstrip(), tail.lstrip(), finish_reason
    stripped = text.lstrip()
    if prompt_opened or stripped.startswith(OPEN):  # the thought never ended
        return stripped.removeprefix(OPEN).strip(), "", _in_reasoning(finish_reason)
    return "", text, finish_reason  # answered without thinking (e.g. enable_thinking=false)


def prompt_opens_thinking(tokenizer, prompt_token_ids: list[int]) -> bool:
    """Whether the prompt's last think tag is an unclosed <think> (the template opened the thought)."""
    tail = tokenizer.decode(prompt_token_ids[-8:], skip_special_tokens=False)
    return tail.rfind(OPEN) > tail.rfind(CLOSE)


def _in_reasoning(finish_reason: str | None) -> str | None:
    return LENGTH_IN_REASONING if finish_reason == "length" else finish_reason


class Harmony:
    """gpt-oss's harmony messages; `markers`: token id -> marker, of those the vocabulary has."""

    def __init__(self, tokenizer, markers: dict[int, str]):
        self.tokenizer, self.markers = tokenizer, markers

    def split(self, outputs) -> list[tuple[str, str, str | None]]:
        """(reasoning, answer, finish_reason) of each output of one prompt."""
        return [
            self.split_one(o.prompt_token_ids, o.output_token_ids, o.text or "", o.finish_reason)
            for o in outputs
        ]

    def split_one(self, prompt_ids, output_ids, text: str, finish_reason: str | None):
        """`text`: the engine's (special tokens left out); where it is shorter than the output's
        tokens, a stop string cut it there."""
        parser = _HarmonyParser(self.markers, self.decode)
        parser.resume(prompt_ids)
        for token in output_ids:
            parser.feed(token)
        pieces = _cut_to([(kind, self.decode(ids)) for kind, ids in parser.pieces], text)
        answer = [t for kind, t in pieces if kind in (FINAL, None)]
        reasoning = "\n".join(t for kind, t in pieces if kind not in (FINAL, None, _HEADER) and t)
        reason = finish_reason if answer else _in_reasoning(finish_reason)
        return reasoning, "\n".join(answer), reason

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True) if ids else ""


class _HarmonyParser:
    """Follows tokens through harmony's messages and collects the output's runs of ordinary tokens,
    in order, as [kind, ids]: a message's content under its channel's name (None: text outside any
    message), a header's words (role, channel name, recipient) under _HEADER."""

    def __init__(self, markers: dict[int, str], decode):
        self.markers, self.decode = markers, decode
        self.where, self.channel, self.name = _OUTSIDE, None, []  # name: the channel's token ids
        self.pieces: list[list] = []
        self.current: list | None = None  # the piece ordinary tokens go to; None: a new one
        self.recording = False

    def resume(self, prompt_ids: list[int]) -> None:
        """Start where the prompt's last message leaves off (the chat template ends in a header)."""
        last = len(prompt_ids) - 1
        while last >= 0 and self.markers.get(prompt_ids[last]) != START:
            last -= 1
        for token in prompt_ids[last:] if last >= 0 else ():
            self.feed(token)
        self.recording, self.current = True, None
        if self.where == _IN_CONTENT:  # a message the prompt began: the output continues it
            self._open(self.channel)

    def feed(self, token: int) -> None:
        marker = self.markers.get(token)
        if marker is None:
            if self.where == _OUTSIDE:
                self.where, self.channel = _IN_CONTENT, None
            if self.where == _IN_CHANNEL:
                self.name.append(token)
            if self.current is None:
                self._open(self.channel if self.where == _IN_CONTENT else _HEADER)
            self.current[1].append(token)
            return
        self.current = None
        if marker == START:
            self.where, self.channel = _IN_HEADER, None
        elif marker == CHANNEL:
            self.where, self.name = _IN_CHANNEL, []
        elif marker == CONSTRAIN:
            self.where = _IN_HEADER
        elif marker == MESSAGE:
            words = self.decode(self.name).split()
            self.where, self.channel = _IN_CONTENT, words[0] if words else None
            self._open(self.channel)  # begun, empty until its first token
        else:  # the message ended
            self.where = _OUTSIDE

    def _open(self, kind: str | None) -> None:
        self.current = [kind, []]
        if self.recording:
            self.pieces.append(self.current)


def _cut_to(pieces: list[tuple], text: str) -> list[tuple]:
    """The pieces less the tail a stop string cut off: the engine's `text` is all the pieces' texts
    joined, or a prefix of that."""
    whole = "".join(t for _, t in pieces)
    if len(text) >= len(whole) or not whole.startswith(text):
        return pieces
    left, kept = len(text), []
    for kind, t in pieces:
        kept.append((kind, t[:left]))
        left = max(left - len(t), 0)
    return kept
