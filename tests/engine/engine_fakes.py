"""Fast engine test doubles: a fake runner that keeps a fake KV cache and checks it, and a toy tokenizer.

The fake runner writes, for every computed token, a fingerprint of the whole prefix ending there into
the slot the block table names, and before computing it checks that every earlier position's slot holds
the fingerprint of this request's own prefix. A wrong block table, a bad prefix-cache hit or a write into
a shared block therefore fails loudly, while the "model" stays a pure function of the token ids.

With long_rope_after = N (a LongRoPE model) the fingerprints also say which factors computed them,
and every generating row must run on the factors transformers' Phi-3 would use: the long ones iff
the request holds more than N tokens; a block of one kind read by a request of the other fails.
"""

from __future__ import annotations

from bulkrun.engine.core.block_pool import BlockPool
from bulkrun.engine.core.runner_output import RunnerOutput
from bulkrun.engine.core.scheduler import Scheduler, SchedulerOutput

VOCAB = 64
SPECIAL = 0  # decodes to "<eos>", skipped with skip_special_tokens


def next_token(token_ids: list[int]) -> int:
    """The fake model's greedy choice: the last token plus one (63 -> 0, the special token)."""
    return (token_ids[-1] + 1) % VOCAB


def sampled_logprob(token_ids: list[int], token: int) -> float:
    return -((len(token_ids) + token) % 7) / 8


def score_logprob(prefix: list[int], token: int) -> float:
    """Log-probability the fake model gives `token` after `prefix`."""
    return -((sum(prefix) * 3 + len(prefix) + token) % 11) / 4


class ToyTokenizer:
    """Token t > 0 decodes to a letter (1 -> 'a', ..., 26 -> 'z', 27 -> ' ', 28.. -> 'A'..)."""

    eos_token_id = SPECIAL

    def decode(self, token_ids, skip_special_tokens: bool = False) -> str:
        return "".join(self.piece(t) for t in token_ids if not (skip_special_tokens and t == SPECIAL))

    @staticmethod
    def piece(t: int) -> str:
        if t == SPECIAL:
            return "<eos>"
        if t <= 26:
            return chr(ord("a") + t - 1)
        if t == 27:
            return " "
        return chr(ord("A") + (t - 28) % 26)

    def encode(self, text: str) -> list[int]:
        return [self._id(c) for c in text]

    @staticmethod
    def _id(c: str) -> int:
        if c == " ":
            return 27
        if c.islower():
            return ord(c) - ord("a") + 1
        return ord(c) - ord("A") + 28


