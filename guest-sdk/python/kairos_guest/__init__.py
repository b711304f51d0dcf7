"""Write kairos action plugins in Python.

A plugin is one function that takes the firing's :class:`Context` and its input, and
returns something JSON can write (or raises :class:`Error`); one line exports it::

    from dataclasses import dataclass
    from kairos_guest import Context, Error, export_action, http

    @dataclass
    class Input:
        url: str

    def run(ctx: Context, input: Input) -> dict:
        response = http.get(input.url)
        return {"status": response.status}

    WitWorld = export_action(run, input_schema=schema_of(Input))

``input_schema`` (optional) declares the input's JSON Schema: kairos then refuses a
booking whose input does not fit (400 ``invalid_input``) before it could reach ``run``.

Build it into a component with ``componentize-py`` against the ``kairos:plugin/action``
world in kairos's ``wit/`` (see this directory's README). What a plugin can reach is
what the host gives it: :mod:`kairos_guest.http` (through the host's outbound policy
and the plugin's ``allowed_hosts``), :mod:`kairos_guest.log`, the clock
(:func:`now_ms`) and :mod:`kairos_guest.schedule`. No filesystem, environment or socket.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import types
import typing
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Optional

# Outside a component (a test run in plain CPython) the modules componentize-py
# generates do not exist: stand-ins take their place, answered by the test kit
# (kairos_guest.testing).
try:
    import wit_world  # noqa: F401
except ImportError:
    from . import _native

    _native.install()

# Everything a run uses is imported here: componentize-py snapshots the modules
# imported while it builds, and a run has no filesystem to import from.
from componentize_py_types import Err
from wit_world.imports import kairos_plugin_types as _wit
from wit_world.imports import wall_clock as _wall_clock

from . import http, log, schedule

__all__ = [
    "Context",
    "Error",
    "PlanKind",
    "export_action",
    "schema_of",
    "http",
    "log",
    "now_ms",
    "schedule",
]


class PlanKind(enum.Enum):
    """Which action of a Life is firing."""

    BIRTH = "birth"
    """The start action of a term Life, or the only action of a point Life."""
    DEATH = "death"
    """The end action of a term Life."""


@dataclass(frozen=True)
class Context:
    """What the host knows about the firing that runs the plugin."""

    life_id: str
    """The Life's id (for a timer, its name; for a queue task, ``{queue}/{task}``)."""
    plan: PlanKind
    scheduled_at_ms: int
    """When the Plan was due, in milliseconds since the Unix epoch."""
    attempt: int
    """1 for the first run, 2 for the first retry, and so on."""
    resource_id: Optional[str]
    plugin_name: str
    plugin_version: int

    @property
    def idempotency_key(self) -> str:
        """The ``Idempotency-Key`` a webhook of the same Plan sends, ``{life_id}:{plan}``:
        the same on every retry. :mod:`kairos_guest.http`'s requests that may change
        something send it (after the run's first, ``{key}:{n}``) unless given one."""
        return f"{self.life_id}:{self.plan.value}"


class Error(Exception):
    """Why a run did not succeed.

    ``Error.retryable(msg)`` asks kairos to run the Plan again later, as its action's
    ``retry_count`` and ``retry_interval`` allow; ``Error.fatal(msg)`` fails it at once.
    Any other exception that escapes ``run`` is a fatal error whose message names it.
    """

    def __init__(self, message: str, retryable: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.is_retryable = retryable

    @classmethod
    def retryable(cls, message: str) -> "Error":
        return cls(message, True)

    @classmethod
    def fatal(cls, message: str) -> "Error":
        return cls(message, False)


def now_ms() -> int:
    """The wall-clock time, in milliseconds since the Unix epoch."""
    t = _wall_clock.now()
    return t.seconds * 1000 + t.nanoseconds // 1_000_000


def _parse_input(text: str, annotation: Any) -> Any:
    """The booking's input: JSON, made into ``annotation`` when that is a dataclass."""
    try:
        value = json.loads(text)
    except ValueError as e:
        raise Error.fatal(f"the input is not JSON: {e}") from None
    if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
        return _to_dataclass(annotation, value, "input")
    return value


def _to_dataclass(cls: type, value: Any, path: str) -> Any:
    """``cls(**value)``, refusing a missing or unknown field by its JSON path; fields
    that are dataclasses themselves are made the same way."""
    if not isinstance(value, dict):
        raise Error.fatal(
            f"the input does not fit this plugin: {path} must be an object, not {type(value).__name__}"
        )
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(value) - set(fields))
    if unknown:
        raise Error.fatal(
            f"the input does not fit this plugin: unknown field `{unknown[0]}` in {path}"
        )
    args = {}
    for name, field in fields.items():
        if name not in value:
            if (
                field.default is dataclasses.MISSING
                and field.default_factory is dataclasses.MISSING
            ):
                raise Error.fatal(
                    f"the input does not fit this plugin: missing field `{name}` in {path}"
                )
            continue
        item = value[name]
        hint = hints.get(name)
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            item = _to_dataclass(hint, item, f"{path}.{name}")
        args[name] = item
    return cls(**args)


