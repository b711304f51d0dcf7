// Module resolution for testing.mjs: the component's WIT imports become stand-ins
// (wit.mjs, wasi.mjs), and `kairos-guest` this SDK.

const WIT = new URL('./wit.mjs', import.meta.url).href;
const WASI = new URL('./wasi.mjs', import.meta.url).href;
const SDK = new URL('../kairos.js', import.meta.url).href;

export async function resolve(specifier, context, next) {
  if (specifier.startsWith('kairos:plugin/')) {
    return { url: WIT, shortCircuit: true };
  }
  if (specifier.startsWith('wasi:')) {
    return { url: WASI, shortCircuit: true };
  }
  if (specifier === 'kairos-guest') {
    return { url: SDK, shortCircuit: true };
  }
  return next(specifier, context);
}
