"""The alert rules and their promtool tests under dcgm-exporter 4.9's naming, generated from the 4.8 files.

``deploy/prometheus/nvdash-alerts.yml`` reads 4.8's names (nvdash's default). A Prometheus scraping nvdash with
``--metrics-compat 4.9`` (or dcgm-exporter 4.9) needs the same rules under 4.9's names, or they stay silent. This
module writes ``nvdash-alerts-4.9.yml`` and ``tests/nvdash-alerts-4.9-test.yml`` from the 4.8 files and the one
mapping, :data:`nvdash.metrics.compat.RENAMES_4_9` / :data:`~nvdash.metrics.compat.LABEL_RENAMES_4_9`, so the two
can never drift:

- every renamed family and label is renamed (in expressions, ``query`` templates, labels, test series);
- test series values of a family whose unit changed are converted with the mapping's factor;
- what a rename alone cannot get right (a threshold in a changed unit, a message that prints such a value) is
  converted by :data:`RULE_CONVERSIONS` and :data:`TEST_EDITS`, one entry per rule. A rule that reads a family
  whose unit changed and has no entry there is refused, so nobody ships a ``> 50`` that now compares a 0-1 ratio.

It edits the text, not a YAML tree, so the 4.9 files keep the 4.8 files' comments and layout.
Run ``python -m nvdash.metrics.rules_compat`` from the repository root to write the files, ``--check`` to fail
(exit 1) when they are out of date.
"""

from __future__ import annotations

import argparse
import re
import sys
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from nvdash.metrics.compat import LABEL_RENAMES_4_9, RENAMES_4_9, Rename

RULES_4_8 = "nvdash-alerts.yml"
RULES_4_9 = "nvdash-alerts-4.9.yml"
TESTS_4_8 = "tests/nvdash-alerts-test.yml"
TESTS_4_9 = "tests/nvdash-alerts-4.9-test.yml"
DEFAULT_DIR = Path("deploy") / "prometheus"
COMMAND = "python -m nvdash.metrics.rules_compat"
NAMING_MARKER = "# Naming:"
"""The 4.8 rules file's header paragraph about naming starts with this line; the 4.9 file gets its own."""


class ConversionError(ValueError):
    """The 4.8 files hold something the generator cannot convert safely; the message says what and where."""


@dataclass(frozen=True)
class Threshold:
    """A comparison of ``family`` (4.8 name, optionally with a ``{...}`` matcher) with the number ``value``: the
    number is converted to the family's 4.9 unit with the mapping's factor."""

    family: str
    op: str
    value: float


@dataclass(frozen=True)
class Edit:
    """Text the rename cannot get right, e.g. a message printing a value in the old unit: ``old`` (4.8 text) is
    replaced by ``new`` (4.9 text)."""

    old: str
    new: str


Conversion = Threshold | Edit

RULE_CONVERSIONS: Mapping[str, tuple[Conversion, ...]] = {
    # "Busy" is above 50 % in 4.8, above 0.5 as a ratio in 4.9.
    "NvdashGpuPcieLinkGenDowntrained": (Threshold("DCGM_FI_DEV_GPU_UTIL", ">", 50),),
    # The expression compares used memory with used + free: unit-free. The message prints bytes now.
    "NvdashGpuMemoryFillingUp": (
        Edit("# FB_* are MiB;", "# FB_*_BYTES are bytes;"),
        Edit('{{ printf "%.0f" $value }} MiB', "{{ $value | humanize1024 }}B"),
        Edit('{{ . | first | value | printf "%.0f" }} MiB', "{{ . | first | value | humanize1024 }}B"),
    ),
    # `== 0` is the same in both units. The message prints a ratio now.
    "NvdashGpuAllocatedButIdle": (
        Edit("{{ $value }} % utilization", "{{ $value | humanizePercentage }} utilization"),
    ),
}
"""Rule -> what its 4.9 twin needs beyond the renames. Every rule that reads a family whose unit changes must be
here, even with nothing to convert (then it is an empty tuple, checked by hand: e.g. a ratio of two such families)."""

TEST_EDITS: Mapping[str, tuple[Edit, ...]] = {
    # humanize1024: 84000 MiB = 82.03125 GiB, 81000 MiB = 79.1015625 GiB, printed with 4 significant digits.
    "NvdashGpuMemoryFillingUp": (
        Edit("need 84000 MiB in 30 minutes", "need 82.03GiB in 30 minutes"),
        Edit("more than its 81000 MiB.", "more than its 79.1GiB."),
    ),
    # humanizePercentage of 0.
    "NvdashGpuAllocatedButIdle": (Edit("at 0 % utilization", "at 0% utilization"),),
}
"""Alert -> edits of the expected annotations in its promtool tests (the messages of :data:`RULE_CONVERSIONS`)."""

