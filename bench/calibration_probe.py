"""Raw vs contextually calibrated label scoring on the shipped tickets, for a few prompt choices.

Every variant renders the tickets exactly as `bulkrun classify` does (ClassifyTask's instruction and
`Text:` line, the chat template with its default system prompt, the answer begun with `Label:`) and
scores every label in the engine. The content-free inputs ("N/A", "[MASK]", "") are rendered in the
same prompt; their mean normalized label probabilities are the prior that calibration divides out.
Prints accuracy (raw, calibrated), the prior and the predicted-label counts per variant.

    .venv/bin/python bench/calibration_probe.py [--variants shipped,mean,...] [--items 100]
"""

from __future__ import annotations

import argparse
import json
import tomllib
from collections import Counter
from importlib.resources import files
from pathlib import Path

from bulkrun.engine.core.config import EngineConfig
from bulkrun.engine.core.engine import Engine
from bulkrun.engine.load import load_engine
from bulkrun.engine.core.params import SamplingParams
from bulkrun.model_source import resolve_model
from bulkrun.tasks.base import Item, TaskContext
from bulkrun.tasks.calibration import DEFAULT_CONTENT_FREE_INPUTS, Calibrator
from bulkrun.tasks.classify import ClassifyTask

PLACEHOLDER = "\x00"
ROOT = Path(__file__).resolve().parent.parent
# Made-up tickets, one per label, none from the evaluated set.
EXAMPLES = [
    {"text": "I was charged twice for my subscription this month.", "label": "billing"},
    {"text": "The export button throws an error and nothing downloads.", "label": "bug"},
    {"text": "Could you add a dark mode to the web app?", "label": "feature"},
    {"text": "My parcel has said 'in transit' for two weeks.", "label": "shipping"},
    {"text": "I can't reset my password, the reset email never arrives.", "label": "account"},
]


def shipped_labels() -> list:
    spec = tomllib.loads((ROOT / "jobs" / "classify-tickets.toml").read_text(encoding="utf-8"))
    return spec["labels"]


def variant_options(name: str) -> dict:
    labels = shipped_labels()
    options = {"labels": labels, "normalize": "sum"}
    if name == "shipped":  # the shipped job spec as is
        return options
    if name == "mean":
        return {**options, "normalize": "mean"}
    if name == "no_descriptions":
        return {**options, "labels": [entry["name"] for entry in labels]}
    if name == "examples":
        return {**options, "examples": EXAMPLES}
    if name == "examples_mean":
        return {**options, "examples": EXAMPLES, "normalize": "mean"}
    raise SystemExit(f"unknown variant {name!r}")


def load_tickets(limit: int) -> list[dict]:
    text = files("bulkrun.data").joinpath("tickets.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines()][:limit]


def prompt_ids(tokenizer, text: str) -> list[int]:
    """The chat prompt exactly as the job layer builds it (user message, generation prompt)."""
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
    )
    return list(tokenizer(chat, add_special_tokens=False)["input_ids"])


def label_scores(engine: Engine, task: ClassifyTask, texts: list[str]) -> list[list[float]]:
    """Per text, each label's score (ClassifyTask's sum or mean of token log-probabilities)."""
    requests = []
    for number, text in enumerate(texts):
        item = Item(number, str(number), {"text": PLACEHOLDER})
        # Rendered around a placeholder: render() refuses the empty text, a content-free input.
        rendered = task.render(item).replace(PLACEHOLDER, text)
        for request in task.requests(item, prompt_ids(engine.tokenizer, rendered)):
            request.request_id = str(number)
            requests.append(request)
    outputs = engine.generate(requests)
    return [list(task.label_columns(output)["label_scores"].values()) for output in outputs]


def accuracy(predicted: list[str], gold: list[str]) -> float:
    return sum(p == g for p, g in zip(predicted, gold, strict=True)) / len(gold)


def probe(engine: Engine, name: str, rows: list[dict], content_free: list[str]) -> dict:
    task = ClassifyTask.from_options(variant_options(name))
    task.bind(TaskContext(engine.tokenizer, engine.max_model_len, SamplingParams()))
    names = task.labels.names
    scores = label_scores(engine, task, [r["text"] for r in rows])
    calibrator = Calibrator.from_content_free(label_scores(engine, task, content_free))
    results = [calibrator(s) for s in scores]
    gold = [r["label"] for r in rows]
    raw = [names[c.best_raw] for c in results]
    cal = [names[c.best] for c in results]
    # For comparison only: the prior taken from the items themselves (batch calibration).
    batch = Calibrator(
        tuple(sum(column) / len(results) for column in zip(*(c.raw for c in results), strict=True))
    )
    batch_predicted = [names[batch(s).best] for s in scores]
    return {
        "variant": name,
        "raw_accuracy": accuracy(raw, gold),
        "calibrated_accuracy": accuracy(cal, gold),
        "batch_accuracy": accuracy(batch_predicted, gold),
        "prior": dict(zip(names, (round(p, 3) for p in calibrator.prior), strict=True)),
        "raw_counts": dict(Counter(raw)),
        "calibrated_counts": dict(Counter(cal)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variants", default="shipped,mean,no_descriptions,examples,examples_mean")
    ap.add_argument("--items", type=int, default=100)
    ap.add_argument(
        "--content-free",
        default="|".join(DEFAULT_CONTENT_FREE_INPUTS),
        help="content-free inputs separated by '|' (default: the paper's N/A|[MASK]|<empty>)",
    )
    args = ap.parse_args()
    engine = load_engine(str(resolve_model("smollm2-135m-instruct")), EngineConfig())
    rows = load_tickets(args.items)
    print(f"content-free inputs {args.content_free.split('|')}")
    print(f"{len(rows)} tickets, gold labels {dict(Counter(r['label'] for r in rows))}")
    print(f"{'variant':<18} {'raw':>6} {'calibrated':>11} {'batch-cal.':>11}  content-free prior")
    for name in args.variants.split(","):
        found = probe(engine, name, rows, args.content_free.split("|"))
        print(
            f"{name:<18} {found['raw_accuracy']:>6.1%} {found['calibrated_accuracy']:>11.1%} "
            f"{found['batch_accuracy']:>11.1%}  {found['prior']}",
            flush=True,
        )
        print(f"{'':<18} raw counts {found['raw_counts']}  calibrated counts {found['calibrated_counts']}")


if __name__ == "__main__":
    main()
