// worker.js: the browser worker's dedicated Web Worker. It loads the Go
// worker (worker.wasm, GOOS=js GOARCH=wasm, package wasmworker/browser),
// which speaks the worker protocol to the server, and gives it
// self.cyclepoolTasks: module compilation (cached) and task Web Workers
// (task.js), one per thread, reused between attempts and terminated to
// cancel one (short attempts go to a task Web Worker in batches: pump).
//
// Messages from the page: {type:"init", ...}, {type:"device"},
// {type:"settings"}, {type:"stop"}; they wait in an inbox until Go is ready.
//
// The interface with Go is cheap on purpose, because every value that
// crosses syscall/js costs and every event that resumes Go costs more: Go
// hands over an attempt as soon as the server assigns it, with one call of
// run (plain numbers, the module id and the attempt's bytes); worker.js
// queues it and runs `threads` attempts at a time (listen), so a task Web
// Worker that finishes starts its next attempt without waiting for Go. Go
// names an attempt by its id in terminate and answer, and hears of it
// through the one function it gave listen, events(attempt, kind, a): kind 0
// progress (a: fraction), 1 checkpoint (a: state, seq: the number answer
// gives back), 4 ended attempts (attempt
// 0; a: every attempt that ended since the last such event, packed in one
// Uint8Array, see packEnded). Ended attempts go to Go together: at once when
// nothing else runs or waits, else within endedDelayMs.
"use strict";
// The page shows what the worker logs (Go's log goes to console.log here):
// a worker's own console is hard to find in devtools and in tests.
for (const level of ["log", "error"]) {
  const orig = console[level].bind(console);
  console[level] = (...a) => { orig(...a); postMessage({ type: "log", level, text: a.join(" ") }); };
}
let inbox = [];
let deliver = null;
self.onmessage = (e) => {
  if (e.data.type === "init") boot(e.data);
  if (deliver) deliver(e.data); else inbox.push(e.data);
};
// Called by Go once it listens.
self.cyclepoolReady = (fn) => {
  deliver = fn;
  const pending = inbox; inbox = [];
  for (const m of pending) fn(m);
};

async function boot(init) {
  try {
    importScripts(init.wasmExec);
    const go = new Go();
    // task.js is fetched once, now, and every task Web Worker starts from
    // that copy: a task arrives when the server may already be gone (or the
    // network cut), and a worker started from the server's URL would then
    // fail to load before its attempt starts.
    const [taskJs, { instance }] = await Promise.all([
      scriptURL(init.taskJs),
      WebAssembly.instantiateStreaming(fetch(init.wasm), go.importObject),
    ]);
    self.cyclepoolTasks = makeTasks(taskJs, init.server, init.batchShortMs);
    await go.run(instance);
    // Go has exited: a call into it now throws, and the page's messages
    // (device state every few seconds) and the task Web Workers' events
    // have nobody to go to.
    deliver = () => {};
    self.cyclepoolTasks.listen(() => false, 1);
  } catch (err) {
    postMessage({ type: "log", level: "error", text: "worker failed: " + (err && err.stack || err) });
  }
  postMessage({ type: "stopped" });
}

// scriptURL fetches a script and returns a blob: URL of its text, which a
// Worker can start from for as long as the page lives, without the network.
async function scriptURL(url) {
  const resp = await fetch(url);
  if (!resp.ok) throw new Error(`fetch ${url}: HTTP ${resp.status}`);
  return URL.createObjectURL(new Blob([await resp.text()], { type: "text/javascript" }));
}

