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
  const modules = new Map(); // module id -> Promise<WebAssembly.Module>
  const idle = [];           // task Web Workers waiting for their next attempt
  const counts = { started: 0, terminated: 0, busy: 0 };
  const hex = (buf) => Array.from(new Uint8Array(buf), (b) => b.toString(16).padStart(2, "0")).join("");

  // compile fetches a module (the HTTP cache keeps its bytes: it is
  // immutable), checks its sha256 against its id, caps its memory at the
  // attempt's limit and compiles it once per page and limit.
  function compile(id, pages) {
    const key = id + "/" + pages;
    let p = modules.get(key);
    if (!p) {
      p = (async () => {
        const resp = await fetch(server + "/modules/" + encodeURIComponent(id));
        if (!resp.ok) throw new Error(`fetch module ${id}: HTTP ${resp.status}`);
        const bytes = await resp.arrayBuffer();
        const digest = hex(await crypto.subtle.digest("SHA-256", bytes));
        if ("sha256:" + digest !== id) throw new Error(`module ${id}: its bytes hash to sha256:${digest}`);
        return WebAssembly.compile(limitMemory(new Uint8Array(bytes), pages));
      })();
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
    w.postMessage(Object.assign({ type: "run" }, params));
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
