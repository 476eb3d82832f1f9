"""Host data onto the device and device results back, without the host waiting for the device.

Everything a step sends or reads back crosses here, so a step launches without a host
synchronisation: host arrays go through pinned memory with an asynchronous copy (the caching host
allocator keeps a pinned block until the copy that reads it has run), and results come back into
pinned memory with an asynchronous copy that a StepHandle waits for only in result(). On the CPU
the host's memory is the device's: nothing is copied. Keeping every crossing in this one place is
also what lets tests/model/test_runner_syncs.py tell host tensors from device tensors on the CPU.
"""

from __future__ import annotations

import numpy as np
import torch


class Staging:
    def __init__(self, device: torch.device):
        self.device = device
        self.pinned = device.type == "cuda"

    def to_device(self, data: np.ndarray | torch.Tensor | list, dtype=None) -> torch.Tensor:
        """`data` (host) on the device; the copy is queued, the host goes on at once."""
        host = _host_tensor(data, dtype)
        if not self.pinned:
            return host
        return host.pin_memory().to(self.device, non_blocking=True)

    def to_host(self, tensor: torch.Tensor) -> torch.Tensor:
        """A host tensor that holds `tensor` once the work queued so far has run (wait on an event
        recorded after this call before reading it)."""
        if not self.pinned:
            return tensor
        host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        host.copy_(tensor, non_blocking=True)
        return host


def _host_tensor(data, dtype) -> torch.Tensor:
    if isinstance(data, torch.Tensor):
        return data if dtype is None else data.to(dtype)
    array = np.asarray(data) if dtype is None else np.asarray(data, dtype=_NUMPY[dtype])
    return torch.from_numpy(np.ascontiguousarray(array))


_NUMPY = {torch.int64: np.int64, torch.int32: np.int32, torch.float32: np.float32, torch.bool: np.bool_}