function makeTasks(taskJs, server, shortMs) {
  const bytesById = new Map(); // module id -> Promise<ArrayBuffer> (checked against its id)
  const modules = new Map();   // module id + "/" + memory pages -> Promise<WebAssembly.Module>
  const compiled = new Map();  // the same keys -> WebAssembly.Module, once compiled
  const withStart = new WeakSet(); // modules with a start function (hasStart)
  const idle = [];             // task Web Workers waiting for their next attempt
  const runs = new Map();      // attempt id -> {w, over, prepareMs}
  let events = () => {};       // Go's event function (listen)
  // Where successful attempts' time went (sums in ms, for the benchmark:
  // docs/BENCHMARKS.md): Go's preparation (measured by Go), the postMessage
  // to the task Web Worker, instantiation, _start, collecting the outputs,
  // the postMessage back. Go adds the last segment (the done event to Run's
  // return) in traced.
  // fromSocket is from the socket's message event (the frame that carried
  // the attempt) to run: Go's decoding, its goroutine hand-offs and its
  // preparation. Over the attempts that ended alone (sent), toSocket is
  // from the ended event to the socket's send (Go's last segment
  // included), and send the time in send itself.
  const trace = { n: 0, prepare: 0, toTask: 0, instantiate: 0, run: 0, collect: 0, back: 0, lastRun: 0,
    fromSocket: 0, toSocket: 0, send: 0, sent: 0 };
  const now = () => performance.timeOrigin + performance.now();
  // Go opens its WebSocket through self.WebSocket: this subclass notes
  // when messages arrive and results leave, for the trace.
  let messageAt = 0, endedAt = 0;
  const Socket = self.WebSocket;
  self.WebSocket = class extends Socket {
    constructor(...a) { super(...a); this.addEventListener("message", () => { messageAt = now(); }); }
    send(d) {
      if (!endedAt) return super.send(d);
      const t = now();
      super.send(d);
      trace.sent++; trace.toSocket += t - endedAt; trace.send += now() - t; endedAt = 0;
    }
  };
  const enc = new TextEncoder();
  const EMPTY = new Uint8Array(0);
  // Counters the page shows (and the tests read): task Web Workers started,
  // terminated and busy; attempts whose instance was made ahead of time
  // (task.js); modules fetched from the server and found in the IndexedDB
  // cache.
  const counts = { started: 0, terminated: 0, busy: 0, ahead: 0, fetched: 0, cached: 0, batches: 0, sent: 0, givenBack: 0, dataFetched: 0, dataCached: 0, dataEvicted: 0, dataUnkept: 0 };
  const hex = (buf) => Array.from(new Uint8Array(buf), (b) => b.toString(16).padStart(2, "0")).join("");
  const cache = moduleCache();

  // moduleBytes returns a module's bytes: from the IndexedDB cache of
  // earlier visits, or fetched from the server (the HTTP cache may answer:
  // a module is immutable) and then stored there. Either way the bytes must
  // hash to the module's id.
  function moduleBytes(id) {
    let p = bytesById.get(id);
    if (!p) {
      p = (async () => {
        const check = async (bytes) => {
          const digest = hex(await crypto.subtle.digest("SHA-256", bytes));
          return "sha256:" + digest === id ? null : digest;
        };
        const kept = await cache.get(id);
        if (kept && !(await check(kept))) { counts.cached++; return kept; }
        // A module the server does not have (404) fails its task; a
        // fetch the network or the server's trouble broke is the
        // worker's (unavailable: handed back, charging nobody), once it
        // failed three times (again after 0.5 s and 2 s), as in Go.
        const unavailable = (msg) => Object.assign(new Error(`fetch module ${id}: ${msg}`), { unavailable: true });
        const get = async () => {
          let resp;
          try { resp = await fetch(server + "/modules/" + encodeURIComponent(id)); } catch (err) { throw unavailable(err && err.message || err); }
          if (resp.status === 404) throw new Error(`fetch module ${id}: HTTP 404: the server has no such module`);
          if (!resp.ok) throw unavailable(`HTTP ${resp.status}`);
          try { return await resp.arrayBuffer(); } catch (err) { throw unavailable(err && err.message || err); }
        };
        let bytes;
        for (let wait = 500; ; wait *= 4) {
          try { bytes = await get(); break; } catch (err) {
            if (!err.unavailable || wait > 2000) throw err;
            await new Promise((resolve) => setTimeout(resolve, wait));
          }
        }
        const bad = await check(bytes);
        if (bad) throw new Error(`module ${id}: its bytes hash to sha256:${bad}`);
        counts.fetched++;
        cache.put(id, bytes);
        return bytes;
      })();
      bytesById.set(id, p);
      p.catch(() => bytesById.delete(id));
      if (bytesById.size > 64) bytesById.delete(bytesById.keys().next().value);
    }
    return p;
  }

  // compile caps a module's memory at the attempt's limit and compiles it,
  // once per page and limit.
  function compile(id, pages) {
    const key = id + "/" + pages;
    let p = modules.get(key);
    if (!p) {
      p = moduleBytes(id).then(async (bytes) => {
        const b = limitMemory(new Uint8Array(bytes), pages);
        const m = await WebAssembly.compile(b);
        if (hasStart(b)) withStart.add(m);
        return m;
      });
      modules.set(key, p);
      p.then((m) => { if (modules.get(key) === p) compiled.set(key, m); }, () => modules.delete(key));
      if (modules.size > 64) {
        const old = modules.keys().next().value;
        modules.delete(old); compiled.delete(old);
      }
    }
    return p;
  }

  // hasStart reports whether a module has a start function (run when it is
  // instantiated): such a module is never instantiated ahead of its attempt
  // (task.js), where no wall time limit would stop it.
  function hasStart(b) {
    let pos = 8;
    while (pos < b.length) {
      const id = b[pos];
      let size = 0, mul = 1, byte, q = pos + 1;
      do { byte = b[q++]; size += (byte & 0x7f) * mul; mul *= 128; } while (byte & 0x80 && q < b.length);
      if (id === 8) return true;
      pos = q + size;
    }
    return false;
  }

  // limitMemory returns the module with the maximum of its memory set to at
  // most `pages`, so that memory.grow past the limit fails inside the module
  // (returns -1), as in the headless runner, instead of growing the tab.
  function limitMemory(b, pages) {
    const leb = (pos) => {
      let v = 0, mul = 1, byte;
      do { byte = b[pos++]; v += (byte & 0x7f) * mul; mul *= 128; } while (byte & 0x80);
      return [v, pos];
    };
    const uleb = (v) => {
      const out = [];
      do { let byte = v % 128; v = Math.floor(v / 128); if (v) byte |= 0x80; out.push(byte); } while (v);
      return out;
    };
    let pos = 8;
    while (pos < b.length) {
      const id = b[pos];
      const [size, body] = leb(pos + 1);
      const end = body + size;
      if (id === 5) { // the memory section
        let [count, p] = leb(body);
        const out = uleb(count);
        for (let i = 0; i < count; i++) {
          const flags = b[p++];
          if (flags & ~1) return b; // shared or 64-bit memory: left alone
          let min, max;
          [min, p] = leb(p);
          if (flags & 1) [max, p] = leb(p);
          max = Math.max(min, max === undefined ? pages : Math.min(max, pages)); // min > limit fails at instantiation
          out.push(1, ...uleb(min), ...uleb(max));
        }
        if (p !== end) return b;
        const sec = [5, ...uleb(out.length), ...out];
        const res = new Uint8Array(b.length - (end - pos) + sec.length);
        res.set(b.subarray(0, pos)); res.set(sec, pos); res.set(b.subarray(end), pos + sec.length);
        return res;
      }
      pos = end;
    }
    return b;
  }

  function spawn() {
    counts.started++;
    return new Worker(taskJs, { name: "cyclepool-task" });
  }
  function kill(w) {
    w.terminate();
    counts.terminated++;
  }

  // pack puts the outputs and the log of a finished attempt in one
  // Uint8Array, so that Go copies them with one call: per output a uint32
  // (little endian) name length, the name (UTF-8), a uint32 data length and
  // the data; then a uint32 log length and the log. The count of outputs
  // comes first.
  function pack(outputs, log) {
    const names = outputs.map((o) => enc.encode(o.name));
    let n = 8 + log.length;
    for (let i = 0; i < outputs.length; i++) n += 8 + names[i].length + outputs[i].data.length;
    const b = new Uint8Array(n), v = new DataView(b.buffer);
    let p = 0;
    v.setUint32(p, outputs.length, true); p += 4;
    for (let i = 0; i < outputs.length; i++) {
      const name = names[i], data = outputs[i].data;
      v.setUint32(p, name.length, true); b.set(name, p + 4); p += 4 + name.length;
      v.setUint32(p, data.length, true); b.set(data, p + 4); p += 4 + data.length;
    }
    v.setUint32(p, log.length, true); b.set(log, p + 4);
    return b;
  }
  // Attempts that ended, waiting to go to Go in one event (see the top).
  const endedDelayMs = 4;
  let ended = [], endedTimer = 0;
  // end records that an attempt ended (reason null on success) after ms
  // milliseconds in its task Web Worker.
  function end(attempt, reason, message, packed, ms) {
    ended.push({ attempt, reason, message, packed, ms, heldMs: -1 });
    settle();
  }
  function settle() {
    if (active === 0 && pending.length === 0) flushEnded();
    else if (!endedTimer) endedTimer = setTimeout(flushEnded, endedDelayMs);
  }
  // packEnded packs ended attempts: a uint32 count; per attempt its id, its
  // run time in ms and the part of it the CPU share held the task back (-1:
  // not known, the task Web Worker did not say) (float64s), the reason and the message (a uint32
  // length, 0xffffffff for none, then UTF-8), and pack's bytes (a uint32
  // length, then the bytes); little endian.
  function flushEnded() {
    if (endedTimer) { clearTimeout(endedTimer); endedTimer = 0; }
    if (ended.length === 0) return;
    const list = ended; ended = [];
    const strs = list.map((e) => [e.reason == null ? null : enc.encode(e.reason), e.message == null ? null : enc.encode(e.message)]);
    let n = 4;
    for (let i = 0; i < list.length; i++) {
      n += 24 + 12 + list[i].packed.length;
      for (const x of strs[i]) if (x) n += x.length;
    }
    const b = new Uint8Array(n), v = new DataView(b.buffer);
    let p = 0;
    v.setUint32(p, list.length, true); p += 4;
    for (let i = 0; i < list.length; i++) {
      const e = list[i];
      v.setFloat64(p, e.attempt, true); v.setFloat64(p + 8, e.ms, true); v.setFloat64(p + 16, e.heldMs, true); p += 24;
      for (const x of strs[i]) {
        if (x) { v.setUint32(p, x.length, true); b.set(x, p + 4); p += 4 + x.length; }
        else { v.setUint32(p, 0xffffffff, true); p += 4; }
      }
      v.setUint32(p, e.packed.length, true); b.set(e.packed, p + 4); p += 4 + e.packed.length;
    }
    endedAt = list.length === 1 && list[0].traced ? now() : 0;
    events(0, 4, b);
  }
  const fail = (attempt, reason, message) => end(attempt, reason, message, pack([], EMPTY), 0);

  // Attempts waiting for a task Web Worker, and how many task Web Workers
  // run; at most `threads` at once (listen). A task Web Worker is given a
  // batch of attempts in one message and answers with all their outcomes
  // in one message: every message wakes a thread, which costs more than a
  // short attempt itself. Attempts of a module whose recent attempts ran
  // shorter than batchShortMs go in batches of up to maxBatch (no more than
  // their fair share of what waits); other attempts go one at a time. An
  // attempt of a short module that runs longer than takeBackMs gives back
  // the attempts of its batch that wait behind it once another thread is
  // idle (checkWall: they go to the front of the queue, for that thread),
  // as the headless runner does after 5 ms: a module that is short most of
  // the time cannot hold other owners' attempts for its wall time. Those
  // of its batch that ran before it still report with it, when it ends.
  // (batchShortMs can be raised, for tests, by the page's batch_short_ms:
  // on a loaded machine short attempts may take longer than 2 ms.)
  const maxBatch = 8, batchShortMs = shortMs > 0 ? Math.min(shortMs, 60000) : 2, takeBackMs = 5;
  const runMs = new Map(); // module key -> recent run time (ms, moving average)
  let pending = [], active = 0, threads = 1;
  function pump() {
    while (active < threads && pending.length > 0) {
      const q = pending.shift();
      if (q.r.over) continue;
      const batch = [q];
      if (runMs.get(q.p.key) < batchShortMs) {
        const n = Math.min(maxBatch, Math.ceil((pending.length + 1) / (threads - active)));
        while (batch.length < n && pending.length > 0) {
          const x = pending[0];
          if (x.r.over) { pending.shift(); continue; }
          if (!(runMs.get(x.p.key) < batchShortMs)) break;
          batch.push(pending.shift());
        }
      }
      start(batch);
    }
  }

  // run queues an attempt, to start in a task Web Worker once its module is
  // compiled and one of the `threads` is free. The task Web Worker keeps
  // the modules it was given (and its checkpoint channel), so an attempt of
  // a module it has run before posts no module. Its events go to Go's
  // events function; its wall time counts from its start.
  function run(attempt, moduleId, pages, args, stdin, inputs, restore, seedHi, seedLo, ckptMs, share,
    wallMs, outputBytes, logBytes, prepareMs, setupJSON) {
    const key = moduleId + "/" + pages;
    const r = { w: null, over: false, prepareMs, wallMs, key, fromSocket: messageAt ? now() - messageAt : 0 };
    runs.set(attempt, r);
    const p = {
      attempt, key, module: null, ahead: false, reset: false, args: args || [], stdin: stdin || EMPTY, inputs: inputs || [],
      restore, seed: (BigInt(seedHi) << 32n) | BigInt(seedLo), ckptMs, share, ctl: null,
      limits: { memoryPages: pages, wallMs, outputBytes, logBytes }, setup: null,
    };
    const queue = (mod) => { pending.push({ attempt, r, p, mod }); pump(); };
    const mod = compiled.get(key);
    if (mod && !setupJSON) { queue(mod); return; }
    // A task with a setup waits for its data too (docs/DATA.md).
    const ready = setupJSON ? Promise.all([compile(moduleId, pages), setupFiles(JSON.parse(setupJSON))]) : compile(moduleId, pages).then((m) => [m]);
    ready.then(([m, setup]) => { if (!r.over) { if (setup) p.setup = setup; queue(m); } },
      (err) => {
        if (r.over) return;
        r.over = true; runs.delete(attempt);
        if (err && (err.dataError || err.unavailable)) fail(attempt, "worker", err.message); else fail(attempt, "module", String(err));
      });
  }

  // setupFiles fetches the data of a task's setup and returns it as
  // task.js takes it: each file with its bytes (or inline data).
  async function setupFiles(su) {
    const files = await Promise.all((su.files || []).map(async (f) => {
      if (!f.blob) return { path: f.path, data: f.data === undefined ? "" : f.data };
      try {
        return { path: f.path, bytes: await blobBytes(f), archive: !!f.archive, writable: !!f.writable };
      } catch (err) {
        const e = new Error(`fetching data for ${f.path}: ${err && err.message || err}`);
        e.dataError = true;
        throw e;
      }
    }));
    return { env: su.env || [], cwd: su.cwd || "/", files, outputs: su.outputs || [], scratchBytes: su.scratch_bytes || 0 };
  }

  // blobBytes returns a blob's bytes, checked against its id: from this
  // page's memory, from the Cache API of earlier visits, or downloaded.
  // A full quota evicts what the cache holds rather than failing.
  const blobsById = new Map(); // id -> Promise<Uint8Array>
  // dataHeld has the blobs this page keeps in the Cache API, for the
  // worker's hello (locality: tasks reading them come to this volunteer,
  // who then downloads nothing), read from the cache at start.
  const dataHeld = new Set();
  const heldRead = !self.caches ? Promise.resolve() :
    self.caches.open("cyclepool-data").then((s) => s.keys()).then((reqs) => {
      for (const r of reqs) {
        const m = /\/blobs\/(sha256:[0-9a-f]{64})/.exec(decodeURIComponent(r.url));
        if (m) dataHeld.add(m[1]);
      }
    }).catch(() => {});
  // held resolves to the blobs kept, once the cache has been read.
  const held = () => heldRead.then(() => [...dataHeld].slice(0, 4096));
  function blobBytes(f) {
    let p = blobsById.get(f.blob);
    if (!p) {
      p = (async () => {
        const url = server + f.url;
        const check = async (buf) => "sha256:" + hex(await crypto.subtle.digest("SHA-256", buf)) === f.blob;
        const store = self.caches ? await self.caches.open("cyclepool-data").catch(() => null) : null;
        if (store) {
          const kept = await store.match(url).catch(() => null);
          if (kept) {
            const buf = await kept.arrayBuffer();
            if (await check(buf)) { counts.dataCached++; dataHeld.add(f.blob); return new Uint8Array(buf); }
            await store.delete(url).catch(() => {});
          }
        }
        let buf = null;
        for (let tries = 0; tries < 2 && !buf; tries++) {
          const resp = await fetch(url);
          if (!resp.ok) throw new Error(`GET ${server + "/blobs/" + f.blob}: HTTP ${resp.status}`);
          const b = await resp.arrayBuffer();
          if (await check(b)) buf = b;
        }
        if (!buf) throw new Error(`the data downloaded for ${f.blob} does not match its hash`);
        counts.dataFetched++;
        if (store) {
          const put = () => store.put(url, new Response(buf)); // Response copies the bytes
          await put().then(() => dataHeld.add(f.blob), async () => {
            // Out of quota: make room by emptying this cache, and go on
            // (unkept: the blob did not fit even then).
            counts.dataEvicted++;
            for (const k of await store.keys().catch(() => [])) await store.delete(k).catch(() => {});
            dataHeld.clear();
            await put().then(() => dataHeld.add(f.blob), () => { counts.dataUnkept++; });
          });
        }
        return new Uint8Array(buf);
      })();
      blobsById.set(f.blob, p);
      p.catch(() => blobsById.delete(f.blob));
      if (blobsById.size > 8) blobsById.delete(blobsById.keys().next().value);
    }
    return p;
  }

  // A task Web Worker's handlers are set once; they act on its current
  // batch (w.batch: the queue entries {attempt, r, p, mod} it was sent).
  function spawnFor() {
    const w = spawn();
    w.onmessage = (e) => {
      const m = e.data;
      if (m.type === "done") {
        const back = now();
        const batch = w.batch;
        if (!batch) return;
        release(w);
        if (runMs.size > 256) runMs.clear();
        for (const d of m.list) {
          const r = runs.get(d.attempt);
          if (!r || r.over || r.w !== w) continue;
          r.over = true; runs.delete(d.attempt);
          const t = d.t;
          if (!d.reason && t && batch.length === 1) {
            trace.n++;
            trace.prepare += r.prepareMs; trace.toTask += t.recv - t.posted; trace.instantiate += t.started - t.recv;
            trace.run += t.ran - t.started; trace.lastRun = t.ran - t.started; trace.collect += t.sent - t.ran;
            trace.back += back - t.sent; trace.fromSocket += r.fromSocket;
          }
          if (d.ahead) counts.ahead++;
          if (!d.reason) runMs.set(r.key, runMs.has(r.key) ? 0.8 * runMs.get(r.key) + 0.2 * d.ms : d.ms);
          ended.push({ attempt: d.attempt, reason: d.reason || null, message: d.reason ? d.message : null,
            packed: pack(d.outputs, d.log), ms: d.ms, heldMs: d.heldMs, traced: !d.reason && batch.length === 1 });
        }
        pump();
        settle();
        return;
      }
      if (m.type === "log") { console.error("task worker:", m.text); return; }
      const r = runs.get(m.attempt);
      if (m.type === "checkpoint" && (!r || r.over || r.w !== w || events(m.attempt, 1, m.state, m.seq) === false)) {
        // Its task waits for an answer: one nobody will give would
        // block it for good. Not saved.
        if (w.ctl) answerCtl(w.ctl, m.seq, 1);
        return;
      }
      if (!r || r.over || r.w !== w) return;
      if (m.type === "progress") events(m.attempt, 0, m.f);
    };
    w.onerror = (e) => {
      e.preventDefault();
      if (!w.batch) return;
      // The attempt that runs now fails; if none has started, the first.
      // (Its place may have been given back to another thread, whose
      // attempt this is not.)
      let id = w.nowRunning();
      if (!runs.has(id) || runs.get(id).w !== w) { const q = w.batch.find((x) => !x.r.over && x.r.w === w); id = q ? q.attempt : 0; }
      const r = runs.get(id);
      stopBatch(w, id);
      if (r && !r.over) {
        r.over = true; runs.delete(id);
        // No start time: it failed before running anything (its script
        // did not load, say), so it ran for nothing, and the worker hands
        // it back; once it ran, the task brought its thread down
        // (crashed: one of the task's losses).
        const started = w.startedAt() > 0 && w.nowRunning() === id;
        const ran = started ? now() - w.startedAt() : 0;
        end(id, started ? "crashed" : "worker", "the task Web Worker failed: " + (e.message || "error"), pack([], EMPTY), ran);
      }
      pump();
    };
    w.onmessageerror = w.onerror;
    return w;
  }

  // release makes a task Web Worker whose batch is over idle again.
  function release(w) {
    w.batch = null; counts.busy--; active--; busy.delete(w);
    if (idle.length < 16) idle.push(w); else kill(w);
  }

  // stopBatch terminates a task Web Worker in the middle of its batch,
  // for the attempt `but` (which the caller ends): the batch's other
  // attempts that have not ended go back to the front of the queue, to run
  // again from their start elsewhere (nothing of them was reported).
  function stopBatch(w, but) {
    const batch = w.batch;
    w.batch = null; counts.busy--; active--; busy.delete(w); kill(w);
    const again = [];
    for (const q of batch) {
      if (q.attempt === but || q.r.over || q.r.w !== w) continue; // r.w: taken back (giveBack)
      q.r.w = null;
      again.push(q);
    }
    pending.unshift(...again);
  }

  // The wall time limit, counted from an attempt's start in its task Web
  // Worker (which it writes in its ctl buffer): checked every 50 ms while
  // attempts run (one timer rather than one per attempt); the task Web
  // Worker of an attempt past its limit is terminated (Go words the
  // message).
  let wallTimer = 0;
  const busy = new Set(); // task Web Workers with a batch
  function checkWall() {
    const t = now();
    for (const w of busy) {
      if (!w.batch) { busy.delete(w); continue; }
      const id = w.nowRunning(), r = id ? runs.get(id) : null;
      if (r && !r.over && r.w === w && t >= w.startedAt() + r.wallMs) {
        stopBatch(w, id);
        r.over = true; runs.delete(id);
        end(id, "limit_wall_time", null, pack([], EMPTY), t - w.startedAt());
      } else if (active < threads && r && !r.over && r.w === w && w.batch.length > 1 && t >= w.startedAt() + takeBackMs) {
        giveBack(w);
      }
    }
    pump();
    if (active === 0) { clearInterval(wallTimer); wallTimer = 0; }
  }

  // giveBack takes the attempts of w's batch that have not started back
  // to the front of the queue: each place's word in the ctl buffer is
  // claimed here (2, as a cancel does) unless task.js claimed it first (1),
  // and task.js skips the places claimed here.
  function giveBack(w) {
    const skip = new Int32Array(w.ctl, 24), back = [];
    for (const q of w.batch) {
      if (q.r.over || q.r.w !== w) continue;
      if (Atomics.compareExchange(skip, q.r.pos, 0, 2) !== 0) continue;
      q.r.w = null;
      back.push(q);
    }
    if (back.length === 0) return;
    counts.givenBack += back.length;
    pending.unshift(...back);
  }

  function start(batch) {
    const w = idle.pop() || spawnFor();
    w.batch = batch;
    if (w.ctl) new Int32Array(w.ctl, 24).fill(0); // none started (task.js)
    counts.busy++;
    active++;
    busy.add(w);
    const list = [];
    for (const [i, q] of batch.entries()) {
      const p = q.p;
      q.r.w = w; q.r.pos = i;
      p.module = null; p.ahead = false; p.reset = false; p.ctl = null;
      if (!w.ctl) {
        w.ctl = new SharedArrayBuffer(24 + 4 * maxBatch); w.mods = new Set(); p.ctl = w.ctl;
        const at = new Float64Array(w.ctl);
        w.nowRunning = () => at[1]; w.startedAt = () => at[2];
      }
      if (!w.mods.has(p.key)) {
        if (w.mods.size >= 16) { w.mods.clear(); p.reset = true; }
        w.mods.add(p.key);
        p.module = q.mod;
        p.ahead = !withStart.has(q.mod);
      }
      list.push(p);
    }
    if (!wallTimer) wallTimer = setInterval(checkWall, 50);
    counts.batches++;
    counts.sent += list.length;
    w.postMessage({ type: "run", list, postedAt: now() });
  }

  // terminate ends an attempt at once: its task Web Worker is terminated
  // (the other attempts of its batch go back to the queue), or it never
  // starts if it still waits; nothing more is reported, and it returns
  // true. An attempt that has already ended is not touched: its outcome,
  // if still held for the next event, goes to Go now, and it returns false.
  function terminate(attempt) {
    const r = runs.get(attempt);
    if (!r || r.over) {
      if (ended.some((e) => e.attempt === attempt)) flushEnded();
      return false;
    }
    r.over = true;
    runs.delete(attempt);
    if (r.w) {
      // Not started yet in its batch, or over already: its task Web
      // Worker goes on with the others (task.js skips a cancelled one).
      // Only the attempt that runs now is stopped, by terminating it.
      const started = Atomics.compareExchange(new Int32Array(r.w.ctl, 24), r.pos, 0, 2);
      if (started === 0 || r.w.nowRunning() !== attempt) return true;
      stopBatch(r.w, attempt);
      // Not at once: Go terminates every attempt a cancel frame or a pause
      // names in one go, and the rest of this batch may be among them.
      if (!pumpSoon) { pumpSoon = true; queueMicrotask(() => { pumpSoon = false; pump(); }); }
    }
    return true;
  }
  let pumpSoon = false;

  // running lists the attempts given to task Web Workers (the others wait
  // for one).
  const running = () => Array.from(runs, ([a, r]) => (r.w && !r.over ? a : -1)).filter((a) => a >= 0);

  // answer wakes the attempt's task, blocked in its checkpoint seq, with
  // code (0 saved, 1 refused, 2 kept to deliver on reconnecting).
  function answer(attempt, code, seq) {
    const r = runs.get(attempt);
    if (!r || !r.w) return;
    answerCtl(r.w.ctl, seq, code);
  }
  // answerCtl writes an answer in one store, tagged with the checkpoint's
  // seq: a task waiting for another checkpoint goes on waiting.
  function answerCtl(ctl, seq, code) {
    const a = new Int32Array(ctl);
    Atomics.store(a, 0, (seq << 2) | code); Atomics.notify(a, 0);
  }

  // traced returns the trace with Go's last segment added.
  const traced = (goReturn) => Object.assign({}, trace, { return: goReturn });
  const listen = (fn, n) => { events = fn; threads = Math.max(1, n | 0); };
  return { compile, run, terminate, answer, listen, traced, running, counts, held };
}

