"""Run the Triton kernels on CUDA when there is one, else on the CPU through Triton's interpreter.

triton.jit picks interpreter or compiler when a function is decorated, which for triton's own library
(tl.max, tl.sum, ...) happens when triton is first imported. So without CUDA:
- we set TRITON_INTERPRET=1 here, before anything imports triton if we are first (e.g. this folder run
  alone). Leaving it set is harmless: only triton reads it, and without CUDA triton has no other use;
- if another test module imported triton earlier (transformers does), this process cannot interpret
  kernels any more; then every test here reports the outcome of one child pytest over this folder,
  started with the flag set. Setting the flag in tests/conftest.py avoids that detour.
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
HERE = Path(__file__).resolve().parent
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton.language.standard as _tl_standard  # noqa: E402  (after the flag, on purpose)

IN_PROCESS = HAS_CUDA or type(_tl_standard.max).__name__ == "InterpretedFunction"
DEVICES = ["cuda"] if HAS_CUDA else ["cpu"]


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    return request.param


def pytest_collection_modifyitems(config, items):
    if IN_PROCESS:
        return
    mine = [item for item in items if HERE in Path(str(item.fspath)).resolve().parents]
    child = _ChildRun(config.rootpath, config.cache.mkdir("kernels-child") if config.cache else None)
    for item in mine:
        item.runtest = lambda item=item: child.report(item)


class _ChildRun:
    """One interpreted pytest over this folder, run on first need; its outcomes keyed by test."""

    def __init__(self, rootpath: Path, workdir: Path | None):
        self.rootpath = rootpath
        self.workdir = workdir or Path(os.environ.get("TMPDIR", "/tmp"))
        self.outcomes: dict[tuple[str, str], tuple[str, str]] | None = None

    def report(self, item) -> None:
        if self.outcomes is None:
            self.outcomes = self._run()
        module = item.nodeid.split("::")[0].removesuffix(".py").replace("/", ".")
        outcome, text = self.outcomes.get((module, item.name), ("missing", ""))
        if outcome == "skipped":
            pytest.skip(f"(child run) {text}")
        if outcome != "passed":
            pytest.fail(f"child TRITON_INTERPRET=1 run: {outcome}\n{text}", pytrace=False)

    def _run(self) -> dict[tuple[str, str], tuple[str, str]]:
        xml_path = self.workdir / "junit.xml"
        xml_path.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "pytest", str(HERE), "-q", "-p", "no:cacheprovider", "-o", "addopts="]
        proc = subprocess.run(
            [*cmd, f"--junitxml={xml_path}"],
            cwd=self.rootpath,
            env={**os.environ, "TRITON_INTERPRET": "1"},
            capture_output=True,
            text=True,
        )
        if not xml_path.exists():
            pytest.fail(
                f"child kernel test run produced no report:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
            )
        outcomes = {}
        for case in ET.parse(xml_path).iter("testcase"):
            outcome, text = "passed", ""
            for tag in ("failure", "error", "skipped"):
                node = case.find(tag)
                if node is not None:
                    outcome = tag
                    text = (node.get("message") or "") + "\n" + (node.text or "")
                    break
            outcomes[(case.get("classname"), case.get("name"))] = (outcome, text)
        return outcomes


@pytest.fixture
def row_invariant_dot(device, monkeypatch):
    """Under the interpreter, tl.dot as a GPU's MMA computes it: every output element its own sum over
    K, the same whatever the other rows. The interpreter's own dot is numpy's BLAS matmul, whose
    kernels (OpenBLAS's, on AMD CPUs) reduce a row by its position in the tile and by M: the batch
    invariance tests would test the host's BLAS, not our tiling. einsum without optimize never calls
    BLAS. On CUDA: nothing to do."""
    if device != "cpu":
        return
    import numpy as np
    from triton.runtime import interpreter

    original = interpreter.InterpreterBuilder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if a.dtype.primitive_bitwidth == 8 or b.dtype.primitive_bitwidth == 8:  # fp8: the interpreter's path
            return original(self, a, b, d, input_precision, max_num_imprecise_acc)
        out = np.einsum("...ik,...kj->...ij", a.data, b.data, dtype=d.data.dtype, optimize=False)
        return interpreter.TensorHandle(out + d.data, d.dtype.scalar)

    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_dot", create_dot)
