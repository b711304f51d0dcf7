// Write kairos action plugins in JavaScript.
//
// A plugin is one async function that takes the firing's context and its parsed input,
// and returns something JSON.stringify can write (or throws a PluginError); one line
// exports it:
//
//     import { exportAction, http } from 'kairos-guest';
//     export const run = exportAction(async (ctx, input) => {
//       const response = await http.get(input.url);
//       return { status: response.status };
//     });
//
// Build it into a component with componentize-js against the kairos:plugin/action world
// in kairos's wit/ (see this directory's README). What a plugin can reach is what the
// host gives it: `http` (wasi:http, through the host's outbound policy and the plugin's
// allowed_hosts), `log`, the clock (`nowMs`) and `schedule`. No filesystem, environment
// or socket.

import { log as witLog } from 'kairos:plugin/log@0.1.0';
import { book as witBook, cancel as witCancel } from 'kairos:plugin/schedule@0.1.0';
import { handle } from 'wasi:http/outgoing-handler@0.2.12';
import {
  Fields,
  IncomingBody,
  OutgoingBody,
  OutgoingRequest,
  httpErrorCode,
} from 'wasi:http/types@0.2.12';

/** Why a run did not succeed: `retryable` lets the host run the Plan again later (as
 * its action's retry_count allows); a fatal one fails the Plan at once. */
export class PluginError extends Error {
  constructor(message, retryable = false) {
    super(message);
    this.name = 'PluginError';
    this.retryable = retryable;
    // The WIT `plugin-error` record, as the component's `run` returns it.
    this.payload = { message: String(message), retryable };
  }
  static retryable(message) {
    return new PluginError(message, true);
  }
  static fatal(message) {
    return new PluginError(message, false);
  }
}

/** A request that got no response: a PluginError, retryable when it got no answer (a
 * connect error, a timeout); not when the host refused it (`denied`: the target is not
 * in the plugin's allowed_hosts or the host's list; the run's error and logs say which)
 * or it could not be made (a URL that is not absolute http:// or https://, an invalid
 * header). The Rust, JavaScript and Python SDKs give the same error, with the same
 * text, in each of these cases. */
export class HttpError extends PluginError {
  constructor(message, { denied = false, retryable = !denied } = {}) {
    super(message, retryable);
    this.name = 'HttpError';
    this.denied = denied;
  }
}

/** A refused booking: the REST API's error `code` and `message`. */
export class BookingError extends Error {
  constructor(code, message) {
    super(`${code}: ${message}`);
    this.name = 'BookingError';
    this.code = code;
  }
}

const line = (level) => (...parts) => witLog(level, parts.map(String).join(' '));

/** Lines for the run's entry in the Plan's history (the first 64 lines, 16 KiB each). */
export const log = {
  trace: line('trace'),
  debug: line('debug'),
  info: line('info'),
  warn: line('warn'),
  error: line('error'),
};

function bookingError(e) {
  const p = e && e.payload ? e.payload : e;
  return p && p.code ? new BookingError(p.code, p.message) : e;
}

/** Books follow-up work as POST /schedules would (the request is the JSON body, as an
 * object), and cancels Lives as DELETE /schedules/{id} would. */
export const schedule = {
  book(request) {
    try {
      return witBook(typeof request === 'string' ? request : JSON.stringify(request));
    } catch (e) {
      throw bookingError(e);
    }
  },
  cancel(lifeId) {
    try {
      witCancel(lifeId);
    } catch (e) {
      throw bookingError(e);
    }
  },
};

// The run under way: its idempotency key and how many requests took one so far.
let runKey = null;
// Methods that change nothing: no Idempotency-Key of their own.
const SAFE = ['GET', 'HEAD', 'OPTIONS', 'TRACE'];
// Methods that take no body: a request of these without one gets no content-length.
const NO_BODY = ['GET', 'HEAD', 'DELETE', 'OPTIONS', 'TRACE'];
// wasi:io lets one write carry 4 KiB.
const WRITE_CHUNK = 4096;
const READ_CHUNK = 64n * 1024n;
const encoder = new TextEncoder();

/** `kebab-case` WIT case names as the other SDKs write them: `HTTP-request-denied` is
 * `HttpRequestDenied`. */
function caseName(tag) {
  return tag
    .split('-')
    .map((part) => part.charAt(0).toUpperCase() + part.slice(1).toLowerCase())
    .join('');
}

/** A wasi:http error code as every SDK writes it: the case's name in UpperCamelCase
 * (`ConnectionRefused`, `HttpResponseTimeout`), and an internal error's text. */
function codeText(code) {
  const name = caseName(code.tag);
  return code.tag === 'internal-error' && typeof code.val === 'string' ? `${name}: ${code.val}` : name;
}

