"""Classify benchmark: label scoring against generate-and-parse, on the shipped tickets, in one process.

Every method classifies the same items with the same prompts (ClassifyTask's instruction + ticket,
through the chat template) on the default model:
- bulkrun label scoring (every label scored as a continuation), prefix cache on and off;
- bulkrun generate-and-parse: greedy, a few new tokens, the answer parsed for a label;
- transformers `generate` and parse, at batch 1 and in left-padded batches.
Each bulkrun run starts with a cold prefix cache (a fresh Engine over the same loaded model), so a
repeat never reuses the previous repeat's items. Also prints the default model's accuracy on the
shipped set as measured, raw and calibrated against the content-free prior (the default: the
prior is scored once, before the items, as the job layer does); the prompts are not tuned to it.

    .venv/bin/python bench/classify_bench.py [--items 100] [--hf-batch1-items 24] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import time
from importlib.resources import files

import torch

from bulkrun.engine.core.config import EngineConfig
from bulkrun.engine.core.engine import Engine
from bulkrun.engine.load import load_engine
from bulkrun.job.stats import RunStats
from bulkrun.model_source import resolve_model
from bulkrun.engine.core.params import EngineRequest, SamplingParams
from bulkrun.tasks.base import Item, TaskContext
from bulkrun.tasks.classify import ClassifyTask
from bulkrun.tasks.labels import LabelSet


def load_tickets(limit: int) -> list[dict]:
    text = files("bulkrun.data").joinpath("tickets.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines()][:limit]


def chat_ids(tokenizer, text: str) -> list[int]:
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
    )
    return list(tokenizer(prompt, add_special_tokens=False)["input_ids"])


def parse_label(text: str, labels: tuple[str, ...]) -> str | None:
    """The label a generated answer names: the one it starts with, else the first one it mentions."""
    answer = text.strip().casefold()
    for label in labels:
        if answer.startswith(label.casefold()):
            return label
    hits = [
        (m.start(), label)
        for label in labels
        for m in [re.search(rf"\b{re.escape(label)}\b", answer, re.I)]
        if m
    ]
    return min(hits)[1] if hits else None


def timed(fn, repeats: int):
    """Median seconds over `repeats` runs, and the last run's result."""
    times, result = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def fresh_engine(base: Engine, prefix_cache: bool) -> Engine:
    """A new Engine (cold prefix cache) over the already loaded model runner."""
    return Engine(base.runner, EngineConfig(enable_prefix_caching=prefix_cache))


def bulkrun_scoring(base, task, prompts, prefix_cache: bool):
    engine = fresh_engine(base, prefix_cache)
    reqs = [r for i, p in enumerate(prompts) for r in _score_requests(task, i, p)]
    outputs, totals = run_counted(engine, reqs)
    columns = [task.label_columns(o) for o in outputs]
    return ([c["label"] for c in columns], [c["raw_label"] for c in columns]), totals


def calibrate(base, task, tokenizer) -> None:
    """The content-free prior, scored under the same prompt as the items (job/calibrate.py's work)."""
    prompts = [chat_ids(tokenizer, p) for p in task.content_free_prompts()]
    reqs = [r for i, p in enumerate(prompts) for r in _score_requests(task, i, p)]
    task.set_content_free(fresh_engine(base, True).generate(reqs))


def run_counted(engine: Engine, requests: list) -> tuple[list, dict]:
    """The outputs in request order, and the engine's figures over the run (one RunStats, fed
    by the engine loop's per-step callback)."""
    stats, hits = RunStats(), engine.scheduler.num_prefix_hit_tokens
    by_id = {o.request_id: o for o in engine.stream(requests, on_step=stats.on_step)}
    figures = {"scheduled_tokens": stats.scheduled_tokens, "steps": stats.steps,
               "mean_running_batch": stats.running_sum / max(stats.steps, 1),
               "prefix_cache_hit_tokens": engine.scheduler.num_prefix_hit_tokens - hits}  # fmt: skip
    return [by_id[r.request_id] for r in requests], figures


def _score_requests(task, index: int, prompt_ids: list[int]):
    for req in task.requests(Item(index, str(index), {}), prompt_ids):
        req.request_id = f"{index}"
        yield req


def bulkrun_generate(base, prompts, labels, max_new: int):
    engine = fresh_engine(base, prefix_cache=True)
    params = SamplingParams(max_tokens=max_new)
    outputs, totals = run_counted(engine, [EngineRequest(str(i), p, params) for i, p in enumerate(prompts)])
    return [parse_label(o.text, labels) for o in outputs], totals


@torch.no_grad()
def hf_generate(model, tokenizer, prompts, labels, max_new: int, batch: int):
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    predicted = []
    for start in range(0, len(prompts), batch):
        group = prompts[start : start + batch]
        width = max(map(len, group))
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in group])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in group])
        out = model.generate(
            ids, attention_mask=mask, max_new_tokens=max_new, do_sample=False, pad_token_id=pad
        )
        texts = tokenizer.batch_decode(out[:, width:], skip_special_tokens=True)
        predicted += [parse_label(t, labels) for t in texts]
    return predicted


