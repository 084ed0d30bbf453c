"""kern_peer: the compiled PyTorch Qwen3 that `kern bench` measures kern against.

`python -m kern_peer --weights DIR --contexts ... --prefill ... --json OUT` loads a Hugging Face
Qwen3 checkpoint (safetensors + config.json) onto one GPU and times, in one process: decode
ms/token at each context (one CUDA graph per step replayed back to back, the next token fed on the
device; and the same position replayed) and prefill of each prompt length. The model
(`kern_peer.model`): RMSNorm, q/k norm, RoPE, GQA attention over a static KV cache through torch
SDPA, SiLU MLP, tied or untied head; the layers' dense work compiled with torch.compile (inductor,
default mode). This package's top level imports no torch (`config`, `cli`); `model` and `timing`
do.
"""

from kern_peer.config import PeerConfig, PeerConfigError, checkpoint_files, read_config

__all__ = ["PeerConfig", "PeerConfigError", "checkpoint_files", "read_config"]
