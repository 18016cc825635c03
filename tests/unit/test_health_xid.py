"""The XID catalog: every common code has a meaning, an action and a severity; unknown codes are generic."""

from __future__ import annotations

import pytest

from nvdash.health.xid import CATALOG, XID_DOCS, xid_info

COMMON = (13, 31, 43, 45, 48, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95, 119, 120)


@pytest.mark.parametrize("code", COMMON)
def test_common_codes_have_a_one_line_meaning_an_action_and_a_severity(code: int) -> None:
    info = xid_info(code)
    assert info.known
    assert info.code == code
    assert info.meaning
    assert "\n" not in info.meaning
    assert info.action
    assert "\n" not in info.action
    assert info.severity in ("warning", "critical")


def test_severities_follow_what_the_error_means_for_the_gpu() -> None:
    critical = {code for code in COMMON if xid_info(code).severity == "critical"}
    assert {48, 62, 64, 74, 79, 95, 119, 120} <= critical
    assert not {13, 31, 43, 45, 63, 92} & critical
    assert xid_info(79).meaning == "GPU fell off the bus"


def test_unknown_codes_get_a_generic_warning_that_points_at_nvidias_catalog() -> None:
    info = xid_info(999)
    assert not info.known
    assert info.code == 999
    assert info.severity == "warning"
    assert "XID 999" in info.meaning
    assert XID_DOCS in info.action
    assert xid_info(None).meaning.startswith("an unknown XID")
    assert 999 not in CATALOG
