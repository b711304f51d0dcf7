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

``kit.call`` goes through what a booking and a firing go through: the input is checked
against the input schema ``export_action`` declared for ``run``, as kairos checks a
booking (an input that does not fit raises :class:`InvalidInput` with the host's
sentence, and ``run`` is not called); then it is passed as JSON, made into the dataclass
``run`` takes, and the output written as JSON. A failed run raises :class:`Failed` with
the message and whether it would be retried.

The schema is checked with the ``jsonschema`` package from PyPI (``pip install
jsonschema``), as kairos does: draft 2020-12 unless the schema's ``$schema`` names
another, formats checked for drafts 4, 6 and 7 only.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional, Sequence, Tuple

from . import Context, PlanKind, _native, export_action, input_schema_of
from .http import HttpError, Response

__all__ = ["Failed", "InvalidInput", "Kit", "SentRequest", "context", "response"]


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


class InvalidInput(Failed):
    """The input does not fit the plugin's input schema: kairos would refuse the booking
    (400 ``invalid_input``) and nothing would run. ``message`` is the 400's message
    (``birth.input at /url does not fit the input schema of plugin `test-plugin`: 5 is
    not of type "string"``), ``path`` the JSON pointer to the place (empty: the input
    itself); not retryable."""

    code = "invalid_input"

    def __init__(self, message: str, path: str) -> None:
        super().__init__(message, False)
        self.path = path


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
        schema = input_schema_of(run)
        if schema is not None:
            what = f"{ctx.plan.value}.input"
            _check_input(json.loads(schema), json.loads(json.dumps(input)), ctx.plugin_name, what)
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


def _check_input(schema: Any, value: Any, plugin: str, what: str) -> None:
    """Raises :class:`InvalidInput` when ``value`` does not fit ``schema``, in the words
    of the host's 400 (plugins/registry.rs: ``{what} at {path} does not fit the input
    schema of plugin `{plugin}`: {violation}``, the first violation as the Rust
    ``jsonschema`` crate kairos uses words it)."""
    try:
        import jsonschema
    except ImportError:
        raise RuntimeError(
            "the test kit checks the input against the plugin's input schema, as kairos "
            "does at booking, with the jsonschema package: pip install jsonschema"
        ) from None
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    drafts_with_formats = (
        jsonschema.Draft4Validator,
        jsonschema.Draft6Validator,
        jsonschema.Draft7Validator,
    )
    checker = cls.FORMAT_CHECKER if cls in drafts_with_formats else None
    errors = list(cls(schema, format_checker=checker).iter_errors(value))
    if not errors:
        return
    # The one the host names first (sorted() keeps the order of equal keys).
    error = sorted(errors, key=lambda e: _host_order(e.relative_schema_path, e.absolute_path))[0]
    where = list(error.absolute_path) + _false_property(schema, value, error)
    path = "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in where)
    at = f" at {path}" if path else ""
    raise InvalidInput(
        f"{what}{at} does not fit the input schema of plugin `{plugin}`: {_violation(error)}",
        path,
    )


# Keywords followed in a schema path by a name, or by an index.
_NAMED = {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"}
_INDEXED = {"prefixItems", "allOf", "anyOf", "oneOf"}


def _host_order(schema_path: Any, instance_path: Any) -> tuple:
    """Where a violation comes in the order the host checks: at each level of the schema
    its keywords by name (``additionalProperties`` together with ``properties``, after
    it), properties by name, subschemas by index; then the instance's place."""
    key = []
    arg = None
    for part in schema_path:
        if arg == "name":
            key.append((1, str(part), 0))
        elif arg == "index":
            key.append((2, "", int(part)))
        else:
            key.append((0, "properties\x01" if part == "additionalProperties" else str(part), 0))
        arg = None if arg else ("name" if part in _NAMED else "index" if part in _INDEXED else None)
    place = tuple((0, "", p) if isinstance(p, int) else (1, str(p), 0) for p in instance_path)
    return tuple(key), place


def _false_property(schema: Any, value: Any, error: Any) -> list:
    """The property a ``false`` subschema under ``properties`` refused: jsonschema leaves
    it out of the error's path (the host does not), so it is found again here."""
    if error.validator is not None or error.schema is not False:
        return []
    try:
        node, instance = schema, value
        for key in error.absolute_schema_path:
            node = node[key]
        for key in error.absolute_path:
            instance = instance[key]
        if list(error.absolute_schema_path)[-1:] == ["properties"]:
            return [next(k for k, v in node.items() if v is False and k in instance)]
    except (KeyError, IndexError, TypeError, StopIteration):
        pass
    return []


def _shown(value: Any) -> str:
    """A JSON value as the host shows it (serde_json: compact, keys sorted)."""
    return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


def _plural(n: Any, one: str, many: str) -> str:
    return f"{_shown(n)} {one if n == 1 else many}"


def _either(options: list) -> str:
    """``a, b or c``, or ``a, b or N other candidates`` past three."""
    shown = [_shown(o) for o in options]
    if len(shown) > 3:
        return f"{', '.join(shown[:2])} or {len(shown) - 2} other candidates"
    return shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} or {shown[-1]}"


