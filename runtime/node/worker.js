// Sluice function worker for Node.js: runs one exported function of a user's module for one subtask of a
// pipeline. Started by the engine as `node worker.js` with the protocol on file descriptor 3 (one end of a Unix
// stream socket pair, both directions); stdout and stderr go to the engine's log, so console.log is safe.
//
// Protocol (docs/functions.md, version 1): each frame is a 4-byte big-endian unsigned length followed by that
// many bytes of UTF-8 JSON.
//   engine -> worker  {"type":"hello","protocol":1,"module":PATH,"export":NAME}
//   worker -> engine  {"type":"ready","protocol":1,"runtime":"node","version":process.version}
//                     or {"type":"fatal","message":...,"stack":...} (then exits)
//   engine -> worker  {"type":"batch","id":N,"records":[ENVELOPE, ...]}
//   worker -> engine  {"type":"result","id":N,"results":[{"ok":VALUE} | {"error":{"message":..,"stack":..}}, ...]}
// Batches are answered in the order they arrive, one result per record in record order. The worker processes one
// batch at a time; a function returning a Promise is awaited before the next record.
'use strict';

const net = require('net');
const path = require('path');
const { pathToFileURL } = require('url');

const PROTOCOL = 1;
const MAX_FRAME = 256 * 1024 * 1024;

const channel = new net.Socket({ fd: 3, readable: true, writable: true });
const input = channel;
const output = channel;

function send(obj) {
  const body = Buffer.from(JSON.stringify(obj), 'utf8');
  const header = Buffer.allocUnsafe(4);
  header.writeUInt32BE(body.length, 0);
  output.write(Buffer.concat([header, body]));
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

async function runBatch(batch) {
  const records = batch.records;
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
  let frame;
  try {
    frame = { type: 'result', id: batch.id, results };
    send(frame);
  } catch (e) {
    // A result that JSON cannot represent (a BigInt, a cycle): report it per record, then fail the rest.
    for (let i = 0; i < results.length; i++) {
      if (results[i].ok === undefined) continue;
      try {
        JSON.stringify(results[i].ok);
      } catch (err) {
        results[i] = { error: describe(new TypeError('the returned value cannot be sent as JSON: ' + err.message)) };
      }
    }
    send({ type: 'result', id: batch.id, results });
  }
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

let pending = Buffer.alloc(0);
input.on('data', (chunk) => {
  pending = pending.length === 0 ? chunk : Buffer.concat([pending, chunk]);
  while (pending.length >= 4) {
    const n = pending.readUInt32BE(0);
    if (n > MAX_FRAME) return fatal(`a frame of ${n} bytes is over the limit of ${MAX_FRAME}`);
    if (pending.length < 4 + n) break;
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
