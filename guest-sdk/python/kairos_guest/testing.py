"""A test kit: run a plugin's ``run`` in plain CPython (``pytest``, ``unittest``), with
no host and no component build.

Outside a component there is no host behind :mod:`kairos_guest.http`,
:mod:`kairos_guest.log`, :mod:`kairos_guest.schedule` and :func:`kairos_guest.now_ms`:
inside a ``with Kit() as kit:`` block they go to the kit, which answers requests with
the test's handler and records what the plugin did::

    from kairos_guest import testing
    import app

    def test_forwards():
        with testing.Kit().on_http(lambda r: testing.response(202)) as kit:
            out = kit.call(app.run, {"url": "https://hooks.example.com/x", "body": {"n": 1}})
        assert out == {"status": 202}
        assert kit.requests[0].json() == {"n": 1}

``kit.call`` goes through what a firing goes through (the input as JSON, made into the
dataclass ``run`` takes; the output written as JSON); a failed run raises
:class:`Failed` with the message and whether it would be retried.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional, Sequence, Tuple

from . import Context, PlanKind, _native, export_action
from .http import HttpError, Response

__all__ = ["Failed", "Kit", "SentRequest", "context", "response"]


@dataclass
class SentRequest:
    """A request the plugin sent, as sent (``content-length`` included)."""

    method: str
    url: str
    headers: Sequence[Tuple[str, str]] = field(default_factory=list)
    body: bytes = b""

    def header(self, name: str) -> Optional[str]:
        name = name.lower()
        return next((v for k, v in self.headers if k.lower() == name), None)

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


class Failed(Exception):
    """The run failed: its message, and whether the host would run it again."""

    def __init__(self, message: str, retryable: bool) -> None:
        super().__init__(message)
        self.message = message
        self.retryable = retryable


def response(status: int, body: Any = b"", headers: Sequence[Tuple[str, str]] = ()) -> Response:
    """An answer for :meth:`Kit.on_http`: ``body`` as bytes, text, or a value sent as JSON."""
    if not isinstance(body, (bytes, str)):
        body = json.dumps(body)
    data = body.encode() if isinstance(body, str) else body
    return Response(status=status, headers=list(headers), body=data)


def context(**fields: Any) -> Context:
    """A firing's context: the first run of a birth, with ``fields`` changed."""
    values = dict(
        life_id="test-life",
        plan=PlanKind.BIRTH,
        scheduled_at_ms=1_800_000_000_000,
        attempt=1,
        resource_id=None,
        plugin_name="test-plugin",
        plugin_version=1,
    )
    values.update(fields)
    return Context(**values)


class Kit:
    """What the host would do for a run, done by the test: see the module's doc."""

    def __init__(self, now_ms: int = 1_800_000_000_000) -> None:
        self.now_ms = now_ms
        self.requests: List[SentRequest] = []
        self.logs: List[str] = []
        self.bookings: List[Any] = []
        self.cancelled: List[str] = []
        self._handler: Optional[Callable[[SentRequest], Response]] = None
        self._refusal: Optional[Tuple[str, str]] = None

    def on_http(self, handler: Callable[[SentRequest], Response]) -> "Kit":
        """Answers each request with ``handler(request)``; it may raise
        :class:`kairos_guest.http.HttpError` for a request that gets no answer."""
        self._handler = handler
        return self

    def refuse_bookings(self, code: str, message: str = "refused by the test") -> "Kit":
        """Refuses every booking with the REST API's error ``code``."""
        self._refusal = (code, message)
        return self

    def __enter__(self) -> "Kit":
        _native.kit = self
        return self

    def __exit__(self, *exc: Any) -> None:
        _native.kit = None

    def call(self, run: Callable[..., Any], input: Any, ctx: Optional[Context] = None) -> Any:
        """Runs ``run`` as a firing would, with ``input`` (any JSON value); answers its
        output as JSON reads it, or raises :class:`Failed`."""
        ctx = ctx or context()
        wit_ctx = _native.Context(
            life_id=ctx.life_id,
            plan=_native.PlanKind.BIRTH if ctx.plan == PlanKind.BIRTH else _native.PlanKind.DEATH,
            scheduled_at_ms=ctx.scheduled_at_ms,
            attempt=ctx.attempt,
            resource_id=ctx.resource_id,
            plugin_name=ctx.plugin_name,
            plugin_version=ctx.plugin_version,
        )
        entered = _native.kit is not self
        if entered:
            self.__enter__()
        try:
            output = export_action(run)().run(wit_ctx, json.dumps(input))
        except _native.Err as e:
            raise Failed(e.value.message, e.value.retryable) from None
        finally:
            if entered:
                self.__exit__()
        return json.loads(output)

    def _send(self, method: str, url: str, headers: list, data: bytes) -> Response:
        request = SentRequest(method=method, url=url, headers=list(headers), body=data)
        self.requests.append(request)
        if self._handler is None:
            raise HttpError(f"{url}: the test kit has no HTTP handler (Kit().on_http(...))")
        return self._handler(request)

    def _book(self, request: str) -> str:
        if self._refusal is not None:
            raise _native.Err(_native.BookingError(*self._refusal))
        self.bookings.append(json.loads(request))
        return f"booked-{len(self.bookings)}"

    def _cancel(self, life_id: str) -> None:
        if self._refusal is not None:
            raise _native.Err(_native.BookingError(*self._refusal))
        self.cancelled.append(life_id)
