"""The red line at the top of every live page that says "no new readings since HH:MM:SS" while readings stop.

One shared component: the server adds it to every live page after the page is built (see
:func:`add_stale_banner`), so no dashboard shows frozen values as live. A replay or a page without live readings of
its own (the cluster's) gets none.
"""

from __future__ import annotations

from bokeh.document import Document
from bokeh.models import Column
from bokeh.models.widgets import Div

from nvdash.apps.context import AppContext
from nvdash.freshness import banner_text, stale_since

STALE_BANNER_NAME = "nvdash-stale-banner"
"""The banner's model name (tests and scripts find it by it)."""
CHECK_MS = 1000
"""How often each page looks at the age of the newest reading."""
STYLES: dict[str, str | None] = {"color": "#ffffff", "background-color": "#cf222e", "font-weight": "600",
                                 "padding": "0.2em 0.8em", "border-radius": "4px", "width": "100%"}


class StaleBanner:
    """Shows or hides its :class:`Div` as the store's newest reading grows too old or fresh again."""

    def __init__(self, ctx: AppContext) -> None:
        self.ctx = ctx
        self.div = Div(text="", visible=False, name=STALE_BANNER_NAME, styles=STYLES, sizing_mode="stretch_width")

    def check(self) -> None:
        """Update the banner (a message goes to the browser only when its text or visibility changes)."""
        latest = self.ctx.store.latest()
        since = stale_since(None if latest is None else latest.time_s, self.ctx.clock(), self.ctx.interval_s)
        text = "" if since is None else banner_text(since)
        if self.div.text != text:
            self.div.text = text
        if self.div.visible != (since is not None):
            self.div.visible = since is not None


def add_stale_banner(doc: Document, ctx: AppContext) -> StaleBanner | None:
    """Put the banner at the top of ``doc``'s page (made by ``figures.add_page``) and check it every
    :data:`CHECK_MS`; nothing for a page without live readings."""
    if not ctx.live_readings or not doc.roots or not isinstance(doc.roots[0], Column):
        return None
    banner = StaleBanner(ctx)
    banner.check()
    root = doc.roots[0]
    root.children = [banner.div, *root.children]
    doc.add_periodic_callback(banner.check, CHECK_MS)
    return banner
