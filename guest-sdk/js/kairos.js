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
// host gives it: `http` (fetch, through the host's outbound policy and the plugin's
// allowed_hosts), `log`, the clock (`nowMs`) and `schedule`. No filesystem, environment
// or socket.

import { log as witLog } from 'kairos:plugin/log@0.1.0';
import { book as witBook, cancel as witCancel } from 'kairos:plugin/schedule@0.1.0';

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
const SAFE = ['GET', 'HEAD', 'OPTIONS', 'TRACE'];

/** Outbound HTTP through the sandbox: `fetch`, with the body read whole. A request that
 * may change something (any method but GET, HEAD, OPTIONS and TRACE) carries an
 * `Idempotency-Key` unless given one: the run's `ctx.idempotencyKey` for the first such
 * request of the run, then `{key}:2`, `{key}:3`, … (a retried run making the same
 * requests sends the same keys; two requests of one run never share one). A request
 * that gets no answer throws a retryable PluginError. */
export const http = {
  async request(method, url, { headers = {}, json, body } = {}) {
    const init = { method, headers: { ...headers } };
    const named = (name) => Object.keys(init.headers).some((h) => h.toLowerCase() === name);
    if (runKey && !SAFE.includes(method.toUpperCase()) && !named('idempotency-key')) {
      runKey.n += 1;
      init.headers['idempotency-key'] = runKey.n === 1 ? runKey.key : `${runKey.key}:${runKey.n}`;
    }
    if (json !== undefined) {
      init.body = JSON.stringify(json);
      if (!named('content-type')) {
        init.headers['content-type'] = 'application/json';
      }
    } else if (body !== undefined) {
      init.body = body;
    }
    let response;
    try {
      response = await fetch(url, init);
    } catch (e) {
      throw PluginError.retryable(`${method} ${url} failed: ${e && e.message ? e.message : e}`);
    }
    const text = await response.text();
    return {
      status: response.status,
      ok: response.ok,
      headers: response.headers,
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
