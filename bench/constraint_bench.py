"""Grammar engines side by side: llguidance against xgrammar on this machine, default model.

For each library and each of 15 JSON schemas (plus a regex and a choice list) it measures:
  - tokenizer preparation (once per tokenizer: what a cache keyed by the tokenizer saves),
  - compile time per schema, cold (fresh tokenizer info) and with the tokenizer info cached,
  - coverage: does the schema compile, and is the greedy output under its mask valid (jsonschema),
  - mask time per token per sequence during real greedy decoding of JSON on the default model
    (transformers, fp32, KV cache), one row at a time, and for all rows filled as one parallel batch
    (the replay of those same token paths through the library's batch API).

    .venv/bin/python bench/constraint_bench.py [--max-new 96] [--only llguidance|xgrammar]

Timings are medians or sums over the run; the box is shared and noisy: read the ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import dataclass, field

import torch

from bulkrun.engine.structured_output.grammar import ConstraintSpec
from bulkrun.engine.structured_output.bitmask import apply_token_bitmask
from bulkrun.engine.structured_output.output import check_output
from bulkrun.model_source import resolve_model

ADDRESS = {
    "type": "object",
    "properties": {"street": {"type": "string"}, "city": {"type": "string"}, "zip": {"type": "string"}},
    "required": ["street", "city"],
}
SCHEMAS: dict[str, dict] = {
    "flat": {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    },
    "nested": {
        "type": "object",
        "properties": {
            "person": {
                "type": "object",
                "properties": {"name": {"type": "string"}, "address": ADDRESS},
                "required": ["name", "address"],
            }
        },
        "required": ["person"],
    },
    "enum": {
        "type": "object",
        "properties": {
            "color": {"enum": ["red", "green", "blue"]},
            "size": {"type": "string", "enum": ["S", "M", "L"]},
        },
        "required": ["color", "size"],
    },
    "array_bounds": {
        "type": "object",
        "properties": {"tags": {"type": "array", "items": {"type": "string"}, "minItems": 2, "maxItems": 4}},
        "required": ["tags"],
    },
    "number_ranges": {
        "type": "object",
        "properties": {
            "score": {"type": "number", "minimum": 0, "maximum": 1},
            "count": {"type": "integer", "minimum": 1, "maximum": 99},
        },
        "required": ["score", "count"],
    },
    "optional": {
        "type": "object",
        "properties": {"title": {"type": "string"}, "note": {"type": "string"}, "draft": {"type": "boolean"}},
        "required": ["title"],
    },
    "pattern": {
        "type": "object",
        "properties": {
            "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
            "phone": {"type": "string", "pattern": "^\\+?[0-9]{7,12}$"},
        },
        "required": ["sku", "phone"],
    },
    "ref_defs": {
        "$defs": {
            "item": {
                "type": "object",
                "properties": {"name": {"type": "string"}, "qty": {"type": "integer", "minimum": 1}},
                "required": ["name", "qty"],
            }
        },
        "type": "object",
        "properties": {
            "items": {"type": "array", "items": {"$ref": "#/$defs/item"}, "minItems": 1, "maxItems": 3}
        },
        "required": ["items"],
    },
    "one_of": {
        "type": "object",
        "properties": {
            "contact": {
                "oneOf": [
                    {
                        "type": "object",
                        "properties": {"email": {"type": "string", "format": "email"}},
                        "required": ["email"],
                        "additionalProperties": False,
                    },
                    {
                        "type": "object",
                        "properties": {"phone": {"type": "string"}},
                        "required": ["phone"],
                        "additionalProperties": False,
                    },
                ]
            }
        },
        "required": ["contact"],
    },
    "any_of": {
        "type": "object",
        "properties": {
            "value": {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 20}, {"type": "null"}]}
        },
        "required": ["value"],
    },
    "no_additional": {
        "type": "object",
        "properties": {"a": {"type": "string"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
        "additionalProperties": False,
    },
    "additional_typed": {"type": "object", "additionalProperties": {"type": "integer"}, "maxProperties": 3},
    "formats": {
        "type": "object",
        "properties": {
            "when": {"type": "string", "format": "date"},
            "at": {"type": "string", "format": "date-time"},
            "id": {"type": "string", "format": "uuid"},
        },
        "required": ["when", "id"],
    },
    "string_lengths": {
        "type": "object",
        "properties": {"code": {"type": "string", "minLength": 3, "maxLength": 5}},
        "required": ["code"],
    },
    "ticket": json.load(open(__file__.rsplit("/", 2)[0] + "/jobs/schemas/support-ticket.json")),
}
REGEX = r"[A-Z][a-z]+, [0-9]{1,3} (years|months) old"
CHOICE = ["positive", "negative", "neutral"]


@dataclass
class LibResult:
    tokenizer_s: float = 0.0
    compile_cold_s: dict[str, float] = field(default_factory=dict)
    compile_cached_s: dict[str, float] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    outcome: dict[str, str] = field(default_factory=dict)  # ok | truncated | invalid
    mask_s: list[float] = field(default_factory=list)  # one entry per (row, token)
    paths: dict[str, list[int]] = field(default_factory=dict)
    batch_mask_s: list[float] = field(default_factory=list)  # one entry per batched step
    batch_rows: list[int] = field(default_factory=list)


class Llg:
    name = "llguidance"

    def __init__(self, hf_tok, vocab):
        import llguidance
        import llguidance.hf
        import llguidance.torch as llt

        self.llg, self.llt, self.vocab = llguidance, llt, vocab
        self.tok = llguidance.hf.from_tokenizer(hf_tok, n_vocab=vocab)
        self.executor = llguidance.LLExecutor()

    def grammar(self, kind, spec):
        M = self.llg.LLMatcher
        if kind == "json":
            return M.grammar_from_json_schema(json.dumps(spec), defaults={"whitespace_flexible": False})
        if kind == "regex":
            return M.grammar_from_regex(spec)
        return M.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in spec))

    def compile(self, kind, spec):
        g = self.grammar(kind, spec)
        m = self.llg.LLMatcher(self.tok, g, log_level=0)
        if m.is_error():
            raise ValueError(m.get_error())
        return g

    def matcher(self, compiled):
        return self.llg.LLMatcher(self.tok, compiled, log_level=0)

    def new_bitmask(self, rows):
        return self.llt.allocate_token_bitmask(rows, self.vocab)

    def fill(self, m, bitmask, row):
        self.llt.fill_next_token_bitmask(m, bitmask, row)

    def fill_batch(self, matchers, bitmask):
        self.llt.fill_next_token_bitmask_par(self.executor, [(m, i) for i, m in enumerate(matchers)], bitmask)

    def accept(self, m, token):
        return m.consume_token(token)

    def done(self, m):
        return m.is_stopped()


class Xgr:
    name = "xgrammar"

    def __init__(self, hf_tok, vocab):
        import xgrammar

        self.xgr, self.vocab = xgrammar, vocab
        self.info = xgrammar.TokenizerInfo.from_huggingface(hf_tok, vocab_size=vocab)
        self.batch = xgrammar.BatchGrammarMatcher()

    def compile(self, kind, spec):
        c = self.xgr.GrammarCompiler(self.info, cache_enabled=False)
        if kind == "json":
            return c.compile_json_schema(json.dumps(spec), any_whitespace=False)
        if kind == "regex":
            return c.compile_regex(spec)
        return c.compile_grammar("root ::= " + " | ".join(json.dumps(s) for s in spec))

    def matcher(self, compiled):
        return self.xgr.GrammarMatcher(compiled)

    def new_bitmask(self, rows):
        return self.xgr.allocate_token_bitmask(rows, self.vocab)

    def fill(self, m, bitmask, row):
        m.fill_next_token_bitmask(bitmask, row)

    def fill_batch(self, matchers, bitmask):
        self.batch.batch_fill_next_token_bitmask(matchers, bitmask)

    def accept(self, m, token):
        return m.accept_token(token)

    def done(self, m):
        return m.is_terminated()


def constraints():
    yield from (("json", name, schema) for name, schema in SCHEMAS.items())
    yield "regex", "regex", REGEX
    yield "choice", "choice", CHOICE


def prompt_for(kind, name, spec) -> str:
    if kind == "json":
        return f"Write one JSON object that follows this JSON schema ({name}):\n{json.dumps(spec)}"
    if kind == "regex":
        return "Describe a person as 'Name, N years old'."
    return "Is this review positive, negative or neutral? 'Great value, fast delivery.'"


def spec_of(kind, spec) -> ConstraintSpec:
    if kind == "json":
        return ConstraintSpec.json_schema(spec)
    return ConstraintSpec.regex(spec) if kind == "regex" else ConstraintSpec.choice(spec)


@torch.no_grad()
def decode(lib, model, hf_tok, compiled, prompt_ids, max_new, res: LibResult) -> tuple[list[int], str]:
    """Greedy decoding under the mask; the mask fill of each step is timed."""
    m, bitmask = lib.matcher(compiled), lib.new_bitmask(1)
    ids, past, out = torch.tensor([prompt_ids]), None, []
    for _ in range(max_new):
        o = model(input_ids=ids, past_key_values=past, use_cache=True)
        past, logits = o.past_key_values, o.logits[:, -1, :].float()
        t0 = time.perf_counter()
        lib.fill(m, bitmask, 0)
        res.mask_s.append(time.perf_counter() - t0)
        apply_token_bitmask(logits, bitmask)  # ours for both: only the fill differs
        token = int(logits.argmax(-1))
        if not lib.accept(m, token):
            raise RuntimeError(f"{lib.name} rejected its own masked token {token}")
        if token == hf_tok.eos_token_id:
            return out, "stop"
        out.append(token)
        if lib.done(m):
            return out, "stop"
        ids = torch.tensor([[token]])
    return out, "length"


def replay_batched(lib, compiled: dict, res: LibResult) -> None:
    """All rows' token paths advanced together; each step's masks filled by one batch call."""
    names = list(res.paths)
    matchers = [lib.matcher(compiled[n]) for n in names]
    bitmask = lib.new_bitmask(len(names))
    for step in range(max(len(p) for p in res.paths.values())):
        live = [i for i, n in enumerate(names) if step < len(res.paths[n])]
        t0 = time.perf_counter()
        lib.fill_batch([matchers[i] for i in live], bitmask)
        res.batch_mask_s.append(time.perf_counter() - t0)
        res.batch_rows.append(len(live))
        for i in live:
            lib.accept(matchers[i], res.paths[names[i]][step])


def run_lib(cls, hf_tok, model, vocab, max_new) -> LibResult:
    res = LibResult()
    t0 = time.perf_counter()
    lib = cls(hf_tok, vocab)
    res.tokenizer_s = time.perf_counter() - t0
    compiled = {}
    for kind, name, spec in constraints():
        try:
            if not res.compile_cold_s:  # cold once: the tokenizer info built again, then the grammar
                t0 = time.perf_counter()
                cls(hf_tok, vocab).compile(kind, spec)
                res.compile_cold_s[name] = time.perf_counter() - t0
            t0 = time.perf_counter()
            compiled[name] = lib.compile(kind, spec)
            res.compile_cached_s[name] = time.perf_counter() - t0
        except Exception as e:  # noqa: BLE001 - an unsupported schema is a coverage result
            res.errors[name] = f"{type(e).__name__}: {str(e)[:120]}"
            continue
        chat = [{"role": "user", "content": prompt_for(kind, name, spec)}]
        prompt = hf_tok.apply_chat_template(
            chat, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        try:
            path, finish = decode(lib, model, hf_tok, compiled[name], list(prompt), max_new, res)
        except RuntimeError as e:
            res.errors[name] = str(e)
            continue
        res.paths[name] = path
        got = check_output(spec_of(kind, spec), hf_tok.decode(path), finish)
        res.outcome[name] = "ok" if got.ok else got.problem
    replay_batched(lib, compiled, res)
    return res


def report(name: str, res: LibResult) -> None:
    ms = lambda s: f"{s * 1e3:.2f} ms"  # noqa: E731
    total = len(list(constraints()))
    print(f"\n== {name}")
    print(f"tokenizer preparation (once per tokenizer): {ms(res.tokenizer_s)}")
    if res.compile_cold_s:
        cold, warm = list(res.compile_cold_s.values()), list(res.compile_cached_s.values())
        print(f"compile, cold (tokenizer info + grammar, {next(iter(res.compile_cold_s))}): {ms(cold[0])}")
        print(
            f"compile per schema, tokenizer cached:           median {ms(statistics.median(warm))}, max {ms(max(warm))}"
            f" ({max(res.compile_cached_s, key=res.compile_cached_s.get)})"
        )
    outcomes = list(res.outcome.values())
    print(
        f"coverage: {len(res.compile_cached_s)}/{total} compile; outputs (jsonschema): {outcomes.count('ok')} valid, "
        f"{outcomes.count('truncated')} cut by --max-new, {outcomes.count('invalid')} invalid"
    )
    for n, e in res.errors.items():
        print(f"  {n}: {e}")
    for n, o in res.outcome.items():
        if o == "invalid":
            print(f"  {n}: output invalid")
    if res.mask_s:
        print(
            f"mask per token per sequence (one row at a time, {len(res.mask_s)} tokens): "
            f"median {res.mask_s and ms(statistics.median(res.mask_s))}, "
            f"p99 {ms(sorted(res.mask_s)[int(len(res.mask_s) * 0.99)])}, mean {ms(statistics.fmean(res.mask_s))}"
        )
    if res.batch_mask_s:
        per_row = sum(res.batch_mask_s) / sum(res.batch_rows)
        print(
            f"mask per token per sequence, batched fill of up to {max(res.batch_rows)} rows: mean {ms(per_row)}"
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-new", type=int, default=96)
    ap.add_argument("--only", choices=["llguidance", "xgrammar"])
    ap.add_argument("--show", action="store_true", help="print each output")
    args = ap.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = str(resolve_model(None))
    hf_tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    vocab = model.config.vocab_size
    print(f"model {model_dir}, vocab {vocab}, torch {torch.__version__}, threads {torch.get_num_threads()}")
    for cls in (Llg, Xgr):
        if args.only and cls.name != args.only:
            continue
        res = run_lib(cls, hf_tok, model, vocab, args.max_new)
        report(cls.name, res)
        if args.show:
            for n, p in res.paths.items():
                print(f"  {n}: {hf_tok.decode(p)!r}")


if __name__ == "__main__":
    main()