def _violation(e: Any) -> str:
    """What is wrong, worded as the Rust jsonschema crate words it."""
    keyword, expected, instance = e.validator, e.validator_value, e.instance
    shown = _shown(instance)
    if keyword == "type":
        if isinstance(expected, list):
            return f"{shown} is not of types " + ", ".join(f'"{t}"' for t in sorted(expected))
        return f'{shown} is not of type "{expected}"'
    if keyword in ("required", "dependentRequired"):
        needed = expected if keyword == "required" else next(
            (v for k, v in expected.items() if k in instance and any(p not in instance for p in v)), []
        )
        missing = next((p for p in needed if p not in instance), None)
        if missing is not None:
            return f"{_shown(missing)} is a required property"
    if keyword in ("additionalProperties", "unevaluatedProperties") and expected is False:
        schema = e.schema
        extra = sorted(
            k
            for k in instance
            if k not in schema.get("properties", {})
            and not any(re.search(p, k) for p in schema.get("patternProperties", {}))
        )
        kind = "Additional" if keyword == "additionalProperties" else "Unevaluated"
        verb = "was" if len(extra) == 1 else "were"
        names = ", ".join(f"'{k}'" for k in extra)
        return f"{kind} properties are not allowed ({names} {verb} unexpected)"
    simple = {
        "enum": lambda: f"{shown} is not one of {_either(expected)}",
        "const": lambda: f"{_shown(expected)} was expected",
        "minimum": lambda: f"{shown} is less than the minimum of {_shown(expected)}",
        "maximum": lambda: f"{shown} is greater than the maximum of {_shown(expected)}",
        "exclusiveMinimum": lambda: f"{shown} is less than or equal to the minimum of {_shown(expected)}",
        "exclusiveMaximum": lambda: f"{shown} is greater than or equal to the maximum of {_shown(expected)}",
        "multipleOf": lambda: f"{shown} is not a multiple of {_shown(expected)}",
        "minLength": lambda: f"{shown} is shorter than {_plural(expected, 'character', 'characters')}",
        "maxLength": lambda: f"{shown} is longer than {_plural(expected, 'character', 'characters')}",
        "minItems": lambda: f"{shown} has less than {_plural(expected, 'item', 'items')}",
        "maxItems": lambda: f"{shown} has more than {_plural(expected, 'item', 'items')}",
        "minProperties": lambda: f"{shown} has less than {_plural(expected, 'property', 'properties')}",
        "maxProperties": lambda: f"{shown} has more than {_plural(expected, 'property', 'properties')}",
        "pattern": lambda: f'{shown} does not match "{expected}"',
        "format": lambda: f'{shown} is not a "{expected}"',
        "uniqueItems": lambda: f"{shown} has non-unique elements",
        "anyOf": lambda: f"{shown} is not valid under any of the schemas listed in the 'anyOf' keyword",
        "oneOf": lambda: (
            f"{shown} is valid under more than one of the schemas listed in the 'oneOf' keyword"
            if "is valid under each of" in e.message
            else f"{shown} is not valid under any of the schemas listed in the 'oneOf' keyword"
        ),
        "not": lambda: f"{_shown(expected)} is not allowed for {shown}",
        "contains": lambda: f"None of {shown} are valid under the given schema",
        "false": lambda: f"False schema does not allow {shown}",
    }
    if keyword is None and e.schema is False:
        keyword = "false"
    if keyword in simple:
        return simple[keyword]()
    return e.message
