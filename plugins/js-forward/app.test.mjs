// js-forward's run(), natively, with the SDK's test kit: node --test (from anywhere).

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { Failed, Kit, inputSchema, load, response } from '../../guest-sdk/js/testing.mjs';

const app = await load(new URL('./app.js', import.meta.url));
const INPUT = { url: 'https://hooks.example.com/x', headers: { 'x-team': 'ops' }, body: { n: 1 } };

test('forwards the body and reports the status', async () => {
  const kit = new Kit().onHttp(() => response(202));
  assert.deepEqual(await kit.call(app.run, INPUT), { status: 202 });
  const sent = kit.requests[0];
  assert.equal(sent.method, 'POST');
  assert.equal(sent.url, 'https://hooks.example.com/x');
  assert.deepEqual(sent.json(), { n: 1 });
  assert.equal(sent.header('x-team'), 'ops');
  assert.equal(sent.header('x-kairos-life'), 'test-life');
  assert.equal(sent.header('idempotency-key'), 'test-life:birth');
  assert.deepEqual(kit.logs, ['info: POST https://hooks.example.com/x -> 202']);
});

test('a 5xx or no answer is retried and a 4xx is not', async () => {
  let kit = new Kit().onHttp(() => response(503));
  await assert.rejects(kit.call(app.run, INPUT), (e) => e instanceof Failed && e.retryable);
  kit = new Kit().onHttp(() => response(404));
  await assert.rejects(
    kit.call(app.run, INPUT),
    (e) => e instanceof Failed && !e.retryable && e.message.includes('404'),
  );
  kit = new Kit().onHttp(() => {
    throw new TypeError('connection refused');
  });
  await assert.rejects(kit.call(app.run, INPUT), (e) => e instanceof Failed && e.retryable);
});

test('a URL that is not http fails for good and sends nothing', async () => {
  const kit = new Kit().onHttp(() => response(200));
  await assert.rejects(
    kit.call(app.run, { url: 'ftp://files.example/x' }),
    (e) =>
      e instanceof Failed &&
      !e.retryable &&
      e.message === 'ftp://files.example/x: only absolute http:// and https:// URLs are supported',
  );
  assert.equal(kit.requests.length, 0);
});

test('a request the handler refuses (an HttpError with denied) fails for good', async () => {
  const { HttpError } = await import('kairos-guest');
  const kit = new Kit().onHttp((r) => {
    throw new HttpError(`${r.url}: the request was denied by the outbound policy`, { denied: true });
  });
  await assert.rejects(
    kit.call(app.run, INPUT),
    (e) => e instanceof Failed && !e.retryable && e.message.endsWith('denied by the outbound policy'),
  );
});

test('the input schema requires a url string', () => {
  const schema = inputSchema(app);
  assert.deepEqual(schema.required, ['url']);
  assert.equal(schema.properties.url.type, 'string');
});