// moduleCache keeps module bytes across visits in IndexedDB, keyed by module
// id (a module is immutable), so that a volunteer downloads each module once.
// Chromium no longer stores a compiled WebAssembly.Module there, so the bytes
// are kept and compiled once per visit (a no-op's compile takes well under a
// millisecond; a large module compiles lazily, function by function). At most
// maxEntries modules are kept, the least recently used going first. Where
// IndexedDB is unavailable (some private modes, a full disk) every call
// quietly does nothing and modules come from the network.
function moduleCache() {
  const maxEntries = 32;
  const db = new Promise((resolve) => {
    try {
      const req = indexedDB.open("cyclepool-modules", 1);
      req.onupgradeneeded = () => {
        req.result.createObjectStore("bytes"); // module id -> ArrayBuffer
        req.result.createObjectStore("used");  // module id -> when last used (ms)
      };
      req.onsuccess = () => resolve(req.result);
      req.onerror = () => resolve(null);
      req.onblocked = () => resolve(null);
    } catch { resolve(null); }
  });
  // tx runs fn in a read-write transaction; its promise gives what fn set,
  // or null when the transaction (or IndexedDB) fails.
  const tx = async (fn) => {
    const d = await db;
    if (!d) return null;
    return new Promise((resolve) => {
      try {
        const t = d.transaction(["bytes", "used"], "readwrite");
        let out = null;
        fn(t.objectStore("bytes"), t.objectStore("used"), (v) => { out = v; });
        t.oncomplete = () => resolve(out);
        t.onerror = t.onabort = () => resolve(null);
      } catch { resolve(null); }
    });
  };
  return {
    get: (id) => tx((bytes, used, set) => {
      const r = bytes.get(id);
      r.onsuccess = () => {
        if (!(r.result instanceof ArrayBuffer)) return;
        set(r.result);
        used.put(Date.now(), id);
      };
    }),
    put: (id, data) => tx((bytes, used) => {
      bytes.put(data, id);
      used.put(Date.now(), id);
      const keys = used.getAllKeys(), times = used.getAll();
      times.onsuccess = () => {
        const order = keys.result.map((k, i) => [times.result[i], k]).sort((a, b) => a[0] - b[0]);
        for (const [, k] of order.slice(0, Math.max(0, order.length - maxEntries))) { bytes.delete(k); used.delete(k); }
      };
    }),
  };
}
