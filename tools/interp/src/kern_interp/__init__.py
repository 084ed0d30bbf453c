"""kern's CPU backend: a float32 numpy interpreter of the Qwen3 manifests (`kern_interp.qwen3`),
`kern_runtime.Backend` over it and a kern_pool Pool and Host (`kern_interp.backend`), and the
factory and tokenizer `kern serve --backend kern_interp.serve:engine` runs the tiny model with
(`kern_interp.serve`). For tests and CPU-only machines; speed lives on the GPU."""

__all__: list[str] = []
