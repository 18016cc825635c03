"""The PromQL of every panel of the shipped Grafana dashboard, with Grafana's variables filled in so that each
query runs on a plain Prometheus: the dashboard's own variables match everything (``.*``), ``$__rate_interval``
and ``$__interval`` are ``1m`` and ``$__range`` is ``5m``."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

DASHBOARD = Path(__file__).resolve().parents[1] / "deploy" / "grafana" / "nvdash.json"

BUILTINS: dict[str, str] = {"__rate_interval": "1m", "__interval": "1m", "__range": "5m"}
"""Grafana's own variables that the dashboard's queries may use, with the value a plain Prometheus gets."""

VARIABLE = re.compile(r"\$\{(?P<braced>\w+)(?::\w+)?\}|\[\[(?P<bracketed>\w+)(?::\w+)?\]\]|\$(?P<plain>\w+)")
"""A Grafana variable in any of its syntaxes: ``$name``, ``${name}``, ``${name:format}``, ``[[name]]``."""


def load(path: Path = DASHBOARD) -> dict[str, Any]:
    """The dashboard's JSON model."""
    document = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(document, dict):
        raise ValueError(f"{path} is not a dashboard (a JSON object)")
    return document


def panels(dashboard: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, rows included, and the panels inside collapsed rows."""
    def walk(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for panel in items:
            yield panel
            yield from walk(panel.get("panels") or [])

    yield from walk(dashboard.get("panels") or [])


def variable_names(expr: str) -> list[str]:
    """The names of the variables an expression uses, in order."""
    return [next(name for name in match.groups() if name) for match in VARIABLE.finditer(expr)]


def dashboard_variables(dashboard: Mapping[str, Any]) -> list[str]:
    """The names of the dashboard's template variables."""
    return [str(variable["name"]) for variable in (dashboard.get("templating") or {}).get("list") or []]


def substitute(expr: str, values: Mapping[str, str]) -> str:
    """``expr`` with each variable replaced by its value; raises ``KeyError`` naming a variable not in ``values``."""
    def replace(match: re.Match[str]) -> str:
        name = next(name for name in match.groups() if name)
        if name not in values:
            raise KeyError(f"unknown Grafana variable ${name} in {expr!r}")
        return values[name]

    return VARIABLE.sub(replace, expr)


def plain_values(dashboard: Mapping[str, Any]) -> dict[str, str]:
    """The value of each variable on a plain Prometheus: every template variable matches everything."""
    return {**dict.fromkeys(dashboard_variables(dashboard), ".*"), **BUILTINS}


def dashboard_queries(path: Path = DASHBOARD) -> list[tuple[str, str]]:
    """``(panel title, PromQL)`` for every panel target with an expression, its variables substituted."""
    dashboard = load(path)
    values = plain_values(dashboard)
    return [
        (str(panel.get("title", "")), substitute(str(target["expr"]), values))
        for panel in panels(dashboard)
        for target in panel.get("targets") or []
        if str(target.get("expr") or "").strip()
    ]
