// worker.js: the browser worker's dedicated Web Worker. It loads the Go
// worker (worker.wasm, GOOS=js GOARCH=wasm, package wasmworker/browser),
// which speaks the worker protocol to the server, and gives it
// self.cyclepoolTasks: module compilation (cached) and task Web Workers
// (task.js), one per running attempt, reused between attempts and
// terminated to cancel one.
//
// Messages from the page: {type:"init", ...}, {type:"device"},
// {type:"settings"}, {type:"stop"}; they wait in an inbox until Go is ready.
//
// The interface with Go is cheap on purpose, because every value that
// crosses syscall/js costs: Go starts an attempt with one call of run (plain
// numbers, the module id and the attempt's bytes), names it by attempt id in
// terminate and answer, and hears of it through the one function it gave
// listen, events(attempt, kind, a, b, c): kind 0 progress (a: fraction), 1
// checkpoint (a: state), 2 done (a: failure reason or null, b: message, c:
// outputs and log packed in one Uint8Array, see pack), 3 started (only for
// an attempt whose run returned false: it waited for its module).
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
    self.cyclepoolTasks = makeTasks(init.taskJs, init.server);
    const go = new Go();
    const { instance } = await WebAssembly.instantiateStreaming(fetch(init.wasm), go.importObject);
    await go.run(instance);
  } catch (err) {
    postMessage({ type: "log", level: "error", text: "worker failed: " + (err && err.stack || err) });
  }
  postMessage({ type: "stopped" });
}

function makeTasks(taskJs, server) {
  const bytesById = new Map(); // module id -> Promise<ArrayBuffer> (checked against its id)
  const modules = new Map();   // module id + "/" + memory pages -> Promise<WebAssembly.Module>
  const compiled = new Map();  // the same keys -> WebAssembly.Module, once compiled
  const idle = [];             // task Web Workers waiting for their next attempt
  const runs = new Map();      // attempt id -> {w, over, prepareMs}
  let events = () => {};       // Go's event function (listen)
  // Where successful attempts' time went (sums in ms, for the benchmark:
  // docs/BENCHMARKS.md): Go's preparation (measured by Go), the postMessage
  // to the task Web Worker, instantiation, _start, collecting the outputs,
  // the postMessage back. Go adds the last segment (the done event to Run's
  // return) in traced.
  const trace = { n: 0, prepare: 0, toTask: 0, instantiate: 0, run: 0, collect: 0, back: 0, lastRun: 0 };
  const now = () => performance.timeOrigin + performance.now();
  const enc = new TextEncoder();
  const EMPTY = new Uint8Array(0);
  // Counters the page shows (and the tests read): task Web Workers started,
  // terminated and busy; modules fetched from the server and found in the
  // IndexedDB cache.
  const counts = { started: 0, terminated: 0, busy: 0, fetched: 0, cached: 0 };
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
        const resp = await fetch(server + "/modules/" + encodeURIComponent(id));
        if (!resp.ok) throw new Error(`fetch module ${id}: HTTP ${resp.status}`);
        const bytes = await resp.arrayBuffer();
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
      p = moduleBytes(id).then((bytes) => WebAssembly.compile(limitMemory(new Uint8Array(bytes), pages)));
      modules.set(key, p);
      p.then((m) => { if (modules.get(key) === p) compiled.set(key, m); }, () => modules.delete(key));
      if (modules.size > 64) {
        const old = modules.keys().next().value;
        modules.delete(old); compiled.delete(old);
      }
    }
    return p;
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
  const fail = (attempt, reason, message) => events(attempt, 2, reason, message, pack([], EMPTY));

  // run starts an attempt in a task Web Worker, once its module is compiled
  // (at once when it is). The task Web Worker keeps the modules it was
  // given (and its checkpoint channel), so an attempt of a module it has run
  // before posts no module. Events go to Go's events function. It returns
  // whether the attempt started at once; if not, a started event follows
  // once the module is compiled (or a done event if it cannot be).
  function run(attempt, moduleId, pages, args, stdin, inputs, restore, seedHi, seedLo, ckptMs, share,
    wallMs, outputBytes, logBytes, prepareMs) {
    const r = { w: null, over: false, prepareMs };
    runs.set(attempt, r);
    const key = moduleId + "/" + pages;
    const p = {
      type: "run", key, module: null, reset: false, args: args || [], stdin: stdin || EMPTY, inputs: inputs || [],
      restore, seed: (BigInt(seedHi) << 32n) | BigInt(seedLo), ckptMs, share, ctl: null,
      limits: { memoryPages: pages, wallMs, outputBytes, logBytes }, postedAt: 0,
    };
    const mod = compiled.get(key);
    if (mod) {
      start(attempt, r, p, mod);
      return true;
    }
    compile(moduleId, pages).then((m) => { if (!r.over) { start(attempt, r, p, m); events(attempt, 3); } },
      (err) => { if (!r.over) { r.over = true; runs.delete(attempt); fail(attempt, "module", String(err)); } });
    return false;
  }

  function start(attempt, r, p, mod) {
    const w = idle.pop() || spawn();
    r.w = w;
    counts.busy++;
    if (!w.ctl) { w.ctl = new SharedArrayBuffer(8); w.mods = new Set(); p.ctl = w.ctl; }
    if (!w.mods.has(p.key)) {
      if (w.mods.size >= 16) { w.mods.clear(); p.reset = true; }
      w.mods.add(p.key);
      p.module = mod;
    }
    const finish = () => { r.over = true; counts.busy--; runs.delete(attempt); };
    w.onmessage = (e) => {
      if (r.over) return;
      const m = e.data;
      if (m.type === "done") {
        const back = now();
        finish();
        if (idle.length < 16) idle.push(w); else kill(w);
        const t = m.t;
        if (!m.reason && t) {
          trace.n++;
          trace.prepare += r.prepareMs; trace.toTask += t.recv - t.posted; trace.instantiate += t.started - t.recv;
          trace.run += t.ran - t.started; trace.lastRun = t.ran - t.started; trace.collect += t.sent - t.ran;
          trace.back += back - t.sent;
        }
        events(attempt, 2, m.reason || null, m.reason ? m.message : null, pack(m.outputs, m.log));
      } else if (m.type === "progress") events(attempt, 0, m.f);
      else if (m.type === "checkpoint") events(attempt, 1, m.state);
    };
    w.onerror = (e) => {
      e.preventDefault();
      if (r.over) return;
      finish(); kill(w);
      fail(attempt, "worker", "the task Web Worker failed: " + (e.message || "error"));
    };
    w.onmessageerror = w.onerror;
    p.postedAt = now();
    w.postMessage(p);
  }

  // terminate ends an attempt at once: its task Web Worker is terminated,
  // or it never starts if its module is still being compiled. Nothing more
  // is reported.
  function terminate(attempt) {
    const r = runs.get(attempt);
    if (!r || r.over) return;
    if (r.w) { counts.busy--; kill(r.w); }
    r.over = true;
    runs.delete(attempt);
  }

  // answer wakes the attempt's task, blocked in checkpoint, with code (0
  // saved, 1 refused, 2 kept to deliver on reconnecting).
  function answer(attempt, code) {
    const r = runs.get(attempt);
    if (!r || !r.w) return;
    const a = new Int32Array(r.w.ctl);
    Atomics.store(a, 1, code); Atomics.store(a, 0, 1); Atomics.notify(a, 0);
  }

  // traced returns the trace with Go's last segment added.
  const traced = (goReturn) => Object.assign({}, trace, { return: goReturn });
  const listen = (fn) => { events = fn; };
  return { compile, run, terminate, answer, listen, traced, counts };
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
