"""A model's converted weights (fused projections, cast to the run's dtype), cached in one file that
later runs map instead of reading, fusing and casting the checkpoint again.

    $BULKRUN_CACHE_DIR/weights/<key>.safetensors     key: the checkpoint's files, dtype, format

The file is plain safetensors; a reader maps it copy-on-write and every tensor is a view of the
mapping (no copy: pages come from the page cache, shared by every process on the machine). Every
tensor starts on a 64-byte boundary (unused `__pad*` byte tensors fill the gaps): some CPU kernels
(MKL's fp32 gemv on AMD) take another reduction order for a misaligned operand, and a mapped weight
must compute the same bits as the freshly converted one. The key
hashes each checkpoint file's name, size and modification time, the dtype and this format's
version, so a changed checkpoint gets a new file rather than a stale one. Writes are atomic.
"""

from __future__ import annotations

import hashlib
import json
import logging
import mmap
import os
import struct
import tempfile
from pathlib import Path

import torch

from bulkrun_kernels.cpu_build import cache_base

log = logging.getLogger("bulkrun.model")
FORMAT_VERSION = "2"  # bump when what the loader stores changes
_MADV_POPULATE_READ = 22  # Linux 5.14+; Python 3.11's mmap module has no name for it
_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "I64": torch.int64}
_NAMES = {v: k for k, v in _DTYPES.items()}
ALIGN = 64  # bytes: where every tensor of the file starts
_PAD = "__pad"


MIN_BYTES = 64 << 20  # smaller checkpoints convert in less time than a cached copy is worth


def worth_caching(model_dir: Path) -> bool:
    return sum(p.stat().st_size for p in model_dir.glob("*.safetensors")) >= MIN_BYTES


def cache_path(model_dir: Path, dtype: torch.dtype) -> Path:
    h = hashlib.sha256(f"{FORMAT_VERSION} {dtype}".encode())
    for path in sorted(model_dir.iterdir()):
        if path.suffix in (".safetensors", ".json") and path.is_file():
            st = path.stat()
            h.update(f"{path.name} {st.st_size} {st.st_mtime_ns}".encode())
    return cache_base() / "weights" / f"{h.hexdigest()[:20]}.safetensors"


def read(path: Path) -> dict[str, torch.Tensor] | None:
    """name -> tensor viewing the mapped file; None when there is no (readable) file."""
    try:
        with open(path, "rb") as f:
            buffer = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    except (OSError, ValueError):
        return None
    _populate_read(buffer)
    (header_len,) = struct.unpack("<Q", buffer[:8])
    header = json.loads(buffer[8 : 8 + header_len])
    header.pop("__metadata__", None)
    base, tensors = 8 + header_len, {}
    for name, entry in header.items():
        if name.startswith(_PAD):
            continue
        dtype = _DTYPES[entry["dtype"]]
        start, end = entry["data_offsets"]
        count = (end - start) // dtype.itemsize
        if (base + start) % dtype.itemsize:  # never with safetensors' layout; copy rather than fail
            flat = torch.frombuffer(bytearray(buffer[base + start : base + end]), dtype=dtype)
        else:
            flat = torch.frombuffer(buffer, dtype=dtype, count=count, offset=base + start)
        tensors[name] = flat.view(entry["shape"])
    return tensors


def _populate_read(buffer: mmap.mmap) -> None:
    """Map every page of the file now, read-only (shared with the page cache), in one call: faulting
    4 KiB pages in one by one as packing first reads them costs more. (MAP_POPULATE would break
    copy-on-write on every page of a writable private mapping: a private copy of the whole file.)"""
    try:
        buffer.madvise(getattr(mmap, "MADV_POPULATE_READ", _MADV_POPULATE_READ))
    except (OSError, ValueError, AttributeError):  # before Linux 5.14, or not Linux: pages fault in lazily
        pass


def write(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    """Store tensors at path atomically; a failure (disk full, read-only cache) is logged, not raised."""
    staged = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".tmp", delete=False) as tmp:
            staged = Path(tmp.name)
        _save_aligned(tensors, staged)
        os.replace(staged, path)
    except OSError as exc:
        log.warning("could not cache the converted weights at %s: %s", path, exc)
        if staged is not None:
            staged.unlink(missing_ok=True)


def aligned(tensor: torch.Tensor) -> torch.Tensor:
    """tensor, or a copy of it starting on an ALIGN-byte boundary (a CPU tensor that views a mapped
    file where the file put it)."""
    if tensor.device.type != "cpu" or tensor.data_ptr() % ALIGN == 0:
        return tensor
    return tensor.clone()


def _save_aligned(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """A safetensors file whose every tensor starts at a multiple of ALIGN bytes from the file's start
    (safetensors wants no holes in its data: byte tensors named __pad* fill them)."""
    header, order, offset = {}, [], 0
    for i, (name, tensor) in enumerate(tensors.items()):
        if offset % ALIGN:
            gap = ALIGN - offset % ALIGN
            header[f"{_PAD}{i}"] = {"dtype": "U8", "shape": [gap], "data_offsets": [offset, offset + gap]}
            order.append(bytes(gap))
            offset += gap
        data = tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
        header[name] = {"dtype": _NAMES[tensor.dtype], "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + data.nbytes]}  # fmt: skip
        order.append(data)
        offset += data.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % ALIGN)  # the data starts on a boundary too
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for chunk in order:
            f.write(chunk)
