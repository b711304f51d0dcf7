"""Booking follow-up work from inside a run, exactly as ``POST /schedules`` would.

A run may book at most 16 Lives. A refusal raises :class:`BookingError` with the REST
API's error ``code`` (``too_soon``, ``unknown_plugin``, ``resource_conflict``, …); left
uncaught, it fails the run (not retried).
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any, Optional

# Imported at the top: a run cannot import (see http.py).
from componentize_py_types import Err
from wit_world.imports import schedule as wit


class BookingError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


def book(request: dict) -> str:
    """Books a Life with ``request`` as the whole ``POST /schedules`` body; returns its id."""
    try:
        return wit.book(json.dumps(request))
    except Err as e:
        raise BookingError(e.value.code, e.value.message) from None


def book_point(at_ms: int, action: dict, life_uuid: Optional[str] = None) -> str:
    """Books a point Life that runs ``action`` (a webhook or ``{"plugin": …, "input": …}``)
    at ``at_ms`` (milliseconds since the Unix epoch); returns its id."""
    at = datetime.fromtimestamp(at_ms / 1000, tz=timezone.utc)
    body: dict[str, Any] = {
        "schedule_type": "point",
        "birth_time": at.isoformat(timespec="milliseconds"),
        "birth": action,
    }
    if life_uuid is not None:
        body["life_uuid"] = life_uuid
    return book(body)


def cancel(life_id: str) -> None:
    """Cancels a Life as ``DELETE /schedules/{life_id}`` would."""
    try:
        wit.cancel(life_id)
    except Err as e:
        raise BookingError(e.value.code, e.value.message) from None