FILE_RENAMES = {"nvdash-alerts.yml": RULES_4_9, "nvdash-alerts-test.yml": TESTS_4_9.rsplit("/", 1)[1]}

_RULE_START = re.compile(r"^\s*- alert:\s*(\S+)\s*$")
_TEST_START = re.compile(r"^  - name:")
_ALERTNAME = re.compile(r"^\s*(?:- )?alertname:\s*(\S+)\s*$")
_SERIES = re.compile(r"^\s*- series:\s*['\"]?([A-Za-z_:][A-Za-z0-9_:]*)")
_VALUES_KEY = re.compile(r"^\s*values:")
_VALUES = re.compile(r"^(\s*values:\s*(['\"]?))([^'\"\n]*)(\2\s*)$")
_NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
_VALUE_ITEM = re.compile(rf"^(?P<start>{_NUMBER})(?:(?P<sign>[-+])(?P<step>{_NUMBER}))?(?:x(?P<times>\d+))?$")


def unit_changes(renames: Mapping[str, Rename] = RENAMES_4_9) -> dict[str, Rename]:
    """The renamed families whose value changes (a factor other than 1)."""
    return {old: rename for old, rename in renames.items() if rename.factor / rename.divisor != 1.0}


def format_number(value: float) -> str:
    """A number as promtool and PromQL read it back exactly: integers without a point, others in Python's shortest
    round-trip form."""
    value = float(value)
    if value.is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(value)


def convert(value: float, rename: Rename) -> float:
    """``value`` in the new unit, computed as nvdash's ``/metrics`` computes it."""
    return value * rename.factor / rename.divisor


def convert_values(values: str, rename: Rename) -> str:
    """A promtool series' ``values`` string ("a+bxn", "axn", "_", "stale") in the new unit."""
    items: list[str] = []
    for item in values.split():
        if item == "stale" or re.fullmatch(r"_(?:x\d+)?", item):
            items.append(item)
            continue
        match = _VALUE_ITEM.match(item)
        if match is None:
            raise ConversionError(f"cannot convert the series value {item!r} (in {values!r}) to {rename.name}'s unit")
        text = format_number(convert(float(match["start"]), rename))
        if match["step"] is not None:
            text += match["sign"] + format_number(convert(float(match["step"]), rename))
        if match["times"] is not None:
            text += "x" + match["times"]
        items.append(text)
    return " ".join(items)


def _word_pattern(words: Sequence[str]) -> re.Pattern[str]:
    return re.compile(r"(?<!\w)(" + "|".join(re.escape(word) for word in sorted(words, key=len, reverse=True))
                      + r")(?!\w)")


def rename_text(text: str, renames: Mapping[str, Rename] = RENAMES_4_9,
                labels: Mapping[str, str] = LABEL_RENAMES_4_9) -> str:
    """``text`` with every 4.8 family and label name (whole words) and file name replaced by its 4.9 name."""
    names = {old: rename.name for old, rename in renames.items()} | dict(labels)
    text = _word_pattern(list(names)).sub(lambda match: names[match[1]], text)
    files = re.compile("|".join(re.escape(name) for name in FILE_RENAMES) + r"(?![\w.-])")
    return files.sub(lambda match: FILE_RENAMES[match[0]], text)


def _sections(lines: list[str], start: Callable[[str], str | None], reset: Callable[[str], bool]) -> list[str | None]:
    """For each line, the alert whose section it is in (``None`` before the first or after a reset)."""
    owners: list[str | None] = []
    current: str | None = None
    for line in lines:
        if reset(line):
            current = None
        name = start(line)
        if name is not None:
            current = name
        owners.append(current)
    return owners


def _rule_name(line: str) -> str | None:
    match = _RULE_START.match(line)
    return None if match is None else match[1]


def _is_test_start(line: str) -> bool:
    return _TEST_START.match(line) is not None


def _alertname(line: str) -> str | None:
    match = _ALERTNAME.match(line)
    return None if match is None else match[1]


