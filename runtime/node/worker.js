// Sluice function worker for Node.js: runs one exported function of a user's module for one subtask of a
// pipeline. Started by the engine as `node worker.js` with the protocol on file descriptor 3 (one end of a Unix
// stream socket pair, both directions); stdout and stderr go to the engine's log, so console.log is safe.
//
// Protocol (docs/functions.md, version 2): each frame is a 4-byte big-endian unsigned length followed by that
// many bytes of UTF-8 JSON. An exact decimal travels as the object {"$decimal":"<digits>"} both ways; the function
// sees it as a Decimal (below) and may return Decimals (or such objects).
//   engine -> worker  {"type":"hello","protocol":2,"module":PATH,"export":NAME}
//   worker -> engine  {"type":"ready","protocol":2,"runtime":"node","version":process.version}
//                     or {"type":"fatal","message":...,"stack":...} (then exits)
//   engine -> worker  {"type":"batch","id":N,"records":[ENVELOPE, ...]}
//   worker -> engine  {"type":"result","id":N,"results":[{"ok":VALUE} | {"error":{"message":..,"stack":..}}, ...]}
// Batches are answered in the order they arrive, one result per record in record order. The worker processes one
// batch at a time; a function returning a Promise is awaited before the next record.
'use strict';

const net = require('net');
const path = require('path');
const { pathToFileURL } = require('url');

const PROTOCOL = 2;
const MAX_FRAME = 256 * 1024 * 1024;

const channel = new net.Socket({ fd: 3, readable: true, writable: true });
const input = channel;
const output = channel;

// An exact decimal (Sluice's decimal kind: up to 38 significant digits), which a JavaScript number cannot hold.
// `text` is its exact text ("12345678901234567890.123456789"); String(d) gives it; arithmetic (d * 2, d > 1) uses
// valueOf(), the nearest number, so compute exactly with the text (or a decimal library) and return a new
// Decimal(text) or the text itself. JSON.stringify(d) gives {"$decimal": text}, which is how it travels.
class Decimal {
  constructor(text) {
    this.text = String(text);
  }
  toString() {
    return this.text;
  }
  valueOf() {
    return Number(this.text);
  }
  toJSON() {
    return { $decimal: this.text };
  }
}
globalThis.SluiceDecimal = Decimal;

// Replaces every {"$decimal": "..."} of a record (as parsed) by a Decimal, in place.
function reviveDecimals(v) {
  if (v === null || typeof v !== 'object') return v;
  if (Array.isArray(v)) {
    for (let i = 0; i < v.length; i++) v[i] = reviveDecimals(v[i]);
    return v;
  }
  const keys = Object.keys(v);
  if (keys.length === 1 && keys[0] === '$decimal' && typeof v.$decimal === 'string') return new Decimal(v.$decimal);
  for (const k of keys) v[k] = reviveDecimals(v[k]);
  return v;
}

// One frame in one write: the header and the UTF-8 text encoded into the same buffer (no concatenation copy).
function sendText(text) {
  const n = Buffer.byteLength(text, 'utf8');
  const frame = Buffer.allocUnsafe(4 + n);
  frame.writeUInt32BE(n, 0);
  frame.write(text, 4, n, 'utf8');
  output.write(frame);
}

function send(obj) {
  sendText(JSON.stringify(obj));
}

// The stack down to the user's frames: the worker's own frames (and Node's below them) say nothing to the user.
function userStack(stack) {
  const lines = String(stack).split('\n');
  const cut = lines.findIndex((l) => l.includes(__filename));
  return (cut < 0 ? lines : lines.slice(0, cut)).join('\n');
}

function describe(e) {
  if (e instanceof Error) return { message: String(e.message), stack: userStack(e.stack || e.message) };
  let text;
  try {
    text = typeof e === 'string' ? e : JSON.stringify(e);
  } catch (_) {
    text = String(e);
  }
  return { message: 'threw a non-Error value: ' + text, stack: '' };
}

function fatal(message, e) {
  const d = e === undefined ? { message, stack: '' } : describe(e);
  send({ type: 'fatal', message: e === undefined ? message : message + ': ' + d.message, stack: d.stack });
  output.end(() => process.exit(2));
}

let fn = null;
const queue = [];
let busy = false;

