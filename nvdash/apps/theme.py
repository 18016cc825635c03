"""Light or dark: each document follows the ``theme`` query argument of the page that opened it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from bokeh.document import Document
from bokeh.themes import built_in_themes

DARK_THEME = "dark_minimal"


def wants_dark(arguments: Mapping[str, Sequence[bytes | str]] | None) -> bool:
    """True when the request's query arguments say ``theme=dark`` (the last value counts)."""
    values = (arguments or {}).get("theme")
    if not values:
        return False
    last = values[-1]
    text = last.decode("utf-8", "replace") if isinstance(last, bytes) else last
    return text.strip().lower() == "dark"


def request_arguments(doc: Document) -> Mapping[str, Sequence[bytes | str]] | None:
    """The query arguments of the request behind ``doc``; ``None`` for a document outside a server."""
    context = doc.session_context
    if context is None:
        return None
    request = getattr(context, "request", None)
    arguments: Mapping[str, Sequence[bytes | str]] | None = getattr(request, "arguments", None)
    return arguments


def apply_theme(doc: Document) -> bool:
    """Give ``doc`` the dark theme when its request asked for it; returns whether it is dark."""
    dark = wants_dark(request_arguments(doc))
    if dark:
        doc.theme = built_in_themes[DARK_THEME]
    return dark
