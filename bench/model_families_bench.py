"""Model-family benchmark: bulkrun's engine against transformers on a Gemma-3-shaped and a
Qwen3-MoE-shaped random-weight model, on this machine's CPU.

Each model is built from transformers' own config class with random weights (no hub), saved once to
a temporary folder, and run on the same prompts (random ids of 50-400 tokens, longer than the Gemma
shape's sliding window), greedy, up to --max-new new tokens: bulkrun's engine in-process (the
default CPU kernels and dtype, and fp32), and transformers `generate` in static left-padded batches of
16 (fp32). Reports tokens/s (medians over --repeats alternating rounds) and the ratio to transformers,
the fp32 outputs' agreement with transformers', and for the MoE shape the engine's expert load.

    .venv/bin/python bench/model_families_bench.py [--prompts 32] [--max-new 32] [--repeats 3]
    .venv/bin/python bench/model_families_bench.py --tiny        # a smoke run in seconds
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

# hidden / layers / heads in the proportions of Gemma 3 270M and Qwen3-30B-A3B, scaled down
SHAPES = {
    "gemma3": ("Gemma3TextConfig", dict(
        vocab_size=32000, hidden_size=640, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=4,
        num_key_value_heads=1, head_dim=256, sliding_window=128, query_pre_attn_scalar=256)),
    "qwen3_moe": ("Qwen3MoeConfig", dict(
        vocab_size=32000, hidden_size=512, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8,
        num_key_value_heads=2, head_dim=64, num_experts=32, num_experts_per_tok=4, moe_intermediate_size=256,
        norm_topk_prob=True)),
}  # fmt: skip
TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, moe_intermediate_size=32,
            num_experts=8, sliding_window=16)  # fmt: skip


def make_model(kind: str, folder: Path, tiny: bool):
    import transformers
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    name, settings = SHAPES[kind]
    settings = {**settings, **({k: v for k, v in TINY.items() if k in settings} if tiny else {})}
    config = getattr(transformers, name)(**settings, max_position_embeddings=2048, eos_token_id=2, bos_token_id=1,
                                         pad_token_id=0)  # fmt: skip
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    model.save_pretrained(folder)
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2} | {f"w{i}": i for i in range(3, config.vocab_size)}
    tok = Tokenizer(WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = Whitespace()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                                pad_token="<pad>", unk_token="<pad>")  # fmt: skip
    fast.save_pretrained(folder)
    return model, config.vocab_size


def prompts(n: int, vocab: int, tiny: bool) -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    lo, hi = (5, 40) if tiny else (50, 400)
    return [torch.randint(3, vocab, (int(torch.randint(lo, hi, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]  # fmt: skip


def run_bulkrun(folder: Path, batch: list[list[int]], max_new: int, dtype: str | None):
    from bulkrun.engine.core.config import EngineConfig
    from bulkrun.engine.core.params import EngineRequest, SamplingParams
    from bulkrun.engine.load import load_engine

    engine = load_engine(str(folder), EngineConfig(dtype=dtype))
    requests = [EngineRequest(f"p{i}", ids, SamplingParams(max_tokens=max_new, ignore_eos=True))
                for i, ids in enumerate(batch)]  # fmt: skip
    steps = []
    start = time.perf_counter()
    outs = sorted(engine.stream(requests, on_step=steps.append), key=lambda o: int(o.request_id[1:]))
    seconds = time.perf_counter() - start
    load = [s.expert_tokens for s in steps if s.expert_tokens]
    totals = [sum(column) for column in zip(*load, strict=True)] if load else None
    return [o.output_token_ids for o in outs], seconds, totals


def run_transformers(model, batch: list[list[int]], max_new: int, group: int = 16):
    outs, start = [], time.perf_counter()
    for i in range(0, len(batch), group):
        part = batch[i : i + group]
        width = max(map(len, part))
        ids = torch.tensor([[0] * (width - len(p)) + p for p in part])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in part])
        with torch.no_grad():
            seq = model.generate(ids, attention_mask=mask, max_new_tokens=max_new, min_new_tokens=max_new,
                                 do_sample=False, pad_token_id=0)  # fmt: skip
        outs += [row[width:].tolist() for row in seq]
    return outs, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--max-new", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tiny", action="store_true", help="tiny shapes and few prompts: a smoke run")
    args = parser.parse_args()
    if args.tiny:
        args.prompts, args.max_new, args.repeats = 4, 8, 1
    for kind in SHAPES:
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            model, vocab = make_model(kind, folder, args.tiny)
            batch = prompts(args.prompts, vocab, args.tiny)
            new_tokens = len(batch) * args.max_new
            times = {"bulkrun default": [], "bulkrun fp32": [], "transformers fp32 static-16": []}
            for dtype in (None, "float32"):  # warm-up: first-call JIT work (oneDNN kernels) is not timed
                run_bulkrun(folder, batch[:2], 2, dtype)
            for _ in range(args.repeats):
                _, t, load = run_bulkrun(folder, batch, args.max_new, None)
                times["bulkrun default"].append(t)
                ours, t, _ = run_bulkrun(folder, batch, args.max_new, "float32")
                times["bulkrun fp32"].append(t)
                theirs, t = run_transformers(model, batch, args.max_new)
                times["transformers fp32 static-16"].append(t)
            same = sum(a == b for a, b in zip(ours, theirs, strict=True))
            peer = statistics.median(times["transformers fp32 static-16"])
            print(f"{kind}: {len(batch)} prompts x {args.max_new} new tokens")
            for name, ts in times.items():
                t = statistics.median(ts)
                print(f"  {name:30s} {new_tokens / t:8.1f} tok/s  {peer / t:5.2f}x transformers")
            print(f"  fp32 outputs equal to transformers': {same}/{len(batch)}")
            if load:
                print(f"  expert load (tokens per expert, last round, default dtype): {load}")


if __name__ == "__main__":
    main()