function fromCode(url, code) {
  if (code && code.tag === 'HTTP-request-denied') {
    // The host adds why to the run's error: which list refused it, and how to allow it.
    return new HttpError(`${url}: the request was denied by the outbound policy`, { denied: true });
  }
  return new HttpError(`${url}: ${code ? codeText(code) : 'no response'}`);
}

/** What a failed stream operation says: its HTTP error code, else the host's text. */
function streamError(e) {
  const error = e.payload.val;
  const code = httpErrorCode(error);
  return code ? codeText(code) : error.toDebugString();
}

function invalid(message) {
  return new HttpError(message, { retryable: false });
}

/** The parts of an absolute http:// or https:// URL that wasi:http wants. */
function splitUrl(url) {
  const match = /^(https?):\/\/(.*)$/s.exec(url);
  if (!match) throw invalid(`${url}: only absolute http:// and https:// URLs are supported`);
  const rest = match[2];
  const cuts = [rest.indexOf('/'), rest.indexOf('?')].filter((i) => i >= 0);
  const cut = cuts.length ? Math.min(...cuts) : rest.length;
  const authority = rest.slice(0, cut);
  let path = rest.slice(cut);
  if (!authority) throw invalid(`${url}: no host`);
  if (!path) path = '/';
  else if (path.startsWith('?')) path = `/${path}`;
  return { scheme: match[1], authority, path };
}

const METHODS = ['GET', 'HEAD', 'POST', 'PUT', 'DELETE', 'CONNECT', 'OPTIONS', 'TRACE', 'PATCH'];

/** Sends a request through wasi:http/outgoing-handler and reads the whole answer. */
async function sendToHost(method, url, target, headers, data) {
  const fields = new Fields();
  for (const [name, value] of headers) {
    try {
      fields.append(name.toLowerCase(), encoder.encode(value));
    } catch (e) {
      throw invalid(`header \`${name}\`: ${e.payload ? caseName(e.payload.tag) : e}`);
    }
  }
  const request = new OutgoingRequest(fields);
  const outgoingBody = (() => {
    try {
      request.setMethod(
        METHODS.includes(method) ? { tag: method.toLowerCase() } : { tag: 'other', val: method },
      );
      request.setScheme({ tag: target.scheme === 'https' ? 'HTTPS' : 'HTTP' });
      request.setAuthority(target.authority);
      request.setPathWithQuery(target.path);
      return request.body();
    } catch {
      throw invalid(`${url}: invalid method, authority or path`);
    }
  })();
  let future;
  try {
    future = handle(request, undefined);
  } catch (e) {
    throw fromCode(url, e.payload);
  }
  // A server may answer before it has read the whole body (and then stop reading): like
  // other clients, prefer its answer to the write error. A body stream found closed
  // says only that the request ended (refused, or the connection failed; the host closes
  // the stream at once, often before the body is written): the request's own error
  // code says why, so neither it nor the short body's size error at `finish` is kept.
  let writeError;
  let closed = false;
  const stream = outgoingBody.write();
  for (let i = 0; i < data.length; i += WRITE_CHUNK) {
    try {
      stream.blockingWriteAndFlush(data.subarray(i, i + WRITE_CHUNK));
    } catch (e) {
      if (e.payload?.tag === 'closed') {
        closed = true;
      } else {
        writeError = new HttpError(`${url}: sending the body: ${streamError(e)}`);
      }
      break;
    }
  }
  stream[Symbol.dispose]();
  try {
    OutgoingBody.finish(outgoingBody, undefined);
  } catch (e) {
    if (!closed) writeError ??= fromCode(url, e.payload);
  }
  // The request is on its way: let the run's other requests (Promise.all) be sent too
  // before this one is waited for.
  await null;
  const ready = future.subscribe();
  ready.block();
  ready[Symbol.dispose]();
  const got = future.get();
  future[Symbol.dispose]();
  if (got === undefined || got.tag === 'err') throw writeError ?? fromCode(url, undefined);
  if (got.val.tag === 'err') throw writeError ?? fromCode(url, got.val.val);
  const incoming = got.val.val;
  const status = incoming.status();
  const received = incoming.headers();
  const pairs = received.entries().map(([k, v]) => [k, new TextDecoder().decode(v)]);
  received[Symbol.dispose]();
  const body = incoming.consume();
  const input = body.stream();
  const chunks = [];
  let failed;
  for (;;) {
    try {
      chunks.push(input.blockingRead(READ_CHUNK));
    } catch (e) {
      if (e.payload?.tag !== 'closed') {
        failed = new HttpError(`${url}: reading the response: ${streamError(e)}`);
      }
      break;
    }
  }
  input[Symbol.dispose]();
  IncomingBody.finish(body)[Symbol.dispose]();
  incoming[Symbol.dispose]();
  if (failed) throw failed;
  const bytes = new Uint8Array(chunks.reduce((n, c) => n + c.length, 0));
  let at = 0;
  for (const chunk of chunks) {
    bytes.set(chunk, at);
    at += chunk.length;
  }
  return { status, headers: pairs, body: bytes };
}

