"""An HTTP client over ``wasi:http/outgoing-handler``, the plugin's only way out::

    r = http.get("https://api.example.com/status")
    r = http.post_json("https://hooks.example.com/x", {"a": 1})
    r = http.request("PUT", url, headers={"authorization": "Bearer …"}, json=item)
    if r.ok: item = r.json()

Every request passes the host's outbound policy and the plugin's ``allowed_hosts``; a
refused one raises :class:`HttpError` with ``denied`` true. One that escapes ``run``
is retried when ``retryable`` is true: a request that got no answer (a connect error,
a timeout); not when the host refused it or it could not be made (a URL that is not
absolute ``http://`` or ``https://``, an invalid header). The Rust, JavaScript and
Python SDKs give the same error, with the same text, in each of these cases. An answer
of any status is a :class:`Response`, not an error.

A request that may change something (any method but GET, HEAD, OPTIONS and TRACE)
carries an ``Idempotency-Key`` unless the plugin set one: the run's
``ctx.idempotency_key`` for the first such request of the run, then ``{key}:2``,
``{key}:3``, … A retried run that makes the same requests in the same order sends the
same keys; two different requests of one run never share one.
"""

from __future__ import annotations

import json as _json
import sys as _sys
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional, Sequence, Tuple, Union

# Imported here, not in the functions: componentize-py snapshots the modules imported
# while it builds, and a run has no filesystem to import anything later from.
from componentize_py_types import Err
from wit_world.imports import outgoing_handler, streams
from wit_world.imports import wasi_http_types as t

# wasi:io lets one write carry 4 KiB.
_WRITE_CHUNK = 4096
_READ_CHUNK = 64 * 1024
# Methods that take no body: a request of these without one gets no content-length.
_NO_BODY = ("GET", "HEAD", "DELETE", "OPTIONS", "TRACE")
# Methods that change nothing: no Idempotency-Key of their own.
_SAFE = ("GET", "HEAD", "OPTIONS", "TRACE")

# The run under way: [its idempotency key, how many requests took one so far], set by
# export_action around each run.
_run_key: Optional[list] = None


def _next_idempotency_key() -> Optional[str]:
    if _run_key is None:
        return None
    _run_key[1] += 1
    return _run_key[0] if _run_key[1] == 1 else f"{_run_key[0]}:{_run_key[1]}"


Headers = Union[Mapping[str, str], Iterable[Tuple[str, str]]]


class HttpError(Exception):
    """A request that got no response. ``denied`` is true when the host refused it (the
    target is not in the plugin's ``allowed_hosts`` or the host's list; the run's error
    and logs say which). ``retryable`` (true unless given, or ``denied``): whether the
    run is tried again when the error escapes ``run``."""

    def __init__(self, message: str, denied: bool = False, retryable: Optional[bool] = None) -> None:
        super().__init__(message)
        self.denied = denied
        self.retryable = (not denied) if retryable is None else retryable


def _invalid(message: str) -> HttpError:
    """A request that cannot be made as given: trying again would not help."""
    return HttpError(message, retryable=False)


@dataclass
class Response:
    """A response, read whole."""

    status: int
    headers: Sequence[Tuple[str, str]] = field(default_factory=list)
    """Header names in lower case, in the order received."""
    body: bytes = b""

    @property
    def ok(self) -> bool:
        """True for 2xx."""
        return 200 <= self.status < 300

    def header(self, name: str) -> Optional[str]:
        """The first value of header ``name`` (case-insensitive)."""
        name = name.lower()
        return next((v for k, v in self.headers if k == name), None)

    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")

    def json(self) -> Any:
        try:
            return _json.loads(self.body)
        except ValueError as e:
            raise HttpError(f"the response is not JSON: {e}") from None


def get(url: str, headers: Optional[Headers] = None) -> Response:
    return request("GET", url, headers=headers)


def post_json(url: str, value: Any, headers: Optional[Headers] = None) -> Response:
    return request("POST", url, headers=headers, json=value)


def request(
    method: str,
    url: str,
    headers: Optional[Headers] = None,
    body: Union[bytes, str, None] = None,
    json: Any = None,
) -> Response:
    """Sends a request and reads the whole response. ``json`` (any value ``json.dumps``
    takes) sets the body and ``content-type: application/json``; ``body`` sends bytes
    or text as they are. A body goes out with its ``content-length``."""
    method = method.upper()
    pairs = list(headers.items() if isinstance(headers, Mapping) else headers or [])
    names = {k.lower() for k, _ in pairs}
    data = b""
    if json is not None:
        data = _json.dumps(json, separators=(",", ":")).encode()
        if "content-type" not in names:
            pairs.append(("content-type", "application/json"))
    elif body is not None:
        data = body.encode() if isinstance(body, str) else bytes(body)
    if "content-length" not in names and not (not data and method in _NO_BODY):
        pairs.append(("content-length", str(len(data))))
    if method not in _SAFE and "idempotency-key" not in names:
        key = _next_idempotency_key()
        if key is not None:
            pairs.append(("idempotency-key", key))
    return _send(method, url, pairs, data)


