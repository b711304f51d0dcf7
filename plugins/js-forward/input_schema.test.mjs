// The test kit checks an input against the module's declared input schema as kairos
// does at booking, in the host's words: every case of
// guest-sdk/testdata/input-violations.json (which the host's own unit test reads too)
// gives the host's path and message, and an input that does not fit never reaches run.

import assert from 'node:assert/strict';
import { readFile, writeFile, mkdtemp } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';

import { Failed, InvalidInput, Kit, context, load, response } from '../../guest-sdk/js/testing.mjs';

const table = JSON.parse(
  await readFile(new URL('../../guest-sdk/testdata/input-violations.json', import.meta.url), 'utf8'),
);

/** A plugin module that declares `schema` and answers what it was given. */
async function plugin(dir, n, schema) {
  const file = join(dir, `plugin${n}.mjs`);
  await writeFile(
    file,
    `import { exportAction, jsonSchema } from 'kairos-guest';
export const inputSchema = jsonSchema(${JSON.stringify(schema)});
export const ran = [];
export const run = exportAction(async (ctx, input) => { ran.push(input); return 'ran'; });
`,
  );
  return load(file);
}

test('every case is refused or taken as the host does', async () => {
  const dir = await mkdtemp(join(tmpdir(), 'kairos-kit-'));
  let n = 0;
  for (const c of table.cases) {
    const app = await plugin(dir, n++, c.schema);
    const kit = new Kit();
    const what = `${JSON.stringify(c.schema)} with ${JSON.stringify(c.input)}`;
    if (c.message === null) {
      assert.equal(await kit.call(app.run, c.input), 'ran', what);
      assert.deepEqual(app.ran, [c.input], what);
      continue;
    }
    const at = c.path ? ` at ${c.path}` : '';
    await assert.rejects(kit.call(app.run, c.input), (e) => {
      assert.ok(e instanceof InvalidInput && e instanceof Failed, what);
      assert.equal(
        e.message,
        `birth.input${at} does not fit the input schema of plugin \`test-plugin\`: ${c.message}`,
        what,
      );
      assert.equal(e.path, c.path, what);
      assert.equal(e.retryable, false, what);
      return true;
    });
    assert.deepEqual(app.ran, [], `${what}: an input that does not fit reached run`);
  }
});

test('js-forward refuses a url that is not a string before it runs', async () => {
  const app = await load(new URL('./app.js', import.meta.url));
  const kit = new Kit().onHttp(() => response(200));
  await assert.rejects(
    kit.call(app.run, { url: 5 }, context({ pluginName: 'js-forward' })),
    (e) =>
      e instanceof InvalidInput &&
      e.message ===
        'birth.input at /url does not fit the input schema of plugin `js-forward`: 5 is not of type "string"',
  );
  assert.equal(kit.requests.length, 0);
});