async function load(hello) {
  if (hello.protocol !== PROTOCOL) {
    return fatal(`protocol version ${hello.protocol} is not supported by this worker (it speaks ${PROTOCOL})`);
  }
  let mod;
  try {
    mod = await import(pathToFileURL(path.resolve(hello.module)).href);
  } catch (e) {
    return fatal(`cannot load module ${hello.module}`, e);
  }
  let f = mod[hello.export];
  if (f === undefined && mod.default && typeof mod.default === 'object') f = mod.default[hello.export];
  if (typeof f !== 'function') {
    const names = Object.keys(mod).filter((k) => k !== 'default');
    if (mod.default && typeof mod.default === 'object') names.push(...Object.keys(mod.default));
    const unique = [...new Set(names)];
    return fatal(`module ${hello.module} has no exported function '${hello.export}' (exports: ${unique.join(', ') || 'none'})`);
  }
  fn = f;
  send({ type: 'ready', protocol: PROTOCOL, runtime: 'node', version: process.version });
}

// Runs the function on each record of a batch and sends one result frame. The results are collected in an array
// and stringified once (one JSON.stringify per batch is cheaper than one per record); a value JSON cannot carry
// (a BigInt, a cycle) is found per record only when that fails.
async function runBatch(batch) {
  const records = batch.records;
  // Only a batch that holds a decimal ("decimals": true, set by the engine) is walked for them.
  if (batch.decimals === true) for (let i = 0; i < records.length; i++) records[i] = reviveDecimals(records[i]);
  const results = new Array(records.length);
  for (let i = 0; i < records.length; i++) {
    try {
      let r = fn(records[i]);
      if (r !== null && typeof r === 'object' && typeof r.then === 'function') r = await r;
      results[i] = { ok: r === undefined ? null : r };
    } catch (e) {
      results[i] = { error: describe(e) };
    }
  }
  const head = '{"type":"result","id":' + batch.id + ',"results":';
  let text;
  try {
    text = JSON.stringify(results);
  } catch (e) {
    for (let i = 0; i < results.length; i++) {
      if (results[i].ok === undefined) continue;
      try {
        JSON.stringify(results[i].ok);
      } catch (err) {
        results[i] = { error: describe(new TypeError('the returned value cannot be sent as JSON: ' + err.message)) };
      }
    }
    text = JSON.stringify(results);
  }
  sendText(head + text + '}');
}

async function pump() {
  if (busy) return;
  busy = true;
  try {
    while (queue.length > 0) {
      const msg = queue.shift();
      if (msg.type === 'hello') await load(msg);
      else if (msg.type === 'batch') {
        if (fn === null) return fatal('a batch arrived before the handshake');
        await runBatch(msg);
      } else return fatal(`unknown frame type '${msg.type}'`);
    }
  } finally {
    busy = false;
  }
}

// Incoming bytes: the chunks of an incomplete frame are kept in a list and joined once the frame is complete (a
// large batch arrives in many chunks; joining at each chunk would copy it over and over).
let pending = Buffer.alloc(0);
const parts = [];
let partsBytes = 0;
let need = -1; // the byte count `pending` + `parts` must reach for the frame at the front, -1: unknown
input.on('data', (chunk) => {
  if (need >= 0 && pending.length + partsBytes + chunk.length < need) {
    parts.push(chunk);
    partsBytes += chunk.length;
    return;
  }
  if (parts.length > 0) {
    parts.push(chunk);
    pending = Buffer.concat([pending, ...parts]);
    parts.length = 0;
    partsBytes = 0;
  } else {
    pending = pending.length === 0 ? chunk : Buffer.concat([pending, chunk]);
  }
  need = -1;
  while (pending.length >= 4) {
    const n = pending.readUInt32BE(0);
    if (n > MAX_FRAME) return fatal(`a frame of ${n} bytes is over the limit of ${MAX_FRAME}`);
    if (pending.length < 4 + n) {
      need = 4 + n;
      break;
    }
    const body = pending.subarray(4, 4 + n);
    pending = pending.subarray(4 + n);
    let msg;
    try {
      msg = JSON.parse(body.toString('utf8'));
    } catch (e) {
      return fatal('a frame is not valid JSON', e);
    }
    queue.push(msg);
  }
  pump();
});
// The engine closed the pipe (it stopped or died): nothing more will come.
input.on('end', () => process.exit(0));
input.on('error', () => process.exit(0));
