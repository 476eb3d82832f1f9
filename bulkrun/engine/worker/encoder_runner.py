"""The encoder runner: loads a BERT-family model and turns a packed batch of requests into vectors.

The step is one [T] id tensor and cu_seqlens; the model's attention is the Triton varlen kernel on
CUDA and torch's fused attention per sequence on the CPU. The dtype follows the decoder's rule
(resolve_device_dtype): bf16 on CUDA and on CPUs with native bf16, fp32 elsewhere or when asked;
the residual stream, the norms and the pooling stay fp32 either way.
"""

from __future__ import annotations

import numpy as np
import torch

from bulkrun.engine.core.config import EngineConfig
from bulkrun.engine.core.encoder_engine import encoder_limits
from bulkrun.engine.core.params import EngineRequest
from bulkrun.engine.tokenizer import load_tokenizer
from bulkrun.engine.worker.device import resolve_device
from bulkrun.engine.worker.loaded_model import resolve_device_dtype
from bulkrun.engine.worker.pooling import finish, pool_packed
from bulkrun.model.encoder_loader import load_encoder
from bulkrun.model.linear import pack_linears_for_cpu, set_batch_invariant
from bulkrun_kernels import resolve_backend


def varlen_attention_for(backend: str):
    """The encoder's attention for a kernel backend: Triton on the GPU, fused SDPA on the CPU."""
    if backend == "triton":
        from bulkrun_kernels.varlen_attention import varlen_attention

        return varlen_attention
    from bulkrun_kernels.varlen_attention_ref import varlen_attention_sdpa

    return varlen_attention_sdpa


class EncoderRunner:
    def __init__(self, model_dir: str, config: EngineConfig):
        self.tokenizer = load_tokenizer(model_dir)
        self.device = resolve_device(config.device)
        backend = resolve_backend(config.kernels, self.device)
        if backend == "triton" and self.device.type != "cuda":
            raise ValueError(f"kernel backend 'triton' needs a CUDA device, got {self.device}")
        self.device, self.dtype, self.dtype_reason = resolve_device_dtype(config, backend)
        self.model = load_encoder(model_dir, varlen_attention_for(backend), self.dtype, self.device)
        set_batch_invariant(self.model, config.batch_invariant)
        if self.device.type == "cpu":
            # bf16 on the native AMX GEMM where built (one fixed-order call for every row count),
            # else oneDNN; the fp32 panel kernel is for decode-sized batches, not encoder steps
            pack_linears_for_cpu(self.model, panels=backend == "cpu" and self.dtype == torch.bfloat16)
        cfg = self.model.cfg
        self.vocab_size = cfg.vocab_size
        self.max_model_len = min(cfg.max_model_len, config.max_model_len or cfg.max_model_len)
        self.limits = encoder_limits(config, self.device.type)

    @torch.inference_mode()
    def embed(self, requests: list[EngineRequest]) -> list[np.ndarray]:
        """One vector per request (whole prompts, packed into one step), float32 on the host."""
        lengths = [len(r.prompt_token_ids) for r in requests]
        ids = torch.tensor([t for r in requests for t in r.prompt_token_ids], dtype=torch.long)
        cu_seqlens = torch.zeros(len(requests) + 1, dtype=torch.int32)
        cu_seqlens[1:] = torch.tensor(lengths).cumsum(0)
        if self.device.type != "cpu":
            ids = ids.pin_memory().to(self.device, non_blocking=True)
            cu_seqlens = cu_seqlens.pin_memory().to(self.device, non_blocking=True)
        hidden = self.model(ids, cu_seqlens, max(lengths))
        pooled = pool_packed(hidden, lengths, [r.pooling.method for r in requests])
        return finish(pooled, [r.pooling for r in requests])
