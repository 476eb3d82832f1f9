"""The whole model on the Triton kernels (CUDA, or Triton's interpreter on the CPU) equals the references.

The kernel tests check each op alone; this checks the model hands them what they expect (strided
q/k/v views of the fused projection, Qwen3's per-head norms, the packed metadata) over mixed steps.
"""

from __future__ import annotations

import importlib
import os
import sys

import pytest
import torch
from test_llama_vs_transformers import PagedRun
from helpers.models import VOCAB, build_tiny_model

from bulkrun.model.loader import load_model

pytest.importorskip("triton")
KERNEL_MODULES = ("paged_attention", "kv_write", "rmsnorm", "rotary", "activation")


def _triton_ops(device: str):
    """get_ops('triton'); without CUDA, (re)import the kernel modules under TRITON_INTERPRET=1."""
    if device == "cpu":
        saved = os.environ.get("TRITON_INTERPRET")
        os.environ["TRITON_INTERPRET"] = "1"
        try:
            for short in KERNEL_MODULES:
                name = f"bulkrun_kernels.{short}"
                module = sys.modules.get(name)
                kernel = (
                    None
                    if module is None
                    else next(v for n, v in vars(module).items() if n.endswith("_kernel"))
                )
                if module is None:
                    importlib.import_module(name)
                elif type(kernel).__name__ != "InterpretedFunction":
                    importlib.reload(module)
        finally:
            if saved is None:
                del os.environ["TRITON_INTERPRET"]
            else:
                os.environ["TRITON_INTERPRET"] = saved
    from bulkrun_kernels import get_ops

    return get_ops("triton", device)


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_triton_model_equals_reference_model(kind, tmp_path):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    build_tiny_model(kind, tmp_path)
    from bulkrun_kernels import get_ops

    reference = load_model(tmp_path, get_ops("reference"), torch.float32, torch.device(device))
    triton = load_model(tmp_path, _triton_ops(device), torch.float32, torch.device(device))
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, VOCAB, (n,), generator=gen).tolist() for n in (6, 9, 3)]
    results = []
    for model in (reference, triton):
        run = PagedRun(model, seed=1)
        reqs = [run.request(str(i), p) for i, p in enumerate(prompts)]
        first = run.step([(reqs[0], 6), (reqs[1], 5), (reqs[2], 3)])
        reqs[0].token_ids.append(7)
        reqs[2].token_ids.append(8)
        second = run.step([(reqs[0], 1), (reqs[1], 4), (reqs[2], 1)])
        results.append(torch.cat(first + second))
    torch.testing.assert_close(results[1], results[0], atol=2e-4, rtol=2e-4)
