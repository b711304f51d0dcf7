// A test kit for kairos JavaScript plugins: run a plugin's `run` in plain Node, with
// its HTTP requests answered by the test and its logs and bookings recorded.
//
//     import { test } from 'node:test';
//     import assert from 'node:assert/strict';
//     import { Kit, response, load } from '../../guest-sdk/js/testing.mjs';
//
//     const app = await load(new URL('./app.js', import.meta.url));
//     test('forwards', async () => {
//       const kit = new Kit().onHttp((request) => response(202));
//       assert.deepEqual(await kit.call(app.run, { url: 'https://x.example/' }), { status: 202 });
//       assert.equal(kit.requests[0].method, 'POST');
//     });
//
// `load` imports the plugin's module with the WIT imports (`kairos:plugin/...`) and
// `kairos-guest` resolved to stand-ins and to this SDK; `node --test` runs such files.

import { register } from 'node:module';

let registered = false;
const SDK = new URL('./kairos.js', import.meta.url).href;

/** Imports a plugin module (a path or URL) as componentize-js would see it. */
export async function load(app) {
  if (!registered) {
    register('./native/hooks.mjs', import.meta.url);
    registered = true;
  }
  const url = app instanceof URL ? app.href : new URL(app, `file://${process.cwd()}/`).href;
  return import(url);
}

/** A response for `Kit.onHttp`: a status, and a body (text, or an object sent as JSON). */
export function response(status, body = '', headers = {}) {
  const text = typeof body === 'string' ? body : JSON.stringify(body);
  return new Response(status === 204 || status === 304 ? null : text, { status, headers });
}

/** Why `Kit.call` failed: the plugin's error as the host would record it. */
export class Failed extends Error {
  constructor(message, retryable) {
    super(message);
    this.name = 'Failed';
    this.retryable = retryable;
  }
}

/** The firing's context for `Kit.call`, a first-attempt birth unless `over` says else. */
export function context(over = {}) {
  return {
    lifeId: 'test-life',
    plan: 'birth',
    scheduledAtMs: 1800000000000n,
    attempt: 1,
    resourceId: undefined,
    pluginName: 'test-plugin',
    pluginVersion: 1,
    ...over,
  };
}

/** The host of a test: answers requests with the handler given to `onHttp`, and
 * records what the plugin sent (`requests`), logged (`logs`), booked (`bookings`) and
 * cancelled (`cancelled`). The newest kit is the one in use. */
export class Kit {
  constructor() {
    this.requests = [];
    this.logs = [];
    this.bookings = [];
    this.cancelled = [];
    this.handler = () => {
      throw new TypeError('no HTTP handler: kit.onHttp(...)');
    };
    globalThis.__kairosKit = this;
    globalThis.fetch = (url, init = {}) => this.fetch(String(url), init);
  }

  /** `handler(request)` answers each request (a `response(...)`), or throws: a request
   * that got no answer (an `HttpError` from 'kairos-guest' is thrown as it is, so a
   * test can give one with `denied: true`). */
  onHttp(handler) {
    this.handler = handler;
    return this;
  }

  /** A request of the SDK's `http`, answered by the handler: `{status, headers, body}`,
   * or an HttpError, as the host's answer would be. */
  async send({ method, url, headers, body }) {
    const lower = Object.fromEntries(headers.map(([k, v]) => [k.toLowerCase(), v]));
    const text = new TextDecoder().decode(body);
    this.requests.push({
      method,
      url,
      headers: lower,
      body: text,
      header: (name) => lower[name.toLowerCase()],
      json: () => JSON.parse(text),
    });
    let answer;
    try {
      answer = await this.handler(this.requests[this.requests.length - 1]);
    } catch (e) {
      const { HttpError } = await import(SDK);
      if (e instanceof HttpError) throw e;
      throw new HttpError(`${url}: ${e && e.message ? e.message : e}`);
    }
    return {
      status: answer.status,
      headers: [...answer.headers],
      body: new Uint8Array(await answer.arrayBuffer()),
    };
  }

  /** `fetch` for a plugin that calls it itself rather than through the SDK's `http`. */
  async fetch(url, init) {
    const headers = Object.fromEntries(
      Object.entries(init.headers ?? {}).map(([k, v]) => [k.toLowerCase(), String(v)]),
    );
    const body = init.body === undefined ? '' : String(init.body);
    const request = {
      method: (init.method ?? 'GET').toUpperCase(),
      url,
      headers,
      body,
      header: (name) => headers[name.toLowerCase()],
      json: () => JSON.parse(body),
    };
    this.requests.push(request);
    return this.handler(request);
  }

  book(request) {
    this.bookings.push(request);
    return `booked-${this.bookings.length}`;
  }

  cancel(lifeId) {
    this.cancelled.push(lifeId);
  }

  /** Calls a plugin's `run` export as the host does: `input` written as JSON, the
   * output parsed back; a PluginError (or any throw) becomes a `Failed`. */
  async call(run, input, ctx = context()) {
    let text;
    try {
      text = await run(ctx, JSON.stringify(input ?? null));
    } catch (e) {
      const p = e && e.payload ? e.payload : { message: String(e), retryable: false };
      throw new Failed(p.message, p.retryable);
    }
    return JSON.parse(text);
  }
}

/** The input schema a plugin module declares (`export const inputSchema = ...`), as
 * JSON; undefined when it declares none. */
export function inputSchema(app) {
  const text = app.inputSchema ? app.inputSchema() : undefined;
  return text === undefined ? undefined : JSON.parse(text);
}
