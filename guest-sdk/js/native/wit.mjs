// Stand-ins for the kairos:plugin imports when a plugin runs in plain Node (a test, with
// testing.mjs): they answer through the test kit now in use.

function kit() {
  const current = globalThis.__kairosKit;
  if (!current) {
    throw new Error('kairos-guest runs natively only inside a test kit: new Kit() first');
  }
  return current;
}

export function log(level, message) {
  kit().logs.push(`${level}: ${message}`);
}

export function book(request) {
  return kit().book(JSON.parse(request));
}

export function cancel(lifeId) {
  kit().cancel(lifeId);
}
