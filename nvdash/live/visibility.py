"""Whether anybody can see a pane: a page nobody sees gets no updates until it is seen again.

A JupyterLab pane behind another tab, a dashboard scrolled out of view or a browser tab in the background still
received every update, and the browser drew each one. The page itself tells the server when it cannot be seen:
the document is hidden (a background tab, a minimised window) or its frame does not intersect the screen (an
iframe in a hidden JupyterLab tab is ``display: none``). Pages catch up from the store when they are seen again,
so nothing is lost, the way the Pause button works.
"""

from __future__ import annotations

import weakref

from bokeh.document import Document
from bokeh.events import DocumentReady
from bokeh.models import CustomJS, Spacer

HIDDEN_NAME = "nvdash pane hidden"
"""The name of the flag's model in a document (one per document, shared by its followers)."""

WATCH_JS = """
let intersecting = true;
const update = () => {
  const hidden = document.hidden || !intersecting;
  if (flag.disabled !== hidden) {
    flag.disabled = hidden;
  }
};
if (typeof IntersectionObserver !== "undefined") {
  new IntersectionObserver((entries) => {
    intersecting = entries[entries.length - 1].isIntersecting;
    update();
  }).observe(document.documentElement);
}
document.addEventListener("visibilitychange", update);
update();
"""
"""Runs once in the browser when the document is ready; keeps ``flag.disabled`` true while nobody can see it."""


_FLAGS: weakref.WeakKeyDictionary[Document, weakref.ReferenceType[Spacer]] = weakref.WeakKeyDictionary()
"""Each document's flag, held weakly both ways: the document holds its flag (the watching callback does), and a flag
held strongly here would hold its document forever (a model points back at its document)."""


def hidden_flag(doc: Document) -> Spacer:
    """The document's flag, made and watched on first use: ``disabled`` while its viewer cannot see the page.

    The flag is an invisible, empty spacer that the page's layout carries (:func:`nvdash.apps.figures.add_page` puts it
    in), so the browser's changes to it reach the server.
    """
    known = _FLAGS.get(doc)
    flag = None if known is None else known()
    if flag is None:
        flag = Spacer(name=HIDDEN_NAME, disabled=False, visible=False, width=0, height=0)
        doc.js_on_event(DocumentReady, CustomJS(args={"flag": flag}, code=WATCH_JS))
        _FLAGS[doc] = weakref.ref(flag)
    return flag
