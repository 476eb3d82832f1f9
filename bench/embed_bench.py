"""Embed benchmark: `bulkrun embed` against sentence-transformers' `encode`, same model, same texts.

Two workloads built from the shipped tickets: short tickets (one ticket each, a row number added so
no two are equal) and documents of ~400 tokens (tickets joined; all-MiniLM-L6-v2 reads its first 256
tokens, and both sides cut them there). Each round runs both sides as fresh processes, alternating,
from launch to exit: `bulkrun embed IN --out DIR` (the default model, its default dtype) and a Python
child that loads SentenceTransformer on the CPU, encodes and saves the vectors (fp32). Prints the
median launch-to-exit time, rows/s from it, the ratio, and per-row cosine between the two sides' vectors
(bulkrun's default dtype against sentence-transformers fp32; the target is >= 0.999, and a --dtype
float32 round gives the fp32-to-fp32 figure).

    .venv/bin/python bench/embed_bench.py [--tickets 2000] [--docs 500] [--rounds 3] [--dtype float32]
    .venv/bin/python bench/embed_bench.py --tickets 20 --docs 5 --rounds 1     # a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from importlib.resources import files
from pathlib import Path

import numpy as np

import bulkrun
from bulkrun.model_source import DEFAULT_EMBED_MODEL, resolve_model

ST_CHILD = """
import json, sys
import numpy as np
from sentence_transformers import SentenceTransformer
model_dir, inp, out = sys.argv[1:4]
model = SentenceTransformer(model_dir, device="cpu")
texts = [json.loads(line)["text"] for line in open(inp, encoding="utf-8")]
np.save(out, model.encode(texts, batch_size=32, convert_to_numpy=True))
"""


def tickets() -> list[str]:
    text = files("bulkrun.data").joinpath("tickets.jsonl").read_text(encoding="utf-8")
    return [json.loads(line)["text"] for line in text.splitlines()]


def short_rows(n: int) -> list[str]:
    base = tickets()
    return [f"#{i} {base[i % len(base)]}" for i in range(n)]


def documents(n: int, tokenizer, target_tokens: int = 400) -> list[str]:
    base, docs = tickets(), []
    for i in range(n):
        parts, k = [f"Document {i}."], i
        while len(tokenizer(" ".join(parts))["input_ids"]) < target_tokens:
            parts.append(base[k % len(base)])
            k += 7
        docs.append(" ".join(parts))
    return docs


def run_bulkrun(path: Path, out: Path, dtype: str | None, env: dict) -> float:
    shutil.rmtree(out, ignore_errors=True)
    cmd = [
        sys.executable,
        "-c",
        "from bulkrun.cli import main; main()",
        "embed",
        str(path),
        "--out",
        str(out),
        "-q",
    ]
    cmd += ["--dtype", dtype] if dtype else []
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, env=env)
    return time.perf_counter() - t0


def run_st(model_dir: Path, path: Path, out: Path, env: dict) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", ST_CHILD, str(model_dir), str(path), str(out)], check=True, env=env)
    return time.perf_counter() - t0


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def bench(
    name: str, texts: list[str], model_dir: Path, work: Path, rounds: int, dtype: str | None, env: dict
):
    slug = name.split()[-1]
    path = work / f"{slug}.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        for i, text in enumerate(texts):
            f.write(json.dumps({"id": str(i), "text": text}) + "\n")
    ours, theirs = [], []
    for r in range(rounds):  # alternating, the starting side swapped every round
        sides = [("bulkrun", ours), ("st", theirs)]
        for side, times in sides if r % 2 == 0 else reversed(sides):
            if side == "bulkrun":
                times.append(run_bulkrun(path, work / f"{slug}-out", dtype, env))
            else:
                times.append(run_st(model_dir, path, work / f"{slug}-st.npy", env))
    ids, got = bulkrun.embeddings(work / f"{slug}-out")
    want = np.load(work / f"{slug}-st.npy")[[int(i) for i in ids]]
    cos = cosines(got, want)
    mine, peer = statistics.median(ours), statistics.median(theirs)
    report = json.loads((work / f"{slug}-out" / "report.json").read_text())
    print(f"{name}: {len(texts)} rows, bulkrun dtype {report.get('dtype')}")
    print(f"  bulkrun embed          launch-to-exit {mine:7.2f} s  {len(texts) / mine:8.1f} rows/s")
    print(f"  sentence-transformers  launch-to-exit {peer:7.2f} s  {len(texts) / peer:8.1f} rows/s")
    print(f"  ratio (s-t / bulkrun)  {peer / mine:.2f}x   cosine min {cos.min():.6f} mean {cos.mean():.6f}")
    print(f"  rounds: bulkrun {[round(t, 2) for t in ours]}  s-t {[round(t, 2) for t in theirs]}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tickets", type=int, default=2000)
    parser.add_argument("--docs", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dtype", default=None, help="bulkrun's --dtype (default: its own default)")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    model_dir = resolve_model(DEFAULT_EMBED_MODEL)  # unzipped once, before any timing
    env = dict(os.environ)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    with tempfile.TemporaryDirectory(prefix="embed-bench-") as tmp:
        work = Path(tmp)
        bench("short tickets", short_rows(args.tickets), model_dir, work, args.rounds, args.dtype, env)
        bench(
            "~400-token documents",
            documents(args.docs, tokenizer),
            model_dir,
            work,
            args.rounds,
            args.dtype,
            env,
        )


if __name__ == "__main__":
    main()
