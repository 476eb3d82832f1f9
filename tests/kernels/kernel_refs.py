"""The implementations a Triton kernel is checked against: the naive loops here, and the CPU path
(bulkrun_kernels.reference)."""

from __future__ import annotations

import kernel_naive as naive

from bulkrun_kernels import reference

REF_NAMES = ["naive", "reference"]


def get_ref(name: str):
    return naive if name == "naive" else reference
