"""Every alert rule in ``deploy/prometheus`` links its runbook: ``annotations.runbook_url`` points at the alert's
own section of ``docs/runbooks.md`` (GitHub's heading anchors), and each section says what the alert means, how to
confirm it and what to do."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUNBOOKS = ROOT / "docs" / "runbooks.md"
RULE_FILES = sorted((ROOT / "deploy" / "prometheus").glob("nvdash-*alerts*.yml"))
URL = "https://github.com/nvdash/nvdash/blob/main/docs/runbooks.md#"
PARTS = ("**Meaning.**", "**Confirm.**", "**Action.**")


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading: lower case, punctuation dropped (but ``-`` and ``_``), spaces
    to dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(markdown: str) -> dict[str, str]:
    """Anchor -> the section's text, for every ``##`` heading; a repeated anchor gets ``-1``, ``-2``... as on
    GitHub."""
    found: dict[str, str] = {}
    parts = re.split(r"^## (.+)$", markdown, flags=re.MULTILINE)
    for heading, body in zip(parts[1::2], parts[2::2], strict=True):
        anchor = base = github_anchor(heading)
        count = 0
        while anchor in found:
            count += 1
            anchor = f"{base}-{count}"
        found[anchor] = body
    return found


@pytest.mark.parametrize(("heading", "anchor"), [
    ("NvdashGpuLost", "nvdashgpulost"),
    ("Alert runbooks", "alert-runbooks"),
    ("What's new? (v2.0)", "whats-new-v20"),
    ("snake_case and-dash", "snake_case-and-dash"),
])
def test_github_anchor(heading: str, anchor: str) -> None:
    assert github_anchor(heading) == anchor


def test_repeated_headings_get_numbered_anchors() -> None:
    assert list(anchors("## A b\none\n## A b\ntwo\n## A  b\n")) == ["a-b", "a-b-1", "a--b"]


def rules(path: Path) -> Iterator[dict[str, Any]]:
    yaml = pytest.importorskip("yaml")
    for group in yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]:
        yield from group["rules"]


def test_the_rule_files_are_found() -> None:
    assert [path.name for path in RULE_FILES] == ["nvdash-alerts-4.9.yml", "nvdash-alerts.yml",
                                                  "nvdash-quota-alerts.yml"]


@pytest.mark.parametrize("path", RULE_FILES, ids=lambda path: path.name)
def test_every_rule_links_its_own_runbook_section(path: Path) -> None:
    sections = anchors(RUNBOOKS.read_text(encoding="utf-8"))
    problems: list[str] = []
    for rule in rules(path):
        name = rule["alert"]
        url = str((rule.get("annotations") or {}).get("runbook_url", ""))
        if url != URL + github_anchor(name):
            problems.append(f"{name}: runbook_url {url!r}, expected {URL + github_anchor(name)!r}")
        elif github_anchor(name) not in sections:
            problems.append(f"{name}: docs/runbooks.md has no section #{github_anchor(name)}")
    assert not problems, "\n".join(problems)


def test_every_runbook_section_is_an_alert_and_says_what_it_means_how_to_confirm_and_what_to_do() -> None:
    sections = anchors(RUNBOOKS.read_text(encoding="utf-8"))
    alerts = {github_anchor(rule["alert"]) for path in RULE_FILES for rule in rules(path)}
    assert set(sections) == alerts
    problems: list[str] = []
    for anchor, body in sections.items():
        positions = [body.find(part) for part in PARTS]
        if -1 in positions or positions != sorted(positions):
            problems.append(f"#{anchor}: needs {', '.join(PARTS)} in that order")
            continue
        for part, start, end in zip(PARTS, positions, [*positions[1:], len(body)], strict=True):
            if len(body[start + len(part):end].split()) < 5:
                problems.append(f"#{anchor}: {part} says too little")
    assert not problems, "\n".join(problems)
