"""Hatch build hook: compile the native hot path (native/*.c, one module) with the system C compiler.

Editable installs (``uv sync``) put the extension next to its source, where the
editable path finds it; wheels carry it as an artifact. Without a working compiler
the build goes on and Headwater runs its pure-Python path (native/__init__.py).
``[tool.uv] cache-keys`` in pyproject.toml names the C source, so changing it rebuilds.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

SOURCE = Path("native/_speedups.c")  # creates the module; the other *.c files add functions to it


def compile_extension(root: Path) -> Path:
    """Build the extension beside its source; return its path (raises CalledProcessError on failure)."""
    source = root / SOURCE
    target = source.with_name("_speedups" + str(sysconfig.get_config_var("EXT_SUFFIX")))
    compiler = shlex.split(os.environ.get("CC") or str(sysconfig.get_config_var("CC") or "cc"))
    partial = target.with_name(target.name + f".{os.getpid()}.tmp")
    command = [
        *compiler,
        "-O2",
        "-fPIC",
        "-shared",
        "-Wall",
        f"-I{sysconfig.get_paths()['include']}",
        *[str(path) for path in sorted(source.parent.glob("*.c"))],
        "-o",
        str(partial),
    ]
    subprocess.run(command, check=True, capture_output=True, text=True)
    partial.replace(target)  # atomic: a process importing the old one never sees half a file
    return target


class NativeBuildHook(BuildHookInterface):  # type: ignore[type-arg]
    """Compiles the extension for wheel and editable builds."""

    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        """Compile; on failure warn and leave the build pure Python."""
        if self.target_name != "wheel":
            return
        try:
            target = compile_extension(Path(self.root))
        except (OSError, subprocess.CalledProcessError) as exc:
            detail = getattr(exc, "stderr", "") or str(exc)
            print(f"headwater: native extension not built, the pure-Python path will run: {detail}", file=sys.stderr)
            return
        if version != "editable":
            relative = target.relative_to(self.root).as_posix()
            build_data["force_include"][str(target)] = relative
            build_data["pure_python"] = False
            build_data["infer_tag"] = True
