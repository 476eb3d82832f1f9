"""Suite-wide set-up that must happen before any test module imports triton."""

import os

import torch

# Without a GPU the Triton kernels run under Triton's CPU interpreter. The flag only works when set
# before triton is first imported (transformers imports it), so it is set here, at the root.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
