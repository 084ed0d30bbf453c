"""Developer sessions: tests, lint, benchmarks, and the offline wheelhouse for GPU hosts."""

from __future__ import annotations

import nox

nox.options.default_venv_backend = "uv"
nox.options.sessions = ["tests", "lint"]

PACKAGES = ["kern-manifest", "kern-pool", "kern-runtime", "kern-mining", "kern-cli"]


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