/** Outbound HTTP through the sandbox (wasi:http), the body read whole. A request that
 * may change something (any method but GET, HEAD, OPTIONS and TRACE) carries an
 * `Idempotency-Key` unless given one: the run's `ctx.idempotencyKey` for the first such
 * request of the run, then `{key}:2`, `{key}:3`, … (a retried run making the same
 * requests sends the same keys; two requests of one run never share one). A request
 * that gets no response throws an HttpError. */
export const http = {
  async request(method, url, { headers = {}, json, body } = {}) {
    method = String(method).toUpperCase();
    const pairs = (Array.isArray(headers) ? headers : Object.entries(headers)).map(([k, v]) => [
      String(k),
      String(v),
    ]);
    const named = (name) => pairs.some(([h]) => h.toLowerCase() === name);
    let data = new Uint8Array(0);
    if (json !== undefined) {
      data = encoder.encode(JSON.stringify(json));
      if (!named('content-type')) pairs.push(['content-type', 'application/json']);
    } else if (body !== undefined) {
      data = typeof body === 'string' ? encoder.encode(body) : new Uint8Array(body);
    }
    if (!named('content-length') && !(data.length === 0 && NO_BODY.includes(method))) {
      pairs.push(['content-length', String(data.length)]);
    }
    if (runKey && !SAFE.includes(method) && !named('idempotency-key')) {
      runKey.n += 1;
      pairs.push(['idempotency-key', runKey.n === 1 ? runKey.key : `${runKey.key}:${runKey.n}`]);
    }
    const target = splitUrl(url);
    // Natively (a test with testing.mjs) the kit answers.
    const kit = globalThis.__kairosKit;
    const answer = kit
      ? await kit.send({ method, url, headers: pairs, body: data })
      : await sendToHost(method, url, target, pairs, data);
    const text = new TextDecoder().decode(answer.body);
    return {
      status: answer.status,
      ok: answer.status >= 200 && answer.status < 300,
      headers: new Headers(answer.headers),
      body: answer.body,
      text,
      json: () => JSON.parse(text),
    };
  },
  get(url, options) {
    return http.request('GET', url, options);
  },
  post(url, options) {
    return http.request('POST', url, options);
  },
};

/** Milliseconds since the Unix epoch (the host's wall clock). */
export function nowMs() {
  return Date.now();
}

/** The component's `inputSchema` export from a JSON Schema (an object): kairos asks for
 * it at upload and refuses a booking whose `input` does not fit it (400 `invalid_input`,
 * naming the JSON path), so such input never reaches `run`. In the plugin's module:
 * `export const inputSchema = jsonSchema({type: 'object', required: ['url'], ...})`.
 * A module that exports none takes any input (build.mjs adds the empty export). */
export function jsonSchema(schema) {
  const text = JSON.stringify(schema);
  return function inputSchema() {
    return text;
  };
}

/** The component's `run` export from a plugin's `async (ctx, input) => output`: the
 * input parsed from JSON, the output written as JSON, any other throw a fatal error.
 * `ctx` is `{lifeId, plan ('birth'|'death'), scheduledAtMs, attempt, resourceId,
 * pluginName, pluginVersion, idempotencyKey}`; `idempotencyKey` is the one a webhook
 * of the same Plan would send (`{lifeId}:{plan}`), which `http` sends by default. */
export function exportAction(run) {
  return async function (ctx, input) {
    const context = Object.freeze({
      lifeId: ctx.lifeId,
      plan: ctx.plan,
      scheduledAtMs: Number(ctx.scheduledAtMs),
      attempt: ctx.attempt,
      resourceId: ctx.resourceId ?? null,
      pluginName: ctx.pluginName,
      pluginVersion: ctx.pluginVersion,
      idempotencyKey: `${ctx.lifeId}:${ctx.plan}`,
    });
    let parsed;
    try {
      parsed = JSON.parse(input);
    } catch (e) {
      throw PluginError.fatal(`the input is not JSON: ${e.message}`);
    }
    let output;
    runKey = { key: context.idempotencyKey, n: 0 };
    try {
      output = await run(context, parsed);
    } catch (e) {
      if (e instanceof PluginError) throw e;
      throw PluginError.fatal(`${e && e.name ? e.name : 'Error'}: ${e && e.message ? e.message : e}`);
    } finally {
      runKey = null;
    }
    return JSON.stringify(output === undefined ? null : output);
  };
}
