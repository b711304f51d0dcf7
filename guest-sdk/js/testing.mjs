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
//
// `kit.call` checks the input against the input schema the module declares
// (`export const inputSchema = jsonSchema({...})`) as kairos checks a booking: one that
// does not fit throws an `InvalidInput` with the host's 400 message, and `run` is not
// called. The check uses ajv (npm: ajv, ajv-formats; found from this file's directory
// up, or through NODE_PATH) as kairos checks: draft 2020-12 unless the schema's
// `$schema` names 2019-09, 07 or 06; formats checked for 07 and 06 only.

import { createRequire, register } from 'node:module';

let registered = false;
const SDK = new URL('./kairos.js', import.meta.url).href;
/** The input schema (JSON text) each loaded module's `run` declares. */
const schemas = new WeakMap();

/** Imports a plugin module (a path or URL) as componentize-js would see it. */
export async function load(app) {
  if (!registered) {
    register('./native/hooks.mjs', import.meta.url);
    registered = true;
  }
  const url = app instanceof URL ? app.href : new URL(app, `file://${process.cwd()}/`).href;
  const module = await import(url);
  if (typeof module.run === 'function' && typeof module.inputSchema === 'function') {
    const text = module.inputSchema();
    if (text !== undefined) schemas.set(module.run, text);
  }
  return module;
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

/** The input does not fit the plugin's input schema: kairos would refuse the booking
 * (400 `invalid_input`) and nothing would run. `message` is the 400's message
 * (`birth.input at /url does not fit the input schema of plugin \`test-plugin\`: 5 is
 * not of type "string"`), `path` the JSON pointer to the place ('' for the input
 * itself); not retryable. */
export class InvalidInput extends Failed {
  constructor(message, path) {
    super(message, false);
    this.name = 'InvalidInput';
    this.code = 'invalid_input';
    this.path = path;
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

  /** Calls a plugin's `run` export as the host does: `input` checked against the
   * module's input schema (an `InvalidInput` when it does not fit, and no run), written
   * as JSON, the output parsed back; a PluginError (or any throw) becomes a `Failed`. */
  async call(run, input, ctx = context()) {
    const schema = schemas.get(run);
    if (schema !== undefined) {
      checkInput(JSON.parse(schema), JSON.parse(JSON.stringify(input ?? null)), ctx);
    }
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

/** The ajv validator class for a schema's draft, as kairos picks its draft. */
function validatorFor(schema) {
  const require = createRequire(import.meta.url);
  const load = (name) => {
    try {
      const module = require(name);
      return module.default ?? module;
    } catch (e) {
      if (e && e.code === 'MODULE_NOT_FOUND') {
        throw new Error(
          "the test kit checks the input against the plugin's input schema, as kairos does at booking, with ajv: npm install --save-dev ajv@8 ajv-formats@3 (or NODE_PATH naming a node_modules that has them)",
        );
      }
      throw e;
    }
  };
  const draft = typeof schema === 'object' && schema !== null ? String(schema.$schema ?? '') : '';
  const options = { strict: false, allErrors: true, verbose: true };
  if (draft.includes('draft-07') || draft.includes('draft-06')) {
    const Ajv = load('ajv');
    const ajv = new Ajv(options);
    if (draft.includes('draft-06')) ajv.addMetaSchema(require('ajv/dist/refs/json-schema-draft-06.json'));
    load('ajv-formats')(ajv);
    return ajv;
  }
  if (draft.includes('draft-04') || draft.includes('draft-03')) {
    throw new Error(`the test kit checks draft 2020-12, 2019-09, 07 and 06 schemas, not ${draft}`);
  }
  const Ajv = load(draft.includes('2019-09') ? 'ajv/dist/2019' : 'ajv/dist/2020');
  return new Ajv({ ...options, validateFormats: false });
}

/** Throws an InvalidInput when `value` does not fit `schema`, in the words of the host's
 * 400 (plugins/registry.rs: `{what} at {path} does not fit the input schema of plugin
 * \`{plugin}\`: {violation}`, the first violation as the Rust jsonschema crate kairos
 * uses words it). */
function checkInput(schema, value, ctx) {
  const validate = validatorFor(schema).compile(schema);
  if (validate(value)) return;
  // The host names a combinator's failure (anyOf, oneOf, not, contains), not those of
  // the subschemas it tried; and gives a failed `then`/`else` as its own errors.
  const all = validate.errors.filter((e) => e.keyword !== 'if');
  const top = all.filter(
    (e) => !all.some((o) => o !== e && e.schemaPath.startsWith(`${o.schemaPath}/`) && o.keyword !== 'if'),
  );
  // The one the host names first (sort keeps the order of equal keys).
  const error = top
    .map((e, i) => ({ e, key: hostOrder(e), i }))
    .sort((a, b) => compareKeys(a.key, b.key) || a.i - b.i)[0].e;
  const at = error.instancePath ? ` at ${error.instancePath}` : '';
  throw new InvalidInput(
    `${ctx.plan}.input${at} does not fit the input schema of plugin \`${ctx.pluginName}\`: ${violation(error)}`,
    error.instancePath,
  );
}

// Keywords followed in a schema path by a name, or by an index.
const NAMED = ['properties', 'patternProperties', '$defs', 'definitions', 'dependentSchemas'];
const INDEXED = ['prefixItems', 'allOf', 'anyOf', 'oneOf'];

/** Where a violation comes in the order the host checks: at each level of the schema its
 * keywords by name (`additionalProperties` together with `properties`, after it),
 * properties by name, subschemas by index; then the instance's place. */
function hostOrder(e) {
  const unescape = (p) => decodeURIComponent(p).replace(/~1/g, '/').replace(/~0/g, '~');
  const parts = e.schemaPath.replace(/^#\/?/, '').split('/').filter(Boolean).map(unescape);
  const key = [];
  let arg = null;
  for (const part of parts) {
    if (arg === 'name') key.push([1, part, 0]);
    else if (arg === 'index') key.push([2, '', Number(part)]);
    else key.push([0, part === 'additionalProperties' ? 'properties\u0001' : part, 0]);
    arg = arg ? null : NAMED.includes(part) ? 'name' : INDEXED.includes(part) ? 'index' : null;
  }
  const place = e.instancePath
    .split('/')
    .slice(1)
    .map(unescape)
    .map((p) => (/^\d+$/.test(p) ? [0, '', Number(p)] : [1, p, 0]));
  return [key, place];
}

/** Lists of [rank, name, index] compared in order, a list before those it begins. */
function compareLists(x, y) {
  for (let i = 0; i < Math.min(x.length, y.length); i++) {
    for (let j = 0; j < 3; j++) {
      if (x[i][j] < y[i][j]) return -1;
      if (x[i][j] > y[i][j]) return 1;
    }
  }
  return x.length - y.length;
}

function compareKeys(a, b) {
  return compareLists(a[0], b[0]) || compareLists(a[1], b[1]);
}

/** A JSON value as the host shows it (serde_json: compact, keys sorted). */
function shown(value) {
  const sorted = (v) =>
    Array.isArray(v)
      ? v.map(sorted)
      : v && typeof v === 'object'
        ? Object.fromEntries(Object.keys(v).sort().map((k) => [k, sorted(v[k])]))
        : v;
  return JSON.stringify(sorted(value));
}

function plural(n, one, many) {
  return `${n} ${n === 1 ? one : many}`;
}

/** `a, b or c`, or `a, b or N other candidates` past three. */
function either(options) {
  const all = options.map(shown);
  if (all.length > 3) return `${all.slice(0, 2).join(', ')} or ${all.length - 2} other candidates`;
  return all.length === 1 ? all[0] : `${all.slice(0, -1).join(', ')} or ${all[all.length - 1]}`;
}

/** What is wrong, worded as the Rust jsonschema crate words it. */
function violation(e) {
  const data = shown(e.data);
  const p = e.params;
  switch (e.keyword) {
    case 'type': {
      const types = String(p.type).split(',');
      return types.length > 1
        ? `${data} is not of types ${types
            .sort()
            .map((t) => `"${t}"`)
            .join(', ')}`
        : `${data} is not of type "${types[0]}"`;
    }
    case 'required':
    case 'dependentRequired':
      return `${JSON.stringify(p.missingProperty)} is a required property`;
    case 'additionalProperties': {
      const parent = e.parentSchema ?? {};
      const patterns = Object.keys(parent.patternProperties ?? {}).map((re) => new RegExp(re, 'u'));
      const extra = Object.keys(e.data)
        .filter((k) => !(k in (parent.properties ?? {})) && !patterns.some((re) => re.test(k)))
        .sort();
      const verb = extra.length === 1 ? 'was' : 'were';
      return `Additional properties are not allowed (${extra.map((k) => `'${k}'`).join(', ')} ${verb} unexpected)`;
    }
    case 'unevaluatedProperties':
      return `Unevaluated properties are not allowed ('${p.unevaluatedProperty}' was unexpected)`;
    case 'enum':
      return `${data} is not one of ${either(p.allowedValues)}`;
    case 'const':
      return `${shown(p.allowedValue)} was expected`;
    case 'minimum':
      return `${data} is less than the minimum of ${shown(p.limit)}`;
    case 'maximum':
      return `${data} is greater than the maximum of ${shown(p.limit)}`;
    case 'exclusiveMinimum':
      return `${data} is less than or equal to the minimum of ${shown(p.limit)}`;
    case 'exclusiveMaximum':
      return `${data} is greater than or equal to the maximum of ${shown(p.limit)}`;
    case 'multipleOf':
      return `${data} is not a multiple of ${shown(p.multipleOf)}`;
    case 'minLength':
      return `${data} is shorter than ${plural(p.limit, 'character', 'characters')}`;
    case 'maxLength':
      return `${data} is longer than ${plural(p.limit, 'character', 'characters')}`;
    case 'minItems':
      return `${data} has less than ${plural(p.limit, 'item', 'items')}`;
    case 'maxItems':
      return `${data} has more than ${plural(p.limit, 'item', 'items')}`;
    case 'minProperties':
      return `${data} has less than ${plural(p.limit, 'property', 'properties')}`;
    case 'maxProperties':
      return `${data} has more than ${plural(p.limit, 'property', 'properties')}`;
    case 'pattern':
      return `${data} does not match "${p.pattern}"`;
    case 'format':
      return `${data} is not a "${p.format}"`;
    case 'uniqueItems':
      return `${data} has non-unique elements`;
    case 'anyOf':
      return `${data} is not valid under any of the schemas listed in the 'anyOf' keyword`;
    case 'oneOf':
      return p.passingSchemas
        ? `${data} is valid under more than one of the schemas listed in the 'oneOf' keyword`
        : `${data} is not valid under any of the schemas listed in the 'oneOf' keyword`;
    case 'not':
      return `${shown(e.schema)} is not allowed for ${data}`;
    case 'contains':
      return `None of ${data} are valid under the given schema`;
    case 'false schema':
      return `False schema does not allow ${data}`;
    default:
      return e.message;
  }
}
