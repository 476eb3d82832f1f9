"""The implementations a Triton kernel is checked against: the naive loops here, and the CPU path
(bulkrun_kernels.reference) once it exists."""

from __future__ import annotations

import importlib
import importlib.util

import kernel_naive as naive
import pytest

REF_NAMES = ["naive", "reference"]


def get_ref(name: str):
    if name == "naive":
        return naive
    if importlib.util.find_spec("bulkrun_kernels.reference") is None:
        pytest.skip("bulkrun_kernels.reference has not landed yet")
    return importlib.import_module("bulkrun_kernels.reference")
