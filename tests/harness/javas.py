"""The Java installations Spark can run on here, and the one the suite runs on."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

#: The Java major versions Spark 4.3 runs on.
SPARK_JAVAS = (17, 21, 25)
_VERSION = re.compile(r'^JAVA_VERSION="(\d+)[."]', re.MULTILINE)


def installed_javas(root: Path = Path("/usr/lib/jvm")) -> dict[int, Path]:
    """One Java home per major version Spark runs on, found under ``root`` (its ``release`` file says which)."""
    found: dict[int, Path] = {}
    for home in sorted(root.glob("*/")) if root.is_dir() else []:
        try:
            match = _VERSION.search((home / "release").read_text())
        except OSError:
            continue
        java = home / "bin" / "java"
        if match and int(match.group(1)) in SPARK_JAVAS and java.exists():
            found.setdefault(int(match.group(1)), home)
    return found


def suite_java() -> Path | None:
    """The ``java`` binary the suite's Spark runs on: ``$JAVA_HOME``'s, else the one on PATH (resolved)."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return (Path(home) / "bin" / "java").resolve()
    which = shutil.which("java")
    return Path(which).resolve() if which else None


def other_javas() -> dict[int, Path]:
    """The installed Java homes Spark runs on, other than the suite's own."""
    own = suite_java()
    return {major: home for major, home in installed_javas().items() if (home / "bin" / "java").resolve() != own}
