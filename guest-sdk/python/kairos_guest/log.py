"""Log lines that land in the run's entry in the Plan's history (the host keeps the
first 64 lines and 16 KiB of a run). ``print`` works too: stdout and stderr are
captured the same way."""

from __future__ import annotations

from wit_world.imports import log as wit_log


def _log(level_name: str, message: str) -> None:
    wit_log.log(getattr(wit_log.Level, level_name), message)


def trace(message: str) -> None:
    _log("TRACE", message)


def debug(message: str) -> None:
    _log("DEBUG", message)


def info(message: str) -> None:
    _log("INFO", message)


def warn(message: str) -> None:
    _log("WARN", message)


def error(message: str) -> None:
    _log("ERROR", message)
