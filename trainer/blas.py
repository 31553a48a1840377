"""On Linux CPU, run MLX's matmuls on the system's OpenBLAS instead of its bundled reference BLAS.

The `mlx[cpu]` wheel links a reference BLAS (about 3-5 GFLOP/s here); Debian's
libopenblas0-pthread, preloaded, serves the same symbols about 20-30x faster with the same
results (tests/test_blas.py compares an update with and without it). Preloading must happen
before the interpreter starts, so `fleet` re-executes itself once with LD_PRELOAD set.
Set FLEET_BLAS=reference to opt out.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# Where Debian and Ubuntu put the pthread build of OpenBLAS's BLAS interface.
CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3",
    "/usr/lib/aarch64-linux-gnu/openblas-pthread/libblas.so.3",
)
MARK = "FLEET_BLAS"


def openblas_path() -> str | None:
    """The OpenBLAS library to preload, or None where it does not apply or is absent."""
    if not sys.platform.startswith("linux") or os.environ.get(MARK) == "reference":
        return None
    return next((p for p in CANDIDATES if Path(p).is_file()), None)


def preload_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """`env` (default: this process's) with OpenBLAS preloaded, when it applies."""
    env = dict(os.environ if env is None else env)
    lib = openblas_path()
    if lib and env.get(MARK) != "reference":
        if lib not in env.get("LD_PRELOAD", ""):
            env["LD_PRELOAD"] = ":".join(p for p in (lib, env.get("LD_PRELOAD", "")) if p)
        env[MARK] = "openblas"
    return env


def reexec_with_openblas(argv: list[str]) -> None:
    """Replace this process by one with OpenBLAS preloaded (returns only when not needed)."""
    lib = openblas_path()
    if os.environ.get(MARK) or lib is None:
        return
    if lib in os.environ.get("LD_PRELOAD", ""):  # preloaded by the user already
        os.environ[MARK] = "openblas"
        return
    os.execve(sys.executable, [sys.executable, "-m", "fleet.cli", *argv], preload_env())