def _apply(text: str, conversion: Conversion, rule: str, renames: Mapping[str, Rename], exactly_once: bool) -> str:
    if isinstance(conversion, Edit):
        count = text.count(conversion.old)
        if count == 0 or (exactly_once and count > 1):
            raise ConversionError(f"{rule}: the 4.9 edit of {conversion.old!r} matches {count} times, not once: "
                                  f"update {__name__}'s conversions")
        return text.replace(conversion.old, conversion.new)
    rename = renames.get(conversion.family)
    if rename is None:
        raise ConversionError(f"{rule}: {conversion.family} is not renamed in 4.9: drop its threshold conversion")
    number = rf"(?<![\w.]){re.escape(format_number(conversion.value))}(?![\w.])"
    pattern = re.compile(rf"\b({re.escape(conversion.family)}\b(?:\{{[^}}]*\}})?\s*{re.escape(conversion.op)}\s*)"
                         + number)
    new, count = pattern.subn(lambda match: match[1] + format_number(convert(conversion.value, rename)), text)
    if count != 1:
        raise ConversionError(f"{rule}: the threshold {conversion.family} {conversion.op} "
                              f"{format_number(conversion.value)} matches {count} times, not once: update "
                              f"{__name__}'s conversions")
    return new


def _convert_sections(text: str, owners_of: Callable[[list[str]], list[str | None]],
                      conversions: Mapping[str, Sequence[Conversion]], renames: Mapping[str, Rename],
                      exactly_once: bool) -> str:
    lines = text.splitlines(keepends=True)
    owners = owners_of(lines)
    for rule, rule_conversions in conversions.items():
        if not rule_conversions:
            continue
        indices = [index for index, owner in enumerate(owners) if owner == rule]
        if not indices:
            raise ConversionError(f"{rule} is not in the 4.8 file: drop its entry from {__name__}'s conversions")
        # A rule's section is contiguous in the rules file; a test file may test one alert in several places.
        runs: list[list[int]] = []
        for index in indices:
            if runs and runs[-1][-1] == index - 1:
                runs[-1].append(index)
            else:
                runs.append([index])
        joined = "\x00".join("".join(lines[index] for index in run) for run in runs)
        for conversion in rule_conversions:
            joined = _apply(joined, conversion, rule, renames, exactly_once)
        for run, chunk in zip(runs, joined.split("\x00"), strict=True):
            lines[run[0]:run[-1] + 1] = [chunk, *[""] * (len(run) - 1)]
    return "".join(lines)


def check_unit_changes(rules_text: str, conversions: Mapping[str, Sequence[Conversion]],
                       renames: Mapping[str, Rename] = RENAMES_4_9) -> None:
    """Raises :class:`ConversionError` for a rule that reads a family whose unit changes and has no conversion
    entry: its 4.9 twin would compare or print a value in the wrong unit."""
    changed = _word_pattern(list(unit_changes(renames)))
    lines = rules_text.splitlines()
    for rule, line in zip(_sections(lines, _rule_name, lambda _: False), lines, strict=True):
        if rule is None or line.lstrip().startswith("#") or rule in conversions:
            continue
        match = changed.search(line)
        if match is not None:
            raise ConversionError(
                f"{rule} reads {match[1]}, whose unit changes in dcgm-exporter 4.9 ({renames[match[1]].name}): add "
                f"its threshold and message conversions to {__name__}.RULE_CONVERSIONS (an empty entry if none "
                "is needed)")


def _naming_paragraph(rules_text: str, renames: Mapping[str, Rename], labels: Mapping[str, str],
                      conversions: Mapping[str, Sequence[Conversion]]) -> list[str]:
    used = sorted(name for name in renames if re.search(rf"(?<!\w){name}(?!\w)", _rule_lines(rules_text)))
    lines = _comment(f"Naming: the rules of {RULES_4_8} for dcgm-exporter 4.9's names, units and labels: load this "
                     "file for nvdash with --metrics-compat 4.9 (or dcgm-exporter 4.9), never together with "
                     f"{RULES_4_8}. The families these rules read that 4.9 renames:")
    for name in used:
        rename = renames[name]
        unit = "" if rename.unit is None else f" ({rename.unit[0][1:-1]} -> {rename.unit[1][1:-1]})"
        lines.append(f"#   {name} -> {rename.name}{unit}\n")
    converted = sorted(rule for rule, items in conversions.items() if items)
    lines += _comment("Labels: " + ", ".join(f"{old} -> {new}" for old, new in labels.items()) + ". Thresholds "
                      "and messages converted for the new units: " + ", ".join(converted) + ".")
    return lines


def _comment(text: str) -> list[str]:
    """``text`` as YAML comment lines within the files' 120 columns."""
    return [line + "\n" for line in textwrap.wrap(text, width=118, initial_indent="# ", subsequent_indent="# ",
                                                    break_on_hyphens=False)]


def _rule_lines(rules_text: str) -> str:
    """The rules' own lines (from ``groups:`` on, comments left out)."""
    body = rules_text.split("\ngroups:", 1)[-1]
    return "\n".join(line for line in body.splitlines() if not line.lstrip().startswith("#"))


