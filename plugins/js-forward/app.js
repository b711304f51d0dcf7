// `js-forward`: sends a JSON body to a URL and returns the status (the JavaScript twin
// of plugins/http-forward).
//
// Input: {"url": "https://...", "method"?: "POST", "headers"?: {"name": "value"},
// "body": any}. Output: {"status": 200}. A 408, 429 or 5xx answer, or no answer, is a
// retryable error (the action's retry_count decides how often); another non-2xx answer
// fails the Plan. The input's JSON Schema is declared, so kairos refuses a booking
// whose input does not fit (400 invalid_input) before it could reach run.

import { PluginError, exportAction, http, jsonSchema, log } from 'kairos-guest';

export const inputSchema = jsonSchema({
  type: 'object',
  required: ['url'],
  properties: {
    url: { type: 'string', description: 'Where to send the request.' },
    method: { type: 'string', description: 'The HTTP method; POST when not given.' },
    headers: { type: 'object', additionalProperties: { type: 'string' } },
    body: { description: 'The JSON body.' },
  },
});

export const run = exportAction(async (ctx, input) => {
  if (typeof input?.url !== 'string') {
    throw PluginError.fatal('input.url: a string is required');
  }
  const method = input.method ?? 'POST';
  // The SDK adds the Plan's Idempotency-Key (ctx.idempotencyKey) itself.
  const headers = { 'x-kairos-life': ctx.lifeId, ...(input.headers ?? {}) };
  const response = await http.request(method, input.url, { headers, json: input.body ?? null });
  log.info(`${method} ${input.url} -> ${response.status}`);
  if (response.ok) return { status: response.status };
  const why = `${input.url} answered ${response.status}`;
  if (response.status === 408 || response.status === 429 || response.status >= 500) {
    throw PluginError.retryable(why);
  }
  throw PluginError.fatal(why);
});
