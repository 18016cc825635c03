"""Every nvdash reading of the real GPUs beside nvidia-smi's, printed as one table.

Run on a machine with an NVIDIA driver: ``python -m pytest -s tests/gpu/test_nvsmi_parity.py`` (``-s`` shows
the table; without a driver the test is skipped, see conftest.py). nvidia-smi is asked with
``--query-gpu=... --format=csv,noheader,nounits`` (only the fields its ``--help-query-gpu`` lists), ``-q -x``,
and, where a GPU has NVLink, ``nvlink -s`` and ``nvlink -e``. The tolerances are in tests/gpu/parity.py: what cannot
move between the two reads (names, limits, maxima, thresholds, link generation and width, NVLink speed) must match
to nvidia-smi's printed precision, momentary readings within a stated drift.
"""

from __future__ import annotations

import pytest

from nvdash.sampling.hardware import Hardware
from tests.gpu import nvsmi
from tests.gpu.parity import CSV_FIELDS, SmiOutput, build_checks, format_table

pytestmark = pytest.mark.gpu


def test_every_reading_matches_nvidia_smi(hardware: Hardware) -> None:
    source = hardware.gpus
    assert source is not None, hardware.inventory.nvml_error
    infos = hardware.inventory.gpus
    samples = source.read(5.0)
    usages = source.read_usage(10.0)
    known = nvsmi.query_fields(nvsmi.run("--help-query-gpu"))
    fields = [name for name in CSV_FIELDS if name in known]
    rows = nvsmi.parse_query_csv(nvsmi.run(f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"), fields)
    xml_gpus = nvsmi.parse_smi_xml(nvsmi.run("-q", "-x"))
    speeds: dict[int, dict[int, float | None]] = {}
    errors: dict[int, dict[int, dict[str, int]]] = {}
    if any(info.has_nvlink for info in infos):
        speeds = nvsmi.parse_nvlink_speeds(nvsmi.run("nvlink", "-s"))
        errors = nvsmi.parse_nvlink_errors(nvsmi.run("nvlink", "-e"))
    checks = build_checks(infos, samples, usages, SmiOutput(rows, xml_gpus, speeds, errors))
    print("\n" + format_table(checks))
    failed = [check for check in checks if check.ok is False]
    assert not failed, "readings that differ from nvidia-smi:\n" + format_table(failed)
    assert any(check.ok for check in checks), "nothing was compared"
