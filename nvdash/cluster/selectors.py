"""Which series the cluster views read: the label naming a node, and the label matchers every series they select
carries (``--prometheus-selector 'job="nvdash"'``), so a dcgm-exporter scraped beside nvdash during a migration is
not counted twice.

Every PromQL series selector of the cluster views is built by :meth:`SeriesScope.series`, the one place that adds
the matchers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from nvdash.metrics.compat import LABEL_RENAMES_4_9

HOST_LABEL = "Hostname"
HOST_LABELS = (HOST_LABEL, LABEL_RENAMES_4_9[HOST_LABEL])
"""The host's label: dcgm-exporter's ``Hostname`` up to 4.8.2, ``hostname`` from 4.8.3 and in 4.9."""

LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
_STRING = r'"(?:[^"\\\n]|\\.)*"' + r"|'(?:[^'\\\n]|\\.)*'" + r"|`[^`]*`"
_MATCHER = re.compile(rf"\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*({_STRING})\s*")


class SelectorError(ValueError):
    """A malformed selector or label name; the message is one line."""


def parse_matchers(text: str) -> tuple[str, ...]:
    """The label matchers of ``text`` (``job="nvdash", cluster=~"a|b"``, optionally in braces), each normalised to
    ``name<op>"value"``; raises :class:`SelectorError` naming what is wrong."""
    body = text.strip()
    if body.startswith("{") and body.endswith("}"):
        body = body[1:-1]
    matchers: list[str] = []
    position = 0
    while position < len(body):
        found = _MATCHER.match(body, position)
        if found is None:
            rest = " ".join(body[position:].split())
            raise SelectorError(f"{text!r} is not a list of label matchers (name=\"value\", name=~\"regex\", "
                                f"name!=\"value\", name!~\"regex\"): cannot read {rest[:40]!r}")
        name, operator, value = found.groups()
        if operator in ("=~", "!~"):
            try:
                re.compile(_unquoted(value))
            except re.error as error:
                raise SelectorError(f"{text!r}: the regex of {name} is malformed: {error}") from None
        matchers.append(f"{name}{operator}{value}")
        position = found.end()
        if position < len(body):
            if body[position] != ",":
                raise SelectorError(f"{text!r}: matchers are separated by commas")
            position += 1
    return tuple(matchers)


def _unquoted(value: str) -> str:
    """The text of a PromQL string literal (escapes kept as a regex reads them)."""
    return value[1:-1]


def quote(value: str) -> str:
    """A PromQL string literal."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def check_label_name(name: str) -> str:
    """``name`` if it is a Prometheus label name; raises :class:`SelectorError`."""
    if not LABEL_NAME.match(name):
        raise SelectorError(f"{name!r} is not a Prometheus label name (letters, digits and _, not first a digit)")
    return name


@dataclass(frozen=True)
class SeriesScope:
    """The host label and the matchers added to every series the cluster views select."""

    host_label: str = HOST_LABEL
    """The label naming a series' node (``Hostname``: dcgm-exporter 4.9's ``hostname`` is read too)."""
    matchers: tuple[str, ...] = ()
    """Label matchers (from :func:`parse_matchers`) every selected series must match."""
    group_label: str = ""
    """A label grouping the nodes (``rack``, ``zone``, a Kubernetes node pool: ``--prometheus-group-label``); ``""``:
    none. The nodes pages show a node's group, put each group's nodes together and filter by it."""

    @property
    def group_labels(self) -> tuple[str, ...]:
        """The group label, to add to an aggregation's ``by`` (none when not set)."""
        return (self.group_label,) if self.group_label else ()

    @property
    def host_labels(self) -> tuple[str, ...]:
        """Every label that may name a node, the configured one first."""
        return HOST_LABELS if self.host_label == HOST_LABEL else (self.host_label,)

    def series(self, name: str, *matchers: str) -> str:
        """The selector of the series named ``name`` (``""``: matched by ``__name__`` among ``matchers``) with
        ``matchers`` and the scope's own."""
        every = (*matchers, *self.matchers)
        if not every:
            return name
        return f"{name}{{{', '.join(every)}}}"
