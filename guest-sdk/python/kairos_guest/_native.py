"""Stand-ins for the modules componentize-py generates (``wit_world``,
``componentize_py_types``), so that the SDK imports and runs in plain CPython, as in a
``pytest`` or ``unittest`` run: what a host would answer, the test kit
(:mod:`kairos_guest.testing`) answers. A component never imports this module.
"""

from __future__ import annotations

import enum
import sys
import types
from dataclasses import dataclass
from typing import Any, Optional

INSTALLED = False

# The kit now in use (a ``kairos_guest.testing.Kit``), set by its ``with`` block.
kit: Any = None


def _kit() -> Any:
    if kit is None:
        raise RuntimeError(
            "kairos_guest runs natively only inside a test kit: `with testing.Kit() as kit: ...`"
        )
    return kit


class Err(Exception):
    """An error result of a WIT function, its value in ``value``."""

    def __init__(self, value: Any) -> None:
        super().__init__(value)
        self.value = value


class PlanKind(enum.Enum):
    BIRTH = 0
    DEATH = 1


@dataclass
class Context:
    life_id: str
    plan: PlanKind
    scheduled_at_ms: int
    attempt: int
    resource_id: Optional[str]
    plugin_name: str
    plugin_version: int


@dataclass
class PluginError:
    message: str
    retryable: bool


class Level(enum.Enum):
    TRACE = 0
    DEBUG = 1
    INFO = 2
    WARN = 3
    ERROR = 4


@dataclass
class BookingError:
    code: str
    message: str


@dataclass
class Datetime:
    seconds: int
    nanoseconds: int


class ErrorCode_HttpRequestDenied:  # noqa: N801 (the generated module's name)
    pass


def _log(level: Level, message: str) -> None:
    _kit().logs.append(f"{level.name.lower()}: {message}")


def _now() -> Datetime:
    ms = _kit().now_ms
    return Datetime(seconds=ms // 1000, nanoseconds=(ms % 1000) * 1_000_000)


def send(method: str, url: str, headers: list, data: bytes) -> Any:
    """An HTTP request of ``kairos_guest.http``, answered by the kit."""
    return _kit()._send(method, url, headers, data)


def install() -> None:
    """Registers the stand-in modules (once)."""
    global INSTALLED
    if INSTALLED:
        return
    modules = {
        "componentize_py_types": {"Err": Err},
        "wit_world": {},
        "wit_world.imports": {},
        "wit_world.imports.kairos_plugin_types": {
            "PlanKind": PlanKind, "Context": Context, "PluginError": PluginError,
        },
        "wit_world.imports.wall_clock": {"now": _now},
        "wit_world.imports.log": {"Level": Level, "log": _log},
        "wit_world.imports.schedule": {
            "BookingError": BookingError,
            "book": lambda request: _kit()._book(request),
            "cancel": lambda life_id: _kit()._cancel(life_id),
        },
        "wit_world.imports.outgoing_handler": {},
        "wit_world.imports.streams": {},
        "wit_world.imports.wasi_http_types": {
            "ErrorCode_HttpRequestDenied": ErrorCode_HttpRequestDenied,
        },
    }
    for name, attrs in modules.items():
        module = types.ModuleType(name)
        module.__dict__.update(attrs)
        sys.modules[name] = module
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, module)
    INSTALLED = True
