"""``headwater.yaml`` edited in place: comments and layout kept, checked as it will be read, replaced atomically.

The config is edited with ruamel.yaml round-trip, checked with :func:`core.config.parse_config`
exactly as ``load_config`` will read it, and replaced atomically (temporary file, fsync,
rename), so a reader sees the old file or the new one.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.tokens import CommentToken

from core.config import ProjectConfig, parse_config
from core.durable_files import replace_file
from core.errors import ConfigError


def _yaml() -> YAML:
    rt = YAML()  # round-trip: keeps comments, key order and quoting
    rt.preserve_quotes = True
    rt.width = 4096  # never fold a long DSN over two lines
    rt.indent(mapping=2, sequence=4, offset=2)
    return rt


def read_document(path: Path) -> CommentedMap:
    """The config file as a round-trip document (comments and layout kept)."""
    if not path.is_file():
        msg = f"{path}: no such config file; run 'headwater init' or pass --config"
        raise ConfigError(msg, path=str(path))
    text = path.read_text(encoding="utf-8")
    try:
        document = _yaml().load(text)
    except Exception as exc:  # ruamel raises many unrelated types for malformed YAML
        msg = f"{path}: invalid YAML ({type(exc).__name__}); fix the file and retry"
        raise ConfigError(msg, path=str(path)) from None
    if document is None:
        document = CommentedMap()
    if not isinstance(document, CommentedMap):
        msg = f"{path}: the file must hold a mapping of keys (project, log, sources, ...)"
        raise ConfigError(msg, path=str(path))
    return document


def render(document: CommentedMap) -> str:
    """The document as YAML text."""
    buffer = io.StringIO()
    _yaml().dump(document, buffer)
    return buffer.getvalue()


def validate(text: str, path: Path) -> ProjectConfig:
    """Read ``text`` exactly as :func:`core.config.load_config` will, so what we write always loads."""
    return parse_config(yaml.safe_load(text), path)


def write_atomically(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` so a reader sees the old file or the new one, never a mix."""
    mode = path.stat().st_mode & 0o777 if path.exists() else 0o644
    replace_file(path, text.encode(), mode=mode)


def sources_map(document: CommentedMap) -> CommentedMap:
    """The document's ``sources`` mapping (created when missing), in block style."""
    sources = document.get("sources")
    if sources is None:
        sources = CommentedMap()
        document["sources"] = sources
    if not isinstance(sources, CommentedMap):
        msg = "sources: must be a mapping of source name to settings"
        raise ConfigError(msg, field="sources")
    # `headwater init` writes `sources: {}`; entries read better in block style.
    sources.fa.set_block_style()
    return sources


def _comment_slots(node: Any) -> list[tuple[list[Any], int]]:
    """Where ruamel may keep the comment after ``node``'s last line: each block level's last key or item."""
    places: list[tuple[list[Any], int]] = []
    while isinstance(node, (CommentedMap, CommentedSeq)) and len(node) and not node.fa.flow_style():
        last: Any = list(node.keys())[-1] if isinstance(node, CommentedMap) else len(node) - 1
        slots = node.ca.items.setdefault(last, [None, None, None, None])
        places.append((slots, 2 if isinstance(node, CommentedMap) else 0))
        node = node[last]
    return places


def detach_trailing_comment(node: Any) -> CommentToken | None:
    """Remove and return the full-line comments and blank lines that follow ``node`` (not its end-of-line comment).

    ruamel attaches the comment lines between a mapping entry and the next top-level
    key to the entry's deepest last element; deleting the entry would delete them.
    """
    held = [(slots, index) for slots, index in _comment_slots(node) if slots[index] is not None]
    if not held:
        return None
    slots, index = held[-1]
    token = slots[index]
    own, newline, rest = token.value.partition("\n")
    if not newline or not rest:
        return None
    token.value = own + newline
    return CommentToken(rest, token.start_mark, token.end_mark)


def attach_trailing_comment(node: Any, comment: CommentToken) -> bool:
    """Put ``comment`` after ``node``'s last line; False when ``node`` has no element to carry it."""
    places = _comment_slots(node)
    if not places:
        return False
    slots, index = places[-1]
    if slots[index] is None:
        # A comment that does not start with its own end-of-line would join the last line.
        slots[index] = CommentToken("\n" + comment.value, comment.start_mark, comment.end_mark)
    else:
        slots[index].value += comment.value
    return True


def flow_list(items: Sequence[str]) -> CommentedSeq:
    """``items`` as a one-line ``[a, b]`` list."""
    seq = CommentedSeq(items)
    seq.fa.set_flow_style()
    return seq
