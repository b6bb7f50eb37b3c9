"""Checking that a SQL condition given as text stays one expression where it is put.

A condition (a row filter, an ``execute-snapshot`` signal's additional condition) is put in
parentheses into a ``WHERE``; a parenthesis closed before it was opened, a ``;`` or a comment
would let it reach past them. The quoting rules are the dialect's: a kind passes a
:data:`QuoteSkipper` that steps over one quoted span.
"""

from __future__ import annotations

from collections.abc import Callable

#: ``skip(text, i)``: where the quoted span starting at ``i`` ends (its closing quote's index), a
#: problem (an unclosed quote), or None when no quoted span starts at ``i``.
QuoteSkipper = Callable[[str, int], int | str | None]


def condition_problem(text: str, skip: QuoteSkipper, comments: tuple[str, ...] = ("--", "/*")) -> str | None:
    """Why ``text`` is not one SQL condition that can be put in parentheses (None: it is)."""
    depth, i, n = 0, 0, len(text)
    while i < n:
        char = text[i]
        skipped = skip(text, i)
        if isinstance(skipped, str):
            return skipped
        if skipped is not None:
            i = skipped
        elif text.startswith(comments, i):
            return "comments are not allowed in a condition"
        elif char == ";":
            return "';' is not allowed in a condition"
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth < 0:
                return "a ')' closes a parenthesis that was not opened"
        i += 1
    if depth:
        return "a '(' is not closed"
    return None