def _replace_naming_paragraph(text: str, paragraph: list[str]) -> str:
    lines = text.splitlines(keepends=True)
    starts = [index for index, line in enumerate(lines) if line.startswith(NAMING_MARKER)]
    if len(starts) != 1:
        raise ConversionError(f"the header of {RULES_4_8} needs one paragraph starting {NAMING_MARKER!r} "
                              f"(found {len(starts)})")
    end = starts[0]
    while end < len(lines) and lines[end].strip() != "#":
        end += 1
    return "".join([*lines[:starts[0]], *paragraph, *lines[end:]])


def generate_rules(rules_text: str, conversions: Mapping[str, Sequence[Conversion]] = RULE_CONVERSIONS,
                   renames: Mapping[str, Rename] = RENAMES_4_9,
                   labels: Mapping[str, str] = LABEL_RENAMES_4_9) -> str:
    """The 4.9 rules file for the 4.8 ``rules_text``."""
    check_unit_changes(rules_text, conversions, renames)
    converted = _convert_sections(rules_text, lambda lines: _sections(lines, _rule_name, lambda _: False),
                                  conversions, renames, exactly_once=True)
    notice = _comment(f"GENERATED from {RULES_4_8} by `{COMMAND}`: do not edit this file; edit {RULES_4_8} and run "
                      "that command.")
    return "".join(notice) + _replace_naming_paragraph(rename_text(converted, renames, labels),
                                                       _naming_paragraph(rules_text, renames, labels, conversions))


def generate_tests(tests_text: str, edits: Mapping[str, Sequence[Edit]] = TEST_EDITS,
                   renames: Mapping[str, Rename] = RENAMES_4_9, labels: Mapping[str, str] = LABEL_RENAMES_4_9) -> str:
    """The 4.9 promtool tests for the 4.8 ``tests_text``: series renamed and their values converted, expected labels
    renamed, expected messages edited."""
    text = _convert_sections(tests_text, lambda lines: _sections(lines, _alertname, _is_test_start),
                             edits, renames, exactly_once=False)
    lines = text.splitlines(keepends=True)
    changed = unit_changes(renames)
    family: str | None = None
    for index, line in enumerate(lines):
        series = _SERIES.match(line)
        if series is not None:
            family = series[1]
            continue
        if family is not None and _VALUES_KEY.match(line):
            rename = changed.get(family)
            values = _VALUES.match(line)
            if rename is not None:
                if values is None:
                    raise ConversionError(f"cannot read the values of a {family} series to convert: {line.strip()!r}")
                lines[index] = values[1] + convert_values(values[3], rename) + values[4]
            family = None
    header = _comment(f"GENERATED from {TESTS_4_8.rsplit('/', 1)[1]} by `{COMMAND}`: do not edit this file; edit "
                      "the 4.8 tests and run that command. Series and expected labels carry dcgm-exporter 4.9's names; "
                      "the values of families whose unit changed are converted (% -> ratio, MiB -> bytes), while the "
                      "comments keep 4.8's units.")
    return "".join(header) + rename_text("".join(lines), renames, labels)


@dataclass(frozen=True)
class Output:
    """One generated file: where it goes and what it must hold."""

    path: Path
    text: str


def outputs(directory: Path) -> list[Output]:
    """The two 4.9 files generated from the 4.8 files in ``directory``."""
    try:
        rules = (directory / RULES_4_8).read_text(encoding="utf-8")
        tests = (directory / TESTS_4_8).read_text(encoding="utf-8")
    except OSError as error:
        raise ConversionError(f"cannot read the 4.8 rules: {error}") from None
    return [Output(directory / RULES_4_9, generate_rules(rules)), Output(directory / TESTS_4_9, generate_tests(tests))]


def stale(directory: Path) -> list[Path]:
    """The generated files in ``directory`` that differ from what the 4.8 files give now."""
    found: list[Path] = []
    for output in outputs(directory):
        try:
            current = output.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            current = None
        if current != output.text:
            found.append(output.path)
    return found


def main(argv: Sequence[str] | None = None) -> int:
    """Writes (or with ``--check`` checks) the 4.9 rules and tests; one line on stderr for each problem."""
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR,
                        help=f"the folder with {RULES_4_8} and {TESTS_4_8} (default: {DEFAULT_DIR})")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if the 4.9 files are out of date")
    options = parser.parse_args(argv)
    try:
        if options.check:
            out_of_date = stale(options.dir)
            for path in out_of_date:
                print(f"{path} is out of date with its 4.8 twin: run {COMMAND}", file=sys.stderr)
            return 1 if out_of_date else 0
        for output in outputs(options.dir):
            output.path.write_text(output.text, encoding="utf-8")
            print(f"wrote {output.path}")
    except (ConversionError, OSError) as error:
        print(f"{COMMAND}: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
