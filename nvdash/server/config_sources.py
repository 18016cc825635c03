"""Options from a ``--config`` file and from ``$NVDASH_<OPTION>``, merged under the command line.

One rule for every option: the command line wins over the environment, which wins over the file, which wins over
the default. File and environment values become command-line tokens placed before the real arguments, so each
passes the very checks its flag gets; a message about an option that came from the file or the environment then
says where (``in FILE, key KEY`` or ``from $NVDASH_OPTION``).
"""

from __future__ import annotations

import argparse
import difflib
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nvdash.server.config_file import ConfigError, read_config

ENV_PREFIX = "NVDASH_"
CONFIG_OPTION = "--config"
ENV_CONFIG = "NVDASH_CONFIG"
TRUE_WORDS = ("1", "true", "yes")
FALSE_WORDS = ("0", "false", "no")
_OPTION = re.compile(r"--[a-z0-9][a-z0-9-]*")
_SERVICE_LINK = re.compile(r"(tcp|udp|sctp)://", re.IGNORECASE)
"""Kubernetes (and Docker links) give every pod ``NVDASH_PORT=tcp://ADDRESS:PORT`` for a Service named nvdash in its
namespace: that is not a port setting, and is ignored."""


def env_name(option: str) -> str:
    """``--process-interval`` -> ``NVDASH_PROCESS_INTERVAL``."""
    return ENV_PREFIX + option.lstrip("-").upper().replace("-", "_")


def _long_name(action: argparse.Action) -> str | None:
    return next((option for option in action.option_strings if option.startswith("--")), None)


def settable_options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """The options a file or the environment may set (all but ``--help`` and ``--config``), by long name."""
    options: dict[str, argparse.Action] = {}
    for action in parser._actions:
        name = _long_name(action)
        if name is not None and name != CONFIG_OPTION and not isinstance(action, argparse._HelpAction):
            options[name] = action
    return options


def option_tables(parser: argparse.ArgumentParser, tables: Collection[str]) -> dict[str, str]:
    """Each option's table in a configuration file: the title of the argument group holding it."""
    found: dict[str, str] = {}
    for group in parser._action_groups:
        if group.title is not None and group.title in tables:
            for action in group._group_actions:
                name = _long_name(action)
                if name is not None:
                    found[name] = group.title
    return found


@dataclass(frozen=True)
class Merged:
    """The arguments to parse (file and environment tokens first), and where each non-flag value came from."""

    argv: list[str]
    sources: dict[str, str]

    def attribute(self, message: str) -> str:
        """``message`` with the source of the first option it names that came from the file or the environment."""
        for match in _OPTION.finditer(message):
            where = self.sources.get(match.group())
            if where is not None:
                return f"{message} ({where})"
        return message


def _kind(value: object) -> str:
    kinds: tuple[tuple[type, str], ...] = ((bool, "true or false"), (int, "an integer"), (float, "a decimal number"),
                                           (str, "a string"), (list, "a list"), (dict, "a table"))
    return next((name for kind, name in kinds if isinstance(value, kind)), "a date or time")


def _scalar(option: str, action: argparse.Action, value: object, where: str, in_list: bool) -> str:
    if action.type is int:
        expected, plural, fits = "an integer", "integers", isinstance(value, int) and not isinstance(value, bool)
    elif action.type is float:
        expected, plural = "a number", "numbers"
        fits = isinstance(value, (int, float)) and not isinstance(value, bool)
    else:
        expected, plural, fits = "a string", "strings", isinstance(value, str)
    if not fits:
        if in_list:
            raise ConfigError(f"{option} takes a list of {plural}, not a list holding {_kind(value)} ({where})")
        raise ConfigError(f"{option} takes {expected}, not {_kind(value)} ({where})")
    return str(value)


def _file_tokens(option: str, action: argparse.Action, value: object, where: str) -> list[str]:
    if action.nargs == 0:
        if not isinstance(value, bool):
            raise ConfigError(f"{option} takes true or false, not {_kind(value)} ({where})")
        return [option] if value else []
    if isinstance(action, argparse._AppendAction):
        if not isinstance(value, list):
            raise ConfigError(f"{option} takes a list (it is repeatable), not {_kind(value)} ({where})")
        return [f"{option}={_scalar(option, action, item, where, True)}" for item in value]
    return [f"{option}={_scalar(option, action, value, where, False)}"]


def _env_value(action: argparse.Action, raw: str) -> str | None:
    """The variable's text, or None where it counts as unset (blank, or a service link for a number)."""
    text = raw.strip()
    if not text or (action.type is int and _SERVICE_LINK.match(text)):
        return None
    return text


