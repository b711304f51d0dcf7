// Stand-ins for the wasi:http imports when a plugin runs in plain Node (a test, with
// testing.mjs): the SDK's `http` hands its requests to the test kit instead, so these
// are never called; a plugin that imports wasi:http itself is told so.

function natively() {
  throw new Error('wasi:http is not there natively: in a test, requests go through the SDK\'s `http` to the kit (kit.onHttp)');
}

export const handle = natively;
export const httpErrorCode = natively;
export class Fields {
  constructor() {
    natively();
  }
}
export class OutgoingRequest extends Fields {}
export class OutgoingBody extends Fields {}
export class IncomingBody extends Fields {}
