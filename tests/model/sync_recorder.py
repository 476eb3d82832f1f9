"""Records, on the CPU, every operation inside a runner step that would make a GPU host wait.

On the CPU host and device memory are one, so "device tensor" is a label this recorder keeps: every
tensor is a device tensor unless it is host data (made from numpy or a Python list: aten.lift_fresh,
and what is computed from host tensors alone) or came back through Staging.to_host. Staging.to_device
is the one sanctioned crossing to the device (pinned memory, non_blocking=True on a GPU) and to_host
the one way back (into pinned memory, waited for only in StepHandle.result()); the recorder wraps
both. Recorded:

- reading a device value on the host: `_local_scalar_dense` (.item(), int(), float(), bool()),
  .tolist(), .numpy(), .cpu(), .to() of a device tensor;
- ops whose result size depends on device data: nonzero, masked_select, unique, bincount, boolean-mask
  indexing;
- host tensors (more than a scalar) in an op with device tensors: an implicit blocking copy (an
  index list, torch.tensor(...) used as an index) or a device mismatch on a GPU;
- copies between host and device tensors outside Staging, and torch.tensor/as_tensor given a device.

Regions marked trusted (the model's forward, whose kernels a GPU checks under
torch.cuda.set_sync_debug_mode("error") before capture) are not recorded, but their results are
device tensors as usual.
"""

from __future__ import annotations

import traceback
from contextlib import ExitStack, contextmanager

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakTensorKeyDictionary

aten = torch.ops.aten
# (bincount: on CUDA it reads its input's largest value back to size the result, even with minlength)
_SIZE_FROM_DATA = {"nonzero", "nonzero_static", "masked_select", "_unique", "_unique2", "unique_dim",
                   "unique_consecutive", "argwhere", "bincount"}  # fmt: skip
_HOST_READS = {"tolist", "numpy", "item", "__bool__", "__int__", "__float__", "__index__", "cpu"}


class SyncRecorder:
    def __init__(self):
        self.host = WeakTensorKeyDictionary()  # tensors that hold host data
        self.syncs: list[str] = []
        self.recording = False
        self._trusted = 0

    # ---- labels --------------------------------------------------------------------------------

    def is_host(self, t: torch.Tensor) -> bool:
        return t in self.host

    def mark(self, t: torch.Tensor, host: bool) -> torch.Tensor:
        if host:
            self.host[t] = True
        elif t in self.host:
            del self.host[t]
        return t

    def _record(self, what: str) -> None:
        if self.recording and not self._trusted:
            self.syncs.append(f"{what} at {_caller()}")

    @contextmanager
    def trusted(self):
        self._trusted += 1
        try:
            yield
        finally:
            self._trusted -= 1

    # ---- what a runner uses --------------------------------------------------------------------

    def instrument(self, runner, monkeypatch) -> None:
        """Wrap the runner's staging (the sanctioned crossings) and trust its model's forward."""
        staging = runner.staging
        to_device, to_host = staging.to_device, staging.to_host

        def staged_to_device(data, dtype=None):
            with self.trusted():
                return self.mark(to_device(data, dtype).clone(), host=False)

        def staged_to_host(tensor):
            with self.trusted():
                return self.mark(to_host(tensor).clone(), host=True)

        monkeypatch.setattr(staging, "to_device", staged_to_device)
        monkeypatch.setattr(staging, "to_host", staged_to_host)
        forward = runner.model.final_hidden

        def trusted_forward(*args, **kwargs):
            with self.trusted():
                return forward(*args, **kwargs)

        monkeypatch.setattr(runner.model, "final_hidden", trusted_forward)

    @contextmanager
    def active(self):
        """Record while inside (both modes on)."""
        with ExitStack() as stack:
            stack.enter_context(_Functions(self))
            stack.enter_context(_Dispatch(self))
            self.recording = True
            try:
                yield self
            finally:
                self.recording = False


class _Functions(TorchFunctionMode):
    def __init__(self, recorder: SyncRecorder):
        super().__init__()
        self.r = recorder

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        r = self.r
        first = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if first is not None and not r.is_host(first):
            if name in _HOST_READS:
                r._record(f"{name}() of a device tensor")
            elif name == "to" and _names_a_device(args[1:], kwargs):
                r._record("to(<device>) of a device tensor (a copy outside Staging)")
        if (
            first is not None
            and r.is_host(first)
            and name in ("to", "cuda")
            and _names_a_device(args[1:], kwargs)
        ):
            r._record("to(<device>) of a host tensor (a copy outside Staging)")
        if name in ("tensor", "as_tensor") and kwargs.get("device") is not None:
            r._record(f"torch.{name}(..., device=...) (a blocking copy on a GPU)")
        return func(*args, **kwargs)


def _names_a_device(args, kwargs) -> bool:
    if "device" in kwargs:
        return True
    return any(isinstance(a, (str, torch.device)) for a in args)


class _Dispatch(TorchDispatchMode):
    def __init__(self, recorder: SyncRecorder):
        super().__init__()
        self.r = recorder

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        r = self.r
        name = func.overloadpacket.__name__
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        host = [t for t in tensors if r.is_host(t)]
        device = [t for t in tensors if not r.is_host(t)]
        if name == "_local_scalar_dense" and device:
            r._record("_local_scalar_dense of a device tensor (.item(), int(), float(), bool())")
        elif name in _SIZE_FROM_DATA and device:
            r._record(f"{name} of a device tensor (its size depends on device data)")
        elif name in ("index", "index_put", "index_put_") and device and _bool_index(args):
            r._record(f"boolean-mask {name} (a nonzero on the device)")
        if name == "copy_" and len(args) >= 2 and r.is_host(args[0]) != r.is_host(args[1]):
            r._record("copy_ between host and device outside Staging")
        elif name != "lift_fresh" and device and any(t.dim() > 0 for t in host):
            r._record(f"{name} mixes host and device tensors (an implicit blocking copy)")
        out = func(*args, **kwargs)
        if name in ("lift_fresh", "lift_fresh_copy"):
            return r.mark(out, host=True)
        if name.endswith("_") or name == "copy_":  # in place: the destination keeps its label
            return out
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                r.mark(t, host=bool(tensors) and not device)
        return out


def _caller() -> str:
    """The innermost frame of the project's code (where the sync was written)."""
    for frame in reversed(traceback.extract_stack()):
        if (
            "/bulkrun/" in frame.filename
            or "/tests/" in frame.filename
            and "sync_recorder" not in frame.filename
        ):
            return f"{frame.filename.rsplit('/', 1)[-1]}:{frame.lineno}"
    return "?"


def _bool_index(args) -> bool:
    indices = args[1] if len(args) > 1 else ()
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices or ())
