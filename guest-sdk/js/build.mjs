// Builds a JavaScript plugin into a component:
//
//     node guest-sdk/js/build.mjs APP.js OUT.wasm [WIT_DIR]
//
// APP.js imports the SDK as 'kairos-guest'; rolldown bundles it (and any relative
// imports) into one module, leaving the WIT imports (`kairos:plugin/...`) to the
// component, and componentize-js makes the component for the kairos:plugin/action world
// without StarlingMonkey's incoming-HTTP export (a plugin answers no requests).
// Needs @bytecodealliance/componentize-js and rolldown installed where Node finds them
// (NODE_PATH, or a node_modules above this file or the working directory).

import { readFile, writeFile } from 'node:fs/promises';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const [app, out, wit] = process.argv.slice(2);
if (!app || !out) {
  console.error('usage: node build.mjs APP.js OUT.wasm [WIT_DIR]');
  process.exit(2);
}
const here = dirname(fileURLToPath(import.meta.url));
const witPath = resolve(wit ?? join(here, '..', '..', 'wit'));
// The build tools, from NODE_PATH, the working directory's node_modules or one above
// this file: their ES module entry points (both are ESM-only packages).
const roots = [...(process.env.NODE_PATH ?? '').split(':').filter(Boolean), join(process.cwd(), 'node_modules'), join(here, 'node_modules')];
async function load(name) {
  for (const root of roots) {
    const dir = join(root, name);
    let manifest;
    try {
      manifest = JSON.parse(await readFile(join(dir, 'package.json'), 'utf8'));
    } catch {
      continue;
    }
    let entry = manifest.exports?.['.'] ?? manifest.exports ?? manifest.module ?? manifest.main;
    while (entry && typeof entry === 'object') entry = entry.import ?? entry.default ?? entry.node;
    return import(pathToFileURL(join(dir, entry ?? 'index.js')).href);
  }
  console.error(`${name} is not installed: npm install (in a project from 'kairos plugins new --lang js'), or npm install @bytecodealliance/componentize-js@0.23.0 rolldown@1.3.2 and NODE_PATH=that node_modules`);
  process.exit(1);
}
const { rolldown } = await load('rolldown');
const { componentize } = await load('@bytecodealliance/componentize-js');

const bundle = await rolldown({
  input: resolve(app),
  external: [/^kairos:/, /^wasi:/],
  resolve: { alias: { 'kairos-guest': join(here, 'kairos.js') } },
  logLevel: 'warn',
});
const { output } = await bundle.generate({ format: 'esm' });
await bundle.close();
let code = output[0].code;
// The world (kairos:plugin 0.2.0) exports `input-schema` too; a plugin that declares no
// schema (`export const inputSchema = jsonSchema({...})`) takes any input.
if (!output[0].exports.includes('inputSchema')) {
  code += '\nexport function inputSchema() { return undefined; }\n';
}
const { component } = await componentize(code, {
  witPath,
  worldName: 'kairos:plugin/action@0.2.0',
  disableFeatures: ['fetch-event'],
});
await writeFile(out, component);
console.error(`${out}: ${component.length} bytes`);
