// worker.js: the browser worker's dedicated Web Worker. It loads the Go
// worker (worker.wasm, GOOS=js GOARCH=wasm, package wasmworker/browser),
// which speaks the worker protocol to the server, and gives it
// self.cyclepoolTasks: module compilation (cached) and task Web Workers
// (task.js), one per running attempt, reused between attempts and
// terminated to cancel one.
//
// Messages from the page: {type:"init", ...}, {type:"device"},
// {type:"settings"}, {type:"stop"}; they wait in an inbox until Go is ready.
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
  const idle = [];             // task Web Workers waiting for their next attempt
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
      p.catch(() => modules.delete(key));
      if (modules.size > 64) modules.delete(modules.keys().next().value);
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

  // run starts an attempt in a task Web Worker; onEvent gets its progress,
  // checkpoint and done messages. The handle's terminate() ends it at once.
  function run(params, onEvent) {
    const w = idle.pop() || spawn();
    const ctl = new SharedArrayBuffer(8);
    let over = false;
    counts.busy++;
    const finish = () => { over = true; counts.busy--; };
    w.onmessage = (e) => {
      if (over) return;
      const m = e.data;
      if (m.type === "done") {
        if (m.t) m.t.back = performance.timeOrigin + performance.now();
        finish();
        if (idle.length < 16) idle.push(w); else kill(w);
      }
      onEvent(m);
    };
    w.onerror = (e) => {
      e.preventDefault();
      if (over) return;
      finish(); kill(w);
      onEvent({ type: "done", reason: "worker", message: "the task Web Worker failed: " + (e.message || "error"), outputs: [], log: new Uint8Array(0), ms: 0 });
    };
    w.onmessageerror = w.onerror;
    params.ctl = ctl;
    params.type = "run";
    params.postedAt = performance.timeOrigin + performance.now();
    w.postMessage(params);
    return {
      terminate() { if (!over) { finish(); kill(w); } },
      answer(code) {
        const a = new Int32Array(ctl);
        Atomics.store(a, 1, code); Atomics.store(a, 0, 1); Atomics.notify(a, 0);
      },
    };
  }
  return { compile, run, counts };
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
