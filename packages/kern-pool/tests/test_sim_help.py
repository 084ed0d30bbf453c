"""kern-pool-sim --help names `kern-pool-sim serve`, the serving replay it routes to."""

from __future__ import annotations

import pytest

from kern_pool.sim import main


def test_help_names_the_serve_replay(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "kern-pool-sim serve [flags]: replay a serving workload" in out
    assert out.endswith("see kern-pool-sim serve --help.")


def test_the_serve_help_it_names_exists(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["serve", "--help"])
    assert info.value.code == 0 and "usage: kern-pool-sim serve" in capsys.readouterr().out
