"""kern-qwen3 --kernels: a kernels directory that is a file is one line, exit 2, nothing written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = "import sys; from kern_qwen3.cli import main; sys.exit(main())"


@pytest.mark.parametrize("kernels", ["file", "file/sub"])
def test_a_kernels_directory_that_is_a_file_is_one_line(tmp_path: Path, kernels: str) -> None:
    (tmp_path / "file").write_text("kept")
    out = tmp_path / "m.json"
    done = subprocess.run([sys.executable, "-c", SCRIPT, "--preset", "qwen3-tiny", "-o", str(out),
                           "--kernels-src", str(ROOT / "tools" / "kernels-src"), "--kernels", str(tmp_path / kernels)],
                          capture_output=True, text=True, check=False)
    where = "" if kernels == "file" else f" ({tmp_path / 'file'} is a file)"
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == f"kern-qwen3: kernels directory {tmp_path / kernels} is not a directory{where}\n"
    assert not out.exists() and (tmp_path / "file").read_text() == "kept"
