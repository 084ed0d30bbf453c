"""kern bench's PyTorch peer (tools/peer) against transformers on the GPU: greedy tokens from its
compiled, CUDA-graph decode equal transformers' eager bf16 greedy tokens on random-weight
checkpoints written by transformers' save_pretrained (tied and untied head, and the Qwen3-4B
shape, one prompt long enough for the split attention), a divergence passing only at a near-tie,
and its first-step logits as close to transformers float32's as transformers bf16's are (within
tools/gpu/qwen3_checks.py's factor); the split attention against SDPA; the serving peer
(`kern-peer-serve`, transformers' continuous batching) through every level."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers.gpu_deps import gpu_import

STEPS = 64
PROMPTS = (1, 37, 709)
WARNINGS = ("ignore::DeprecationWarning", "ignore::FutureWarning", "ignore::UserWarning")


def _checkpoint(tmp: Path, name: str, cfg: dict[str, Any]) -> Path:
    import qwen3_checks as checks

    rec = checks.Recorder(tmp / "out")
    ckpt = checks.write_checkpoint(rec, name, cfg)
    assert ckpt is not None, rec.checks[-1].detail
    return ckpt


def _compare(ckpt: Path, prompt_lens: tuple[int, ...], steps: int) -> list[str]:
    """The peer against transformers for each prompt, as kern is held (tools/gpu/qwen3_checks.py):
    greedy tokens equal transformers bf16's but at a near-tie, and the first step's logits within
    LOGIT_NOISE_FACTOR of transformers bf16's own error against transformers float32 (relative
    L2); the checks' details."""
    torch = gpu_import("torch")
    gpu_import("transformers")
    import numpy as np
    import qwen3_checks as checks

    from kern_peer import checkpoint_files, read_config
    from kern_peer.model import Peer

    config_path, files = checkpoint_files([ckpt])
    cfg = read_config(config_path)
    ps = checks.prompts(cfg.vocab, prompt_lens)
    with torch.no_grad():
        model = checks._hf(ckpt, torch.float32)
        ref32 = {n: checks.hf_logits32(model, p) for n, p in ps.items()}
        del model
        torch.cuda.empty_cache()
        model = checks._hf(ckpt, torch.bfloat16)
        ref = {n: checks.hf_greedy(model, p, steps) for n, p in ps.items()}
        del model
        torch.cuda.empty_cache()
        peer = Peer(cfg, files, torch.device("cuda", 0), max(prompt_lens) + steps + 16)
        details = []
        for n, p in ps.items():
            got, first = peer.generate_logits(p, steps)
            tokens, gaps, bf16_first = ref[n]
            c = checks.Check(f"p{n}")
            checks.compare_greedy(c, got, tokens, gaps)
            assert c.status != "FAIL", f"prompt of {n}: {c.detail}"
            r32 = ref32[n]
            noise = float(np.linalg.norm(bf16_first - r32) / np.linalg.norm(r32))
            rel = float(np.linalg.norm(first.cpu().numpy() - r32) / np.linalg.norm(r32))
            logits = checks.Check(f"p{n}.logits")
            ok = checks.compare_logits_to_bf16_noise(logits, rel, noise)
            assert ok, f"prompt of {n}: first-step logits {logits.detail}"
            details.append(f"p{n}: {c.detail}; logits {logits.detail}")
    return details


@pytest.mark.gpu
@pytest.mark.filterwarnings(*WARNINGS)
@pytest.mark.parametrize("tied", [True, False])
def test_peer_matches_transformers_tiny(tied: bool, tmp_path: Path) -> None:
    from kern_qwen3 import QWEN3_TINY_CONFIG

    cfg = {**QWEN3_TINY_CONFIG, "tie_word_embeddings": tied}
    details = _compare(_checkpoint(tmp_path, "tiny" if tied else "tiny-untied", cfg), PROMPTS, STEPS)
    print("\n".join(details))


@pytest.mark.gpu
@pytest.mark.filterwarnings(*WARNINGS)
def test_peer_matches_transformers_4b_shape(tmp_path: Path) -> None:
    from kern_qwen3 import QWEN3_4B_CONFIG

    # NOTE: 2,200 + 32 steps attend over a cache bucket past SPLIT_FROM: the split attention
    details = _compare(_checkpoint(tmp_path, "4b", dict(QWEN3_4B_CONFIG)), (37, 709, 2200), 32)
    print("\n".join(details))


@pytest.mark.gpu
@pytest.mark.filterwarnings(*WARNINGS)
@pytest.mark.parametrize("scale", [1.0, 8.0], ids=["flat", "peaked"])
@pytest.mark.parametrize(("length", "written"), [(2048, 2048), (2048, 1500), (4096, 257), (32768, 30001)])
def test_split_attention_is_sdpa_over_the_written_positions(length: int, written: int, scale: float) -> None:
    """The peer's long-cache decode attention (compiled, as the step graph runs it) against torch
    SDPA in float32 over the same keys: within bf16 rounding of the output. `peaked`: queries 8x
    larger, scores of a few tens as a trained model's attention has them, where scores rounded to
    bf16 before the softmax are off by whole units (up to 0.14 of the output, 20x this bound)."""
    torch = gpu_import("torch")
    import torch.nn.functional as F

    from kern_peer.model import _split_compiled  # pyright: ignore[reportPrivateUsage]

    gen = torch.Generator(device="cuda").manual_seed(length + written)
    q, kc, vc = (torch.randn(*shape, generator=gen, device="cuda").bfloat16()
                 for shape in ((8, 4, 128), (8, length, 128), (8, length, 128)))
    q = (q.float() * scale).bfloat16()
    valid = torch.arange(length, device="cuda") < written
    got = _split_compiled()(q, kc, vc, valid).float()
    ref = F.scaled_dot_product_attention(q[None].float(), kc[None].float(), vc[None].float(),
                                         attn_mask=valid.view(1, 1, 1, length))[0]
    bound = 2.0**-7 * ref.abs() + 2e-3
    assert bool(((got - ref).abs() <= bound).all()), float((got - ref).abs().max())


@pytest.mark.gpu
@pytest.mark.filterwarnings(*WARNINGS)
def test_the_serving_peer_measures_every_level(tmp_path: Path) -> None:
    """`kern-peer-serve` (transformers' continuous batching) on the tiny checkpoint: every level's
    requests answered with all their tokens, its rates and latencies finite."""
    import json
    import math
    import subprocess
    import sys

    from kern_qwen3 import QWEN3_TINY_CONFIG

    gpu_import("torch")
    gpu_import("transformers")
    ckpt = _checkpoint(tmp_path, "tiny", dict(QWEN3_TINY_CONFIG))
    out = tmp_path / "serve.json"
    proc = subprocess.run([sys.executable, "-m", "kern_peer.serve_cli", "--weights", str(ckpt), "--clients", "1,4",
                           "--system", "64", "--question", "8", "--max-tokens", "8", "--rounds", "2", "--json",
                           str(out)], capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    levels = json.loads(out.read_text())["levels"]
    assert [(lv["clients"], lv["requests"], lv["output_tokens"]) for lv in levels] == [(1, 2, 16), (4, 8, 64)]
    for lv in levels:
        values = [lv[k] for k in ("output_tok_s", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms")]
        assert all(math.isfinite(v) and v > 0 for v in values), lv