def _to_json(value: Any) -> str:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    return json.dumps(value, separators=(",", ":"))


def schema_of(cls: type) -> dict:
    """The JSON Schema of a dataclass input as :func:`export_action` reads it: its
    fields (``str``, ``int``, ``float``, ``bool``, ``None``, ``Any``, ``Optional``/unions,
    ``List[...]``, ``Dict[str, ...]``, ``Literal[...]`` and nested dataclasses), those
    without a default required, no others allowed."""
    return _schema(cls)


def _schema(tp: Any) -> dict:
    if tp is Any or tp is object:
        return {}
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        fields = [f for f in dataclasses.fields(tp) if f.init]
        return {
            "type": "object",
            "properties": {f.name: _schema(hints[f.name]) for f in fields},
            "required": [
                f.name
                for f in fields
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            ],
            "additionalProperties": False,
        }
    simple = {str: "string", bool: "boolean", int: "integer", float: "number", type(None): "null"}
    if tp in simple:
        return {"type": simple[tp]}
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Union or origin is types.UnionType:
        return {"anyOf": [_schema(a) for a in args]}
    if origin is typing.Literal:
        return {"enum": list(args)}
    if tp is list or origin is list:
        return {"type": "array", "items": _schema(args[0])} if args else {"type": "array"}
    if tp is dict or origin is dict:
        if len(args) == 2:
            return {"type": "object", "additionalProperties": _schema(args[1])}
        return {"type": "object"}
    return {}


# The input schema each exported ``run`` declares, for the test kit to check inputs
# against as kairos does at booking (kairos_guest.testing).
_input_schemas: "weakref.WeakKeyDictionary[Callable[..., Any], str]" = weakref.WeakKeyDictionary()


def input_schema_of(run: Callable[..., Any]) -> Optional[str]:
    """The input schema (JSON text) that :func:`export_action` declared for ``run``, if
    any."""
    try:
        return _input_schemas.get(run)
    except TypeError:  # not weakly referable: never registered
        return None


def export_action(
    run: Callable[[Context, Any], Any], input_schema: dict | str | None = None
) -> type:
    """Makes ``run(ctx, input)`` the plugin's action.

    Assign the result to ``WitWorld`` in the module you hand to ``componentize-py``.
    The input is the booking's ``input`` parsed from JSON, or, when ``run``'s second
    parameter is annotated with a dataclass, that dataclass (a missing or unknown field
    fails the run with a fatal error naming it). What ``run`` returns (a dataclass, or
    anything ``json.dumps`` takes) is recorded as the run's output.

    ``input_schema``, a JSON Schema (a dict, or its JSON text; :func:`schema_of` makes
    one from a dataclass), is what kairos checks every booking's input against: one
    that does not fit is refused at booking (400 ``invalid_input``). None: any input.
    """
    schema_text = (
        input_schema
        if input_schema is None or isinstance(input_schema, str)
        else json.dumps(input_schema, separators=(",", ":"))
    )
    if schema_text is not None:
        try:
            _input_schemas[run] = schema_text
        except TypeError:  # not weakly referable: the kit cannot find its schema
            pass
    try:
        hints = typing.get_type_hints(run)
    except Exception:  # annotations that do not resolve: take plain JSON
        hints = {}
    params = list(run.__code__.co_varnames[: run.__code__.co_argcount])
    annotation = hints.get(params[1]) if len(params) > 1 else None

    def to_wit(e: Error) -> Err:
        return Err(_wit.PluginError(message=e.message, retryable=e.is_retryable))

    class WitWorld:
        def run(self, ctx: _wit.Context, input: str) -> str:
            context = Context(
                life_id=ctx.life_id,
                plan=PlanKind.BIRTH if ctx.plan == _wit.PlanKind.BIRTH else PlanKind.DEATH,
                scheduled_at_ms=ctx.scheduled_at_ms,
                attempt=ctx.attempt,
                resource_id=ctx.resource_id,
                plugin_name=ctx.plugin_name,
                plugin_version=ctx.plugin_version,
            )
            http._run_key = [context.idempotency_key, 0]
            try:
                output = run(context, _parse_input(input, annotation))
                return _to_json(output)
            except Error as e:
                raise to_wit(e) from None
            except http.HttpError as e:
                raise to_wit(Error(str(e), e.retryable)) from None
            except schedule.BookingError as e:
                raise to_wit(Error.fatal(f"booking refused: {e.code}: {e.message}")) from None
            except Exception as e:  # a bug in the plugin: say where, fail for good
                raise to_wit(Error.fatal(_describe(e))) from None
            finally:
                http._run_key = None

        def input_schema(self) -> Optional[str]:
            return schema_text

    return WitWorld


def _describe(e: BaseException) -> str:
    """``ValueError: message (at app.py:12 in run)`` for an exception nobody caught."""
    where = ""
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is not None:
        code = tb.tb_frame.f_code
        where = f" (at {code.co_filename.rsplit('/', 1)[-1]}:{tb.tb_lineno} in {code.co_name})"
    return f"{type(e).__name__}: {e}{where}"
