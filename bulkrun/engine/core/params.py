"""What a caller asks of one request: sampling settings, optional continuation scoring, or pooling.

Plain Python (no torch): the scheduler and the job layer both use these.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class SamplingParams:
    max_tokens: int = 64
    temperature: float = 0.0  # 0 -> greedy
    top_k: int = 0  # 0 -> off
    top_p: float = 1.0  # 1 -> off
    min_p: float = 0.0  # 0 -> off
    seed: int | None = None  # per-request generator: output never depends on batch mates
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: bool = False  # return the log-probability of every generated token
    # a grammar.ConstraintSpec the output must match (a token mask before sampling); None: free
    constraint: object | None = None

    def __post_init__(self) -> None:
        if self.max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0.0 <= self.min_p < 1.0:
            raise ValueError(f"min_p must be in [0, 1), got {self.min_p}")
        self.stop = tuple(self.stop)
        self.stop_token_ids = tuple(self.stop_token_ids)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def plain_greedy(self) -> bool:
        """The token is the argmax and no log-probability is asked for: the screened greedy head's case."""
        return self.temperature == 0.0 and not self.logprobs


@dataclass(frozen=True, slots=True)
class PoolingParams:
    """An embedding request: its final hidden states pooled into one vector instead of a token."""

    method: str = "mean"  # "mean" | "cls" | "last" (decoder embedders: "last")
    normalize: bool = False  # unit L2 length (after the cut to `dimensions`)
    dimensions: int | None = None  # keep the first N (Matryoshka models), then normalize

    def __post_init__(self) -> None:
        if self.method not in ("mean", "cls", "last"):
            raise ValueError(f"pooling must be mean, cls or last, got {self.method!r}")
        if self.dimensions is not None and self.dimensions < 1:
            raise ValueError(f"dimensions must be >= 1, got {self.dimensions}")


@dataclass(slots=True)
class EngineRequest:
    """One unit of work handed to the engine.

    With `continuations` set, the engine generates nothing: it computes the prompt once and scores
    every continuation (a list of token ids) under it, sharing the prompt's KV blocks.
    """

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    continuations: list[list[int]] | None = None
    pooling: PoolingParams | None = None