def _split_url(url: str) -> Tuple[str, str, str]:
    for scheme in ("https", "http"):
        prefix = scheme + "://"
        if url.startswith(prefix):
            rest = url[len(prefix):]
            break
    else:
        raise _invalid(f"{url}: only absolute http:// and https:// URLs are supported")
    cut = min([i for i in (rest.find("/"), rest.find("?")) if i >= 0], default=len(rest))
    authority, path = rest[:cut], rest[cut:]
    if not authority:
        raise _invalid(f"{url}: no host")
    if not path:
        path = "/"
    elif path.startswith("?"):
        path = "/" + path
    return scheme, authority, path


def _code_text(code: Any) -> str:
    """A wasi:http error code as every SDK writes it: the case's name in UpperCamelCase
    (``ConnectionRefused``, ``HttpResponseTimeout``), and an internal error's text."""
    name = type(code).__name__.removeprefix("ErrorCode_")
    if isinstance(code, t.ErrorCode_InternalError) and code.value is not None:
        return f"{name}: {code.value}"
    return name


def _error_code(url: str, code: Any) -> HttpError:
    if isinstance(code, t.ErrorCode_HttpRequestDenied):
        # The host adds why to the run's error: which list refused it, and how to allow it.
        return HttpError(f"{url}: the request was denied by the outbound policy", denied=True)
    return HttpError(f"{url}: {_code_text(code)}")


def _stream_error(err: Any) -> str:
    """What a failed stream operation says: its HTTP error code, else the host's text."""
    code = t.http_error_code(err)
    return _code_text(code) if code is not None else err.to_debug_string()


def _send(method: str, url: str, headers: list, data: bytes) -> Response:
    scheme, authority, path = _split_url(url)
    native = _sys.modules.get("kairos_guest._native")
    if native is not None and native.INSTALLED:
        # Plain CPython: the test kit answers (kairos_guest.testing).
        return native.send(method, url, headers, data)
    fields = t.Fields()
    for name, value in headers:
        try:
            fields.append(name.lower(), str(value).encode())
        except Err as e:
            raise _invalid(f"header `{name}`: {type(e.value).__name__}") from None
    methods = {
        "GET": t.Method_Get, "HEAD": t.Method_Head, "POST": t.Method_Post,
        "PUT": t.Method_Put, "DELETE": t.Method_Delete, "CONNECT": t.Method_Connect,
        "OPTIONS": t.Method_Options, "TRACE": t.Method_Trace, "PATCH": t.Method_Patch,
    }
    request = t.OutgoingRequest(fields)
    try:
        request.set_method(methods[method]() if method in methods else t.Method_Other(method))
        request.set_scheme(t.Scheme_Https() if scheme == "https" else t.Scheme_Http())
        request.set_authority(authority)
        request.set_path_with_query(path)
        outgoing_body = request.body()
    except Err:
        raise _invalid(f"{url}: invalid method, authority or path") from None
    try:
        future = outgoing_handler.handle(request, None)
    except Err as e:
        raise _error_code(url, e.value) from None
    # A server may answer before it has read the whole body (and then stop reading):
    # like other clients, prefer its answer to the write error. A body stream found
    # closed says only that the request ended (refused, or the connection failed; the
    # host closes the stream at once, often before the body is written): the request's
    # own error code says why, so neither it nor the short body's size error at
    # ``finish`` is kept.
    write_error = None
    closed = False
    with outgoing_body.write() as stream:
        for i in range(0, len(data), _WRITE_CHUNK):
            try:
                stream.blocking_write_and_flush(data[i : i + _WRITE_CHUNK])
            except Err as e:
                if isinstance(e.value, streams.StreamError_Closed):
                    closed = True
                else:
                    write_error = HttpError(f"{url}: sending the body: {_stream_error(e.value.value)}")
                break
    try:
        t.OutgoingBody.finish(outgoing_body, None)
    except Err as e:
        if not closed:
            write_error = write_error or _error_code(url, e.value)

    with future:
        with future.subscribe() as ready:
            ready.block()
        got = future.get()
    if got is None or isinstance(got, Err):
        raise write_error or HttpError(f"{url}: no response")
    if isinstance(got.value, Err):
        raise write_error or _error_code(url, got.value.value)
    with got.value.value as incoming:
        status = incoming.status()
        with incoming.headers() as h:
            received = [(k, v.decode("utf-8", errors="replace")) for k, v in h.entries()]
        chunks = []
        incoming_body = incoming.consume()
        with incoming_body.stream() as stream:
            while True:
                try:
                    chunks.append(stream.blocking_read(_READ_CHUNK))
                except Err as e:
                    if isinstance(e.value, streams.StreamError_Closed):
                        break
                    raise HttpError(
                        f"{url}: reading the response: {_stream_error(e.value.value)}"
                    ) from None
        t.IncomingBody.finish(incoming_body).__exit__(None, None, None)
    return Response(status=status, headers=received, body=b"".join(chunks))