def accuracy(predicted, expected) -> float:
    return sum(p == e for p, e in zip(predicted, expected, strict=True)) / len(expected)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--items", type=int, default=100, help="tickets to classify (the set has 100)")
    ap.add_argument("--hf-batch1-items", type=int, default=24, help="items for the slow batch-1 peer")
    ap.add_argument("--hf-batch", type=int, default=16, help="padded batch size for the transformers peer")
    ap.add_argument("--max-new", type=int, default=None, help="new tokens for generate-and-parse")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.manual_seed(0)

    rows = load_tickets(args.items)
    expected = [r["label"] for r in rows]
    labels = tuple(dict.fromkeys(expected))  # the set's labels, in order of first appearance
    base = load_engine(str(resolve_model(None)), EngineConfig())
    tokenizer = base.tokenizer
    task = ClassifyTask(LabelSet(labels))
    task.bind(TaskContext(tokenizer=tokenizer, max_model_len=base.max_model_len, sampling=SamplingParams()))
    calibrate(base, task, tokenizer)
    prompts = [chat_ids(tokenizer, task.render(Item(i, r["id"], r))) for i, r in enumerate(rows)]
    # Generate-and-parse gets the same prompts, the answer begun the same way (`Label:`).
    gen_prompts = [task.answer_start(p) for p in prompts]
    longest_label = max(len(c) for c in task.continuations(gen_prompts[0]))
    max_new = args.max_new or longest_label + 2  # the label, the end-of-turn token, one spare
    n = len(prompts)

    bulkrun_scoring(base, task, prompts[:8], True)  # warm-up (other prompts would do as well)
    figures = {}
    for name, cache in (("scoring", True), ("scoring_nocache", False)):
        secs, ((pred, raw), totals) = timed(
            lambda c=cache: bulkrun_scoring(base, task, prompts, c), args.repeats
        )
        figures[name] = (n / secs, accuracy(pred, expected), totals)
        raw_accuracy = accuracy(raw, expected)
    secs, (pred, totals) = timed(lambda: bulkrun_generate(base, gen_prompts, labels, max_new), args.repeats)
    figures["generate"] = (n / secs, accuracy(pred, expected), totals)
    unparsed = sum(p is None for p in pred)

    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(resolve_model(None), dtype=torch.float32).eval()
    k = min(args.hf_batch1_items, n)
    secs, pred = timed(lambda: hf_generate(hf, tokenizer, gen_prompts[:k], labels, max_new, 1), 1)
    figures["hf_batch1"] = (k / secs, accuracy(pred, expected[:k]), None)
    secs, pred = timed(lambda: hf_generate(hf, tokenizer, gen_prompts, labels, max_new, args.hf_batch), 1)
    figures["hf_padded"] = (n / secs, accuracy(pred, expected), None)
    report(figures, n, k, args, max_new, unparsed, prompts, task, raw_accuracy)


def report(figures, n, k, args, max_new, unparsed, prompts, task, raw_accuracy) -> None:
    gen_rate = figures["generate"][0]
    names = {
        "scoring": "bulkrun label scoring, calibrated (cache on)",
        "scoring_nocache": "bulkrun label scoring, calibrated (cache off)",
        "generate": f"bulkrun generate-and-parse ({max_new} new tokens)",
        "hf_batch1": f"transformers generate, batch 1 ({k} items)",
        "hf_padded": f"transformers generate, padded batch {args.hf_batch}",
    }
    mean_prompt = sum(map(len, prompts)) / len(prompts)
    print(
        f"\n{n} tickets, {len(task.labels)} labels, mean prompt {mean_prompt:.0f} tokens, "
        f"instruction {len(task.instruction)} chars, torch threads {torch.get_num_threads()}"
    )
    print(f"{'method':<48} {'items/s':>8} {'vs gen+parse':>13} {'accuracy':>9}")
    for key, label in names.items():
        rate, acc, _ = figures[key]
        print(f"{label:<48} {rate:>8.2f} {rate / gen_rate:>12.2f}x {acc:>8.1%}")
    on = figures["scoring"][2]
    gain = figures["scoring"][0] / figures["scoring_nocache"][0]
    print(
        f"\nprefix cache gain on label scoring: {gain:.2f}x (cache hit tokens {on['prefix_cache_hit_tokens']:.0f})"
    )
    print(f"{'engine work per item':<48} {'tokens':>8} {'steps':>8} {'mean batch':>11}")
    for key in ("scoring", "scoring_nocache", "generate"):
        t = figures[key][2]
        print(
            f"{names[key]:<48} {t['scheduled_tokens'] / n:>8.1f} {t['steps']:>8.0f} {t['mean_running_batch']:>11.1f}"
        )
    print(f"generate-and-parse answers with no label found: {unparsed}/{n}")
    print(
        f"default model accuracy on the shipped set (label scoring): raw {raw_accuracy:.1%}, "
        f"calibrated {figures['scoring'][1]:.1%} (content-free prior "
        + ", ".join(f"{name} {p:.2f}" for name, p in zip(task.labels, task.calibrator.prior, strict=True))
        + ")"
    )


if __name__ == "__main__":
    main()