class FakeRunner:
    def __init__(
        self, num_blocks=64, block_size=4, max_model_len=256, eos_token_ids=(SPECIAL,), long_rope_after=None
    ):
        self.num_blocks = num_blocks
        self.long_rope_after = long_rope_after
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.eos_token_ids = set(eos_token_ids)
        self.vocab_size = VOCAB
        self.tokenizer = ToyTokenizer()
        self.pool: BlockPool | None = None  # set to check that writes only go to private blocks
        self.in_flight: dict[int, int] = {}  # the scheduler's blocks in flight (shared while filled)
        self.slots: dict[int, int] = {}  # slot -> fingerprint of the prefix ending there
        self.steps: list[list[tuple[str, int, int, bool]]] = []  # (id, start, n, sample) per step
        self.last_sampled: dict[str, int] = {}  # the previous step's tokens (inputs still pending)

    def execute(self, out: SchedulerOutput) -> RunnerOutput:
        result = RunnerOutput()
        written: set[int] = set()
        record = []
        bs = self.block_size
        filling = set(self.in_flight.values())  # blocks this step fills, which later rows may share
        for source, destination, n in out.kv_copies:  # first, as the real runner does
            for i in range(n):
                if source * bs + i in self.slots:
                    self.slots[destination * bs + i] = self.slots[source * bs + i]
                else:
                    self.slots.pop(destination * bs + i, None)
        for req, start, n, sample in out.rows():
            end = start + n
            record.append((req.request_id, start, n, sample))
            ids = token_ids_through(req, end, self.last_sampled)
            assert 0 < n and end <= len(ids), (req.request_id, start, n)
            assert len(req.block_table) * self.block_size >= end, "block table too short"
            if self.long_rope_after is not None and req.generates:
                assert req.long_rope == (len(ids) > self.long_rope_after), (req.request_id, "rope factors")
            prints = fingerprints(ids[:end], salt=req.long_rope)
            for p in range(start):
                assert self.slots.get(self.slot(req, p)) == prints[p], f"{req.request_id}: stale KV at {p}"
            for p in range(start, end):
                slot = self.slot(req, p)
                assert slot not in written, "two tokens written to one slot in a step"
                if self.pool is not None:  # shared only by rows of this step that read what it writes
                    block = slot // self.block_size
                    assert self.pool.ref_counts[block] == 1 or block in filling, "write into a shared block"
                written.add(slot)
                self.slots[slot] = prints[p]
            if sample:
                assert end == len(ids)
                token = next_token(ids)
                result.sampled[req.request_id] = token
                if req.params.logprobs:
                    result.sampled_logprobs[req.request_id] = sampled_logprob(ids, token)
            state = req.scoring
            if state is not None and state.score_start is not None:
                ids = req.token_ids
                first = max(start, state.score_start - 1)
                scores = [
                    score_logprob(ids[: p + 1], ids[p + 1]) for p in range(first, min(end, len(ids) - 1))
                ]
                if scores:
                    result.score_logprobs[req.request_id] = scores
            if state is not None and state.first_token_ids is not None and end == len(req.token_ids):
                prefix = req.token_ids
                result.first_token_logprobs[req.request_id] = [
                    score_logprob(prefix, t) for t in state.first_token_ids
                ]
        self.steps.append(record)
        self.last_sampled = dict(result.sampled)
        return result

    def slot(self, req, position: int) -> int:
        return req.block_table[position // self.block_size] * self.block_size + position % self.block_size


def token_ids_through(req, end: int, last_sampled: dict[str, int]) -> list[int]:
    """req's token ids, with the token still in flight from the previous step when the step
    computes its position (async scheduling: the scheduler has not applied it yet)."""
    ids = req.token_ids
    if end > len(ids) and req.num_pending_tokens:
        return ids + [last_sampled[req.request_id]]
    return ids


def fingerprints(token_ids: list[int], salt: bool = False) -> list[int]:
    out, h = [], 17 + salt
    for t in token_ids:
        h = hash((h, t))
        out.append(h)
    return out


def reference_generation(prompt: list[int], max_tokens: int, eos=(SPECIAL,), max_len=10**9) -> list[int]:
    """What a one-request-at-a-time greedy loop with the fake model produces."""
    ids = list(prompt)
    while True:
        token = next_token(ids)
        ids.append(token)
        if token in eos or len(ids) - len(prompt) >= max_tokens or len(ids) >= max_len:
            return ids[len(prompt) :]


def reference_scores(prompt: list[int], continuation: list[int]) -> list[float]:
    ids = prompt + continuation
    return [score_logprob(ids[:i], ids[i]) for i in range(len(prompt), len(ids))]


def run_to_completion(sched: Scheduler, runner: FakeRunner, max_steps: int = 10_000) -> list:
    """Drive a scheduler the way the engine does; return finished requests in completion order."""
    finished = []
    for _ in range(max_steps):
        if not sched.has_unfinished():
            return finished
        out = sched.schedule()
        result = runner.execute(out) if len(out) else RunnerOutput()
        finished += sched.update(out, result)
    raise AssertionError("scheduler did not finish")


class SimulatedDeviceRunner:
    """A runner whose device work completes `device_seconds` after launch, on a worker thread
    that sleeps (outside the GIL): the host part (building the step's inputs from the persistent
    step state) is real, the "model" is the fake one (next token = last + 1). Steps run on the
    worker in launch order, as on a device queue, so a step reads the previous step's tokens
    there, as the real runner reads them on the device."""

    def __init__(self, device_seconds: float, num_blocks=4096, block_size=16, max_model_len=4096):
        from concurrent.futures import ThreadPoolExecutor

        from bulkrun.engine.worker.step_inputs import StepBuilder

        self.device_seconds = device_seconds
        self.num_blocks, self.block_size, self.max_model_len = num_blocks, block_size, max_model_len
        self.eos_token_ids = {SPECIAL}
        self.vocab_size = VOCAB
        self.tokenizer = ToyTokenizer()
        self.runs_asynchronously = True
        self.state = StepBuilder(block_size)
        self._device = ThreadPoolExecutor(max_workers=1)
        self._prev_ids: list[str] = []  # the last launched step's sample rows (host side)
        self._prev_tokens: list[int] = []  # the same step's tokens (device side)

    def launch(self, out: SchedulerOutput):
        prev = dict(zip(self._prev_ids, range(len(self._prev_ids)), strict=True))
        inputs = self.state.build(out, prev)
        ids = [r.request_id for r in inputs.sample_requests]
        self._prev_ids = ids
        return _SimulatedStep(self._device.submit(self._run, inputs, ids))

    def _run(self, inputs, ids: list[str]) -> RunnerOutput:
        import time

        time.sleep(self.device_seconds)
        input_ids = inputs.input_ids.tolist()
        for at, row in zip(inputs.pending_at.tolist(), inputs.pending_rows.tolist(), strict=True):
            input_ids[at] = self._prev_tokens[row]
        rows = inputs.logits_indices.tolist()[: len(ids)]
        tokens = [(input_ids[row] + 1) % VOCAB for row in rows]
        self._prev_tokens = tokens
        return RunnerOutput(sampled=dict(zip(ids, tokens, strict=True)))

    def execute(self, out: SchedulerOutput) -> RunnerOutput:
        return self.launch(out).result()


class _SimulatedStep:
    def __init__(self, future):
        self._future = future

    def result(self) -> RunnerOutput:
        return self._future.result()