def _env_tokens(option: str, action: argparse.Action, text: str, name: str) -> list[str]:
    if action.nargs == 0:
        if text.lower() in TRUE_WORDS:
            return [option]
        if text.lower() in FALSE_WORDS:
            return []
        raise ConfigError(f"${name} must be 1, true or yes, or 0, false or no, not {text!r}")
    if isinstance(action, argparse._AppendAction):
        return [f"{option}={part.strip()}" for part in text.split(",") if part.strip()]
    return [f"{option}={text}"]


def _from_file(path: Path, tables: Mapping[str, str], groups: Sequence[str]) -> dict[str, tuple[object, str]]:
    """The file's options, checked against the tables: ``{option: (value, key as written)}``."""
    document = read_config(path)
    found: dict[str, tuple[object, str]] = {}
    names = sorted(option[2:] for option in tables)

    def take(key: str, value: object, table: str | None) -> None:
        label = f"{table}.{key}" if table else key
        option = "--" + key.replace("_", "-")
        home = tables.get(option)
        if option == CONFIG_OPTION:
            raise ConfigError(f"{path}: key {label}: a configuration file cannot name another")
        if home is None:
            close = difflib.get_close_matches(key.replace("_", "-"), names, n=1, cutoff=0.7)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ConfigError(f"{path}: unknown key {label}{hint}")
        if table is not None and home != table:
            raise ConfigError(f"{path}: key {label}: {option} belongs in [{home}], not [{table}]")
        if option in found:
            raise ConfigError(f"{path}: key {label}: {option} is already set by key {found[option][1]}")
        found[option] = (value, label)

    for key, value in document.items():
        if key in groups:
            if not isinstance(value, dict):
                raise ConfigError(f"{path}: key {key} must be a table ([{key}]), not {_kind(value)}")
            for inner, item in value.items():
                take(inner, item, key)
        elif isinstance(value, dict):
            close = difflib.get_close_matches(key, groups, n=1, cutoff=0.6)
            hint = f"did you mean [{close[0]}]?" if close else f"tables: {', '.join(groups)}"
            raise ConfigError(f"{path}: unknown table [{key}] ({hint})")
        else:
            take(key, value, None)
    return found


def _given(factory: Callable[[], argparse.ArgumentParser], argv: Sequence[str]) -> dict[str, Any]:
    """The destinations the command line itself sets (with their values): parsed with every default suppressed."""
    parser = factory()
    for action in parser._actions:
        action.default = argparse.SUPPRESS
    return vars(parser.parse_args(list(argv)))


def merge(
    factory: Callable[[], argparse.ArgumentParser],
    argv: Sequence[str],
    environ: Mapping[str, str],
    *,
    tables: Mapping[str, str],
    groups: Sequence[str],
    read_by_checks: Mapping[str, Collection[str]] = {},
) -> Merged:
    """The command line with the file's and the environment's values put in front, by the precedence rule.

    ``read_by_checks`` names options whose ``$NVDASH_<OPTION>`` the option's own check reads (with the meaning it
    had before this rule, e.g. ``NVDASH_HISTORY=off``): such a variable is not turned into a token, but still
    outranks the file for the options it maps to. Raises :class:`ConfigError` with one line.
    """
    given = _given(factory, argv)
    options = settable_options(factory())
    config = given.get("config")
    where_config = ""
    if config is None and environ.get(ENV_CONFIG, "").strip():
        config, where_config = environ[ENV_CONFIG].strip(), f" (from ${ENV_CONFIG})"
    try:
        from_file = _from_file(Path(config).expanduser(), tables, groups) if config else {}
    except ConfigError as error:
        raise ConfigError(f"{error}{where_config}") from None
    tokens: list[str] = []
    sources: dict[str, str] = {}
    outranked: set[str] = set()
    for option, covered in read_by_checks.items():
        name = env_name(option)
        if option in options and options[option].dest not in given and environ.get(name, "").strip():
            sources[option] = f"from ${name}"
            outranked.update(covered)
    for option, action in options.items():
        if action.dest in given:
            continue
        name = env_name(option)
        text = _env_value(action, environ.get(name, ""))
        if option not in read_by_checks and text is not None:
            tokens += _env_tokens(option, action, text, name)
            sources[option] = f"from ${name}"
        elif option in from_file and option not in outranked:
            value, key = from_file[option]
            where = f"in {config}, key {key}"
            tokens += _file_tokens(option, action, value, where)
            sources[option] = where
    return Merged(argv=[*tokens, *argv], sources=sources)
