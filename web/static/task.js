// task.js: a task Web Worker. It runs task attempts, one at a time, on the
// browser's own WebAssembly engine with a WASI preview 1 shim written for
// cyclepool (docs/TASK_ABI.md): argv, stdin, stdout, stderr, read-only /in
// and writable /out as in-memory files, the `cyclepool` host functions, and
// deterministic clocks and random numbers that match the headless runner
// (wasmworker/headless/abi.go) value for value, so that a task gives the same
// bytes in Chromium and in wazero. Where wazero's WASI has a quirk that a
// task can observe (poll_oneoff), this shim copies it.
//
// A stuck or cancelled task is ended by terminating this Web Worker; the
// worker script (worker.js) does that. Nothing here needs to be cancelled.
//
// Messages: in {type:"run", list}, a batch of attempts to run one after the
// other, each {attempt, key, module, ahead, reset, args, stdin, inputs,
// restore, seed, limits, ckptMs, share, ctl}; out {type:"progress", attempt, f},
// {type:"checkpoint", attempt, seq, state} (then blocks on ctl until the
// worker answers it), {type:"log", text}, and once the whole batch ran {type:"done", list} with per
// attempt {attempt, reason, message, outputs, log, ms, memoryBytes, ahead}. A Web
// Worker runs many attempts one after the other: it keeps the modules it
// was sent by key (the worker sends a module only the first time, and
// reset empties the collection) and the ctl buffer of its first message.
// ctl: Int32 0 answers a checkpoint (seq × 4 + code: an answer names the
// checkpoint it answers, so a late one wakes no later checkpoint); Float64
// 1 and 2 say which attempt
// runs now (0: none) and since when (performance.timeOrigin-based ms), so
// that the worker enforces wall times and knows where a batch got to
// without a message per attempt; Int32 6 on, one per place in the batch,
// says whether its attempt started (1, set here) or was cancelled or
// taken back for another thread before it did (2, set by the worker,
// which then need not terminate this Web Worker: the attempt is skipped,
// the others go on).
"use strict";

const E = { SUCCESS: 0, ACCES: 2, BADF: 8, BUSY: 10, EXIST: 20, FAULT: 21, INVAL: 28, IO: 29, ISDIR: 31, LOOP: 32, MFILE: 33, NOENT: 44, NOSYS: 52,
  NAMETOOLONG: 37, NOTDIR: 54, NOTEMPTY: 55, NOTSUP: 58, PERM: 63, ROFS: 69, SPIPE: 70, NOTCAPABLE: 76 };
// wazero reports the standard streams of a task as block devices (they
// are not terminals): so does the shim.
const FT = { BLOCK: 1, CHAR: 2, DIR: 3, FILE: 4, LINK: 7 };
const STEP = 1000000n;                       // every clock read advances the clock by 1 ms
const EPOCH_NS = 1700000000n * 1000000000n;  // the wall clock starts at 1 700 000 000 s
const I64 = (v) => BigInt.asIntN(64, v);
const U64 = (v) => BigInt.asUintN(64, v);
const RIGHT_FD_READ = 1n << 1n;
const RIGHT_FD_WRITE = 1n << 6n;
const LOOKUP_FOLLOW = 1;
// newLink is a symbolic link; safeTarget says whether a task may make one
// to target: relative, without "..", so that it leads only down from
// where it is (as the headless runner allows; docs/DATA.md).
function newLink(target, mtime) { return { dir: false, link: true, target, size: enc.encode(target).length, writable: true, mtime }; }
function safeTarget(t) { return t !== "" && !t.startsWith("/") && !t.includes("\\") && !t.includes("\0") && !t.split("/").includes(".."); }
const enc = new TextEncoder(), dec = new TextDecoder();

class ExitSignal { constructor(code) { this.code = code; } }
class StopSignal { constructor(reason, message) { this.reason = reason; this.message = message; } }
class OutOfRange extends Error {}

// now is a clock shared by the worker's and the task's Web Workers (ms).
const now = () => performance.timeOrigin + performance.now();

const modules = new Map(); // key -> {module, imports, ahead: false when it cannot be instantiated ahead}
let ctlBuf = null, ctlNow = null, ctlSkip = null;

// host is the host functions of the attempt that runs now ({wasi,
// cyclepool}), null between attempts. Every instance imports forwarders to
// it rather than one attempt's functions, so that the instance of the next
// attempt can be made ahead of time, after a batch is reported and while
// this Web Worker waits for its next message: an idle task Web Worker
// holds a fresh, untouched instance of the module it ran last (`ahead`),
// and the next attempt of that module starts without instantiating (about
// 0.3 ms of a short attempt's latency, its memory reservation included).
// An instance that was never run is as fresh as a new one; a module whose
// start function calls the host (there is no attempt yet to answer it) is
// not instantiated ahead, nor is one with a start function at all (the
// worker says which: p.ahead), since no wall time limit runs before the
// attempt does.
let host = null;
let ahead = null; // {key, instance}
class Unbound extends Error {}
const HOST_FUNCTIONS = new Set(["progress", "checkpoint_due", "checkpoint", "restore"]);
// CHECKPOINT_ANSWER_MS bounds a task's wait for its checkpoint's answer
// (the Go worker answers within a minute; see checkpoint below).
const CHECKPOINT_ANSWER_MS = 75000;
// The files, directories and links a task may make under /out and in a
// tree of its own: the headless runner's MaxOutEntries and
// MaxScratchEntries (wasmworker/headless).
const MAX_OUT_ENTRIES = 1000, MAX_SCRATCH_ENTRIES = 100000;
// MAX_FDS bounds a task's open descriptors (the standard streams and
// preopens included): one more open fails with EMFILE, as a process past
// its limit of open files does in the headless runner.
const MAX_FDS = 4096;
// ckptSeq numbers this Web Worker's checkpoints, from a random start so
// that an answer meant for another task Web Worker's ctl (an attempt moved
// from one to another) matches none here; below 2^29, so seq × 4 + code
// fits an Int32.
let ckptSeq = 1 + Math.floor(Math.random() * (1 << 27));

// forwarders returns a module's import object: every function it imports
// from wasi_snapshot_preview1 (those the shim lacks answer ENOSYS) and from
// cyclepool (only the four it defines: others fail to link, as before),
// forwarding to the host of the attempt that runs. Nine parameters cover
// every WASI function's.
function forwarders(module) {
  const imports = { wasi_snapshot_preview1: {}, cyclepool: {} };
  for (const imp of WebAssembly.Module.imports(module)) {
    if (imp.kind !== "function") continue;
    const name = imp.name;
    if (imp.module === "wasi_snapshot_preview1") {
      imports.wasi_snapshot_preview1[name] = (a, b, c, d, e, f, g, h, i) => {
        if (!host) throw new Unbound();
        const fn = host.wasi[name];
        return fn ? fn(a, b, c, d, e, f, g, h, i) : E.NOSYS;
      };
    } else if (imp.module === "cyclepool" && HOST_FUNCTIONS.has(name)) {
      imports.cyclepool[name] = (a, b) => {
        if (!host) throw new Unbound();
        return host.cyclepool[name](a, b);
      };
    }
  }
  return imports;
}

// instantiateAhead makes the instance the next attempt of the module with
// key will use, unless it cannot be made ahead.
function instantiateAhead(key) {
  ahead = null;
  const mod = modules.get(key);
  if (!mod || !mod.ahead) return;
  try {
    ahead = { key, instance: new WebAssembly.Instance(mod.module, mod.imports) };
  } catch {
    mod.ahead = false; // its attempts instantiate it themselves and report why it fails, if it does
  }
}

self.onmessage = (e) => {
  const m = e.data;
  if (m.type !== "run") return;
  const dones = [], moved = [];
  let last = null;
  for (let i = 0; i < m.list.length; i++) {
    const p = m.list[i], recv = now();
    if (p.reset) { modules.clear(); ahead = null; }
    if (p.module) modules.set(p.key, { module: p.module, imports: forwarders(p.module), ahead: p.ahead === true });
    const mod = modules.get(p.key);
    p.module = mod.module; p.imports = mod.imports;
    if (p.ctl) { ctlBuf = p.ctl; ctlNow = new Float64Array(ctlBuf, 0, 3); ctlSkip = new Int32Array(ctlBuf, 24); } else p.ctl = ctlBuf;
    ctlNow[2] = recv; ctlNow[1] = p.attempt;
    // Claimed as started, unless the worker cancelled it first (2): then
    // skipped, with nothing to report.
    if (Atomics.compareExchange(ctlSkip, i, 0, 1) !== 0) continue;
    const done = runAttempt(p);
    host = null;
    last = p.key;
    done.attempt = p.attempt;
    // Where the attempt's time went, for the benchmark (docs/BENCHMARKS.md).
    done.t = { posted: m.postedAt, recv, started: done.started, ran: done.ran, sent: 0 };
    // Large buffers move (transferred); small ones are cheaper to copy.
    for (const b of [done.log, ...done.outputs.map((o) => o.data)]) if (b.byteLength >= 65536) moved.push(b.buffer);
    dones.push(done);
  }
  ctlNow[1] = 0;
  const sent = now();
  for (const d of dones) d.t.sent = sent;
  postMessage({ type: "done", list: dones }, moved);
  instantiateAhead(last);
};

// byteCompare orders names by their UTF-8 bytes, as the headless runner does.
function byteCompare(a, b) {
  const x = enc.encode(a), y = enc.encode(b);
  for (let i = 0; i < Math.min(x.length, y.length); i++) if (x[i] !== y[i]) return x[i] - y[i];
  return x.length - y.length;
}

function newDir(writable, mtime) { return { dir: true, entries: new Map(), writable, mtime }; }

// setupTree builds the tree of a task with a setup (docs/DATA.md) as the
// headless runner lays it out: the files of the setup by path (a mount
// inside another after it), upstream outputs at their paths, in/ and out/
// as entries of the root, and the working directory. Read-only blobs and
// trees are pinned: they and the directories holding them cannot be
// removed or renamed. A read-only archive is preopened as a tree of its
// own unless something is mounted inside it, it is the root, or it is
// writable (then the task's tree holds a private copy).
function setupTree(su, inputs, inDir, outDir) {
  const root = newDir(true, EPOCH_NS);
  const dirAt = (path) => {
    let d = root;
    for (const s of path.split("/").filter(Boolean)) {
      let n = d.entries.get(s);
      if (!n || !n.dir) { n = newDir(true, EPOCH_NS); d.entries.set(s, n); }
      d = n;
    }
    return d;
  };
  const pin = (path) => { // the node at path and every directory above it
    let d = root;
    for (const s of path.split("/").filter(Boolean)) { d = d.entries.get(s); if (!d) return; d.pinned = true; }
  };
  const place = (path, node) => { const i = path.lastIndexOf("/"); dirAt(path.slice(0, i)).entries.set(path.slice(i + 1), node); };
  const roTrees = [], files = [...su.files].sort((a, b) => byteCompare(a.path, b.path));
  files.forEach((f, k) => {
    if (f.path.startsWith("/in/") && f.bytes !== undefined) { // an input uploaded over HTTP
      inDir.entries.set(f.path.slice(4), newFile(f.bytes, false, EPOCH_NS));
      return;
    }
    if (f.archive) {
      const inside = files.slice(k + 1).some((g) => g.path.startsWith(f.path === "/" ? "/" : f.path + "/"));
      const writable = f.writable || f.path === "/" || inside;
      const t = untar(f.bytes, writable);
      if (f.path === "/") { for (const [name, n] of t.entries) if (name !== "in" && name !== "out") root.entries.set(name, n); return; }
      if (writable) { const d = dirAt(f.path); for (const [name, n] of t.entries) d.entries.set(name, n); return; }
      place(f.path, t); pin(f.path); roTrees.push({ path: f.path, node: t });
    } else if (f.bytes === undefined) {
      place(f.path, newFile(enc.encode(f.data), true, EPOCH_NS));
    } else if (f.writable) {
      place(f.path, newFile(f.bytes.slice(), true, EPOCH_NS));
    } else {
      place(f.path, newFile(f.bytes, false, EPOCH_NS)); pin(f.path);
    }
  });
  for (const { name, data } of inputs) if (name.startsWith("/")) place(name, newFile(data.slice(), true, EPOCH_NS));
  root.entries.set("in", inDir); root.entries.set("out", outDir);
  const cwd = su.cwd || "/";
  dirAt(cwd);
  const env = [...su.env];
  if (!env.some((kv) => kv.startsWith("PWD="))) { env.push("PWD=" + cwd); env.sort(byteCompare); }
  const baseBytes = treeBytes(root, inDir, outDir);
  const scratch = su.scratchBytes > 0 ? su.scratchBytes : 1 << 30;
  return { root, roTrees, env, outputs: su.outputs, baseBytes, scratchLimit: baseBytes + scratch };
}

// treeBytes adds up the writable files' bytes of a tree, /in and /out
// left out.
function treeBytes(d, inDir, outDir) {
  let n = 0;
  for (const c of d.entries.values()) {
    if (c === inDir || c === outDir) continue;
    if (c.dir) n += treeBytes(c, inDir, outDir); else if (c.writable) n += c.size;
  }
  return n;
}

// lookup returns the node at an absolute path of a tree, or undefined.
function lookup(root, path) {
  let n = root;
  for (const s of path.split("/").filter(Boolean)) { if (!n || !n.dir) return undefined; n = n.entries.get(s); }
  return n;
}

// untar reads a tar archive (checked by the server when it was pushed:
// internal/archive) into a directory tree. A symbolic link to a file of the
// archive becomes a second name of that file, as the headless runner's
// hard link; others are left out.
function untar(bytes, writable) {
  const root = newDir(writable, EPOCH_NS);
  const links = [];
  const field = (h, off, len) => { let e = off; while (e < off + len && h[e] !== 0) e++; return dec.decode(h.subarray(off, e)); };
  const octal = (h, off, len) => parseInt(field(h, off, len).trim() || "0", 8);
  let pax = {}, longName = null, longLink = null;
  for (let off = 0; off + 512 <= bytes.length;) {
    const h = bytes.subarray(off, off + 512);
    if (h.every((b) => b === 0)) break;
    const size = octal(h, 124, 12), type = String.fromCharCode(h[156] || 48);
    const body = bytes.subarray(off + 512, off + 512 + size);
    off += 512 + Math.ceil(size / 512) * 512;
    if (type === "x") {
      for (const rec of dec.decode(body).split("\n")) {
        const m = /^\d+ ([^=]+)=(.*)$/s.exec(rec);
        if (m) pax[m[1]] = m[2];
      }
      continue;
    }
    if (type === "g") continue;
    if (type === "L") { longName = field(body, 0, body.length); continue; }
    if (type === "K") { longLink = field(body, 0, body.length); continue; }
    let name = pax.path || longName || (field(h, 345, 155) ? field(h, 345, 155) + "/" : "") + field(h, 0, 100);
    const link = pax.linkpath || longLink || field(h, 157, 100);
    pax = {}; longName = null; longLink = null;
    const parts = name.split("/").filter((s) => s && s !== ".");
    if (!parts.length) continue;
    let d = root;
    for (const s of parts.slice(0, -1)) {
      let n = d.entries.get(s);
      if (!n) { n = newDir(writable, EPOCH_NS); d.entries.set(s, n); }
      d = n;
    }
    const last = parts[parts.length - 1];
    if (type === "5") { if (!d.entries.has(last)) d.entries.set(last, newDir(writable, EPOCH_NS)); }
    else if (type === "2") links.push({ dir: parts.slice(0, -1), name: last, parent: d, link });
    else d.entries.set(last, newFile(body.slice(), writable, EPOCH_NS));
  }
  const follow = (dir, link, depth) => {
    const stack = [...dir];
    for (const s of link.split("/")) { if (s === "..") stack.pop(); else if (s && s !== ".") stack.push(s); }
    let n = root;
    for (const s of stack) { if (!n || !n.dir) return null; n = n.entries.get(s); }
    if (!n && depth < 40) { // a link to a link
      const l = links.find((x) => [...x.dir, x.name].join("/") === stack.join("/"));
      if (l) return follow(l.dir, l.link, depth + 1);
    }
    return n && !n.dir ? n : null;
  };
  for (const l of links) { const n = follow(l.dir, l.link, 0); if (n) l.parent.entries.set(l.name, n); }
  return root;
}
function newFile(data, writable, mtime) { return { dir: false, data, size: data.length, writable, mtime }; }

function runAttempt(p) {
  const t0 = performance.now();
  const limits = p.limits;
  // ---- deterministic clock and random source ----
  let clock = 0n; // ns since the attempt started, as the task sees it
  const tickMono = () => (clock = I64(clock + STEP));
  const tickReal = () => { clock = I64(clock + STEP); return U64(EPOCH_NS + clock); };
  // taskNow is the time files change at: the task's own wall clock, not
  // advanced (a task's file times are the same on every run).
  const taskNow = () => U64(EPOCH_NS + clock);
  let rngState = U64(BigInt(p.seed));
  const rngBuf = new Uint8Array(8), rngView = new DataView(rngBuf.buffer);
  let rngLeft = 0;
  const rngNext = () => {
    rngState = U64(rngState + 0x9E3779B97F4A7C15n);
    let z = rngState;
    z = U64((z ^ (z >> 30n)) * 0xBF58476D1CE4E5B9n);
    z = U64((z ^ (z >> 27n)) * 0x94D049BB133111EBn);
    return z ^ (z >> 31n);
  };

  // ---- CPU share: sleep for real inside host calls ----
  // Once the task has worked for 100 × share ms or more since its last
  // sleep, it sleeps for as long as keeps it to its share of that time
  // (80 ms after 20 ms at 20%; 400 ms after 100 ms between two calls), so
  // that a task calling the host seldom is held to its share as well.
  const share = Math.min(1, Math.max(0.05, (p.share || 100) / 100));
  let sleeper = null; // made on the first sleep: most attempts run at full share
  let sliceStart = performance.now(), calls = 0, heldMs = 0;
  const throttle = () => {
    const worked = performance.now() - sliceStart;
    if (worked >= 100 * share) {
      if (!sleeper) sleeper = new Int32Array(new SharedArrayBuffer(4));
      Atomics.wait(sleeper, 0, 0, worked * (1 - share) / share);
      const now = performance.now();
      heldMs += now - sliceStart - worked; // the sleep as it was, not as asked
      sliceStart = now;
    }
  };

  // ---- files ----
  const inDir = newDir(false, EPOCH_NS);
  for (const { name, data } of p.inputs) if (!name.startsWith("/")) inDir.entries.set(name, newFile(data, false, EPOCH_NS));
  const outDir = newDir(true, EPOCH_NS);
  const stdin = { kind: "stdin", data: p.stdin, pos: 0, flags: 0 };
  let stdoutParts = [], stdoutSize = 0;
  let logBuf = new Uint8Array(Math.min(limits.logBytes, 4096)), logSize = 0;
  const fds = [stdin, { kind: "stdout", flags: 0 }, { kind: "stderr", flags: 0 }];
  // A task with a setup has a tree of its own, preopened as "/" before the
  // read-only trees it mounts, /in and /out, in the headless runner's order.
  const tree = p.setup ? setupTree(p.setup, p.inputs, inDir, outDir) : null;
  if (tree) {
    fds.push({ kind: "node", node: tree.root, preopen: "/", flags: 0, pos: 0 });
    for (const t of tree.roTrees) fds.push({ kind: "node", node: t.node, preopen: t.path, flags: 0, pos: 0 });
  }
  fds.push({ kind: "node", node: inDir, preopen: "/in", flags: 0, pos: 0 },
    { kind: "node", node: outDir, preopen: "/out", flags: 0, pos: 0 });
  const environ = tree ? tree.env.map((kv) => enc.encode(kv)) : [];

  let memory = null, u8 = new Uint8Array(0), dv = new DataView(new ArrayBuffer(0));
  const view = () => { if (u8.buffer !== memory.buffer) { u8 = new Uint8Array(memory.buffer); dv = new DataView(memory.buffer); } };
  const bytesAt = (ptr, len) => { view(); ptr >>>= 0; len >>>= 0; if (ptr + len > u8.length) throw new OutOfRange(); return u8.subarray(ptr, ptr + len); };
  const str = (ptr, len) => dec.decode(bytesAt(ptr, len).slice());
  const iovecs = (iovs, n) => { view(); const out = []; for (let i = 0; i < n; i++) { const b = (iovs >>> 0) + 8 * i; out.push([dv.getUint32(b, true), dv.getUint32(b + 4, true)]); } return out; };

  // What the task's files may hold, counted as they grow, as the headless
  // runner's outCount does: their bytes within the output limit (and the
  // scratch limit of a tree of its own), and the files, directories and
  // links it makes within as many as the headless runner allows. The count
  // is taken at the first growth, never counts less than the files hold
  // (nothing is taken off when they shrink or go) and is made exact by a
  // recount before it stops the task: the tab's memory stays near what the
  // task may keep, not what it writes (a module with a 1 MiB limit wrote
  // 1.5 GiB before its outputs were measured).
  const roomBytes = limits.outputBytes + (tree ? tree.scratchLimit : 0);
  let held = null, roomNodes = 0; // {bytes, nodes}
  const recount = () => {
    const seen = new Set();
    let bytes = 0, nodes = 0;
    const visit = (n) => {
      if (seen.has(n) || n === inDir) return;
      seen.add(n); nodes++;
      if (n.dir) { for (const c of n.entries.values()) visit(c); } else if (!n.link && n.writable) bytes += n.size;
    };
    visit(outDir);
    if (tree) visit(tree.root);
    for (const d of fds) if (d && d.kind === "node") visit(d.node); // open, perhaps removed
    return { bytes, nodes };
  };
  const counted = () => {
    if (!held) { held = recount(); roomNodes = held.nodes + MAX_OUT_ENTRIES + (tree ? MAX_SCRATCH_ENTRIES : 0); }
    return held;
  };
  const overBytes = () => new StopSignal("limit_output", tree ?
    `output and scratch limits of ${limits.outputBytes} and ${tree.scratchLimit - tree.baseBytes} bytes exceeded: the task's files would add up to more` :
    `output limit of ${limits.outputBytes} bytes exceeded: files under /out would add up to more`);
  // grow accounts for file f growing to end bytes, before it does.
  const grow = (f, end) => {
    const add = end - f.size;
    if (add <= 0) return;
    if (counted().bytes + add > roomBytes) { held = recount(); if (held.bytes + add > roomBytes) throw overBytes(); }
    held.bytes += add;
  };
  // made accounts for a file, directory or link the task makes, before it does.
  const made = () => {
    if (counted().nodes + 1 > roomNodes) {
      held = recount();
      if (held.nodes + 1 > roomNodes) throw new StopSignal("limit_output", tree ?
        `limits of ${MAX_OUT_ENTRIES} files and directories under /out and ${MAX_SCRATCH_ENTRIES} outside it exceeded` :
        `output limit of ${MAX_OUT_ENTRIES} files and directories under /out exceeded`);
    }
    held.nodes++;
  };

  const writeStdout = (b) => {
    if (stdoutSize + b.length > limits.outputBytes) {
      throw new StopSignal("limit_output", `output limit of ${limits.outputBytes} bytes exceeded by stdout`);
    }
    stdoutParts.push(b.slice()); stdoutSize += b.length;
  };
  const writeLog = (b) => {
    const room = limits.logBytes - logSize;
    const k = Math.min(room, b.length);
    if (logSize + k > logBuf.length) { const n = new Uint8Array(Math.min(limits.logBytes, Math.max(logBuf.length * 2, logSize + k))); n.set(logBuf.subarray(0, logSize)); logBuf = n; }
    logBuf.set(b.subarray(0, k), logSize); logSize += k;
    if (k < b.length) throw new StopSignal("limit_log", `log limit of ${limits.logBytes} bytes exceeded (stderr)`);
  };
  const ensure = (f, n) => {
    if (n <= f.data.length) return;
    const d = new Uint8Array(Math.max(n, f.data.length * 2, 64)); d.set(f.data.subarray(0, f.size)); f.data = d;
  };

  // resolve walks path from the directory of fd: {parent, name, node} or an errno.
  // resolve finds path under the directory of fd, following symbolic links
  // on the way (and at the end when follow), and returns the parent, the
  // last name and the node (undefined when absent), or an errno. ".."
  // never leaves the directory of fd; absolute paths are refused (EPERM,
  // as wazero); more than 40 links on the way is a loop (ELOOP).
  const resolve = (fd, path, follow) => {
    const d = fds[fd];
    if (!d || d.kind !== "node") return E.BADF;
    if (!d.node.dir) return E.NOTDIR;
    if (path === "") return E.INVAL;
    if (path.startsWith("/")) return E.PERM;
    // Cleaned as wazero cleans a path: no empty or "." components.
    const clean = (p) => p.split("/").filter((s) => s !== "" && s !== ".");
    const parts = clean(path), stack = [d.node];
    const here = () => { const t = stack[stack.length - 1]; return { parent: t, name: ".", node: t, root: d.node, stack }; };
    let hops = 0;
    for (let i = 0; i < parts.length; ) {
      const last = i === parts.length - 1, s = parts[i], top = stack[stack.length - 1];
      if (s === "..") {
        if (stack.length === 1) return E.PERM;
        stack.pop(); i++;
        continue;
      }
      const n = top.entries.get(s);
      if (n && n.link && (!last || follow)) {
        if (++hops > 40) return E.LOOP;
        parts.splice(i, 1, ...clean(n.target));
        continue;
      }
      if (last) return { parent: top, name: s, node: n, root: d.node, stack };
      if (!n) return E.NOENT;
      if (!n.dir) return E.NOTDIR;
      stack.push(n); i++;
    }
    return here(); // the path names the directory itself (".", "d/..")
  };
  // holds reports whether the directory dir is node or holds it, at any
  // depth (a directory may not move into itself).
  const holds = (dir, node) => {
    if (dir === node) return true;
    for (const c of dir.entries.values()) if (c.dir && holds(c, node)) return true;
    return false;
  };
  // ino numbers nodes in the order the task first sees them, where the
  // headless runner's wazero stats them (its fsView): a stat by path or
  // descriptor, fd_fdstat_get, fd_allocate, fd_fdstat_set_flags on a file,
  // a listing's "." and each entry as the listing reads it ahead.
  const inos = new WeakMap();
  let nextIno = 1n;
  const ino = (n) => { let i = inos.get(n); if (i === undefined) { i = nextIno++; inos.set(n, i); } return i; };
  const nlink = (n) => {
    if (!n.dir) return BigInt(n.nlink || 1);
    let k = 2n;
    for (const c of n.entries.values()) if (c.dir) k++;
    return k;
  };
  const writeFilestat = (buf, n, kind) => {
    view(); const b = buf >>> 0;
    if (b + 64 > u8.length) throw new OutOfRange();
    u8.fill(0, b, b + 64);
    if (!n) { dv.setUint8(b + 16, FT.BLOCK); dv.setBigUint64(b + 24, 1n, true); return; }
    dv.setBigUint64(b + 8, ino(n), true);
    dv.setUint8(b + 16, n.dir ? FT.DIR : n.link ? FT.LINK : FT.FILE);
    dv.setBigUint64(b + 24, nlink(n), true);
    dv.setBigUint64(b + 32, BigInt(n.dir ? 0 : n.size), true);
    dv.setBigUint64(b + 40, n.atime ?? n.mtime, true);
    dv.setBigUint64(b + 48, n.mtime, true);
    dv.setBigUint64(b + 56, n.mtime, true);
  };
  // times applies fd_filestat_set_times' flags; a *_NOW flag reads the wall
  // clock once, which advances the deterministic clock (as in wazero).
  const times = (n, atim, mtim, fl) => {
    const ATIM = 1, ATIM_NOW = 2, MTIM = 4, MTIM_NOW = 8;
    if ((fl & ATIM && fl & ATIM_NOW) || (fl & MTIM && fl & MTIM_NOW)) return E.INVAL;
    let now = null;
    if (fl & (ATIM_NOW | MTIM_NOW)) now = tickReal();
    if (!n.writable) return E.ROFS;
    if (fl & ~15) return E.INVAL;
    if (fl & ATIM) n.atime = U64(atim); else if (fl & ATIM_NOW) n.atime = now;
    if (fl & MTIM) n.mtime = U64(mtim); else if (fl & MTIM_NOW) n.mtime = now;
    return E.SUCCESS;
  };
  // newFd gives d the lowest free descriptor, or -1 when MAX_FDS are open.
  const newFd = (d) => { let i = 3; while (fds[i]) i++; if (i >= MAX_FDS) return -1; fds[i] = d; return i; };

  const wasi = {
    args_sizes_get(argc, bufSize) {
      view(); const argv = ["task", ...p.args].map((a) => enc.encode(a));
      dv.setUint32(argc >>> 0, argv.length, true);
      dv.setUint32(bufSize >>> 0, argv.reduce((s, a) => s + a.length + 1, 0), true);
      return 0;
    },
    args_get(argvPtr, buf) {
      view(); let b = buf >>> 0;
      ["task", ...p.args].forEach((a, i) => {
        const x = enc.encode(a);
        dv.setUint32((argvPtr >>> 0) + 4 * i, b, true);
        u8.set(x, b); u8[b + x.length] = 0; b += x.length + 1;
      });
      return 0;
    },
    environ_sizes_get(n, size) {
      view(); dv.setUint32(n >>> 0, environ.length, true);
      dv.setUint32(size >>> 0, environ.reduce((s, kv) => s + kv.length + 1, 0), true);
      return 0;
    },
    environ_get(ptrs, buf) {
      view(); let b = buf >>> 0;
      environ.forEach((kv, i) => {
        dv.setUint32((ptrs >>> 0) + 4 * i, b, true);
        u8.set(kv, b); u8[b + kv.length] = 0; b += kv.length + 1;
      });
      return 0;
    },
    clock_res_get(id, ptr) {
      if (id !== 0 && id !== 1) return E.INVAL;
      view(); dv.setBigUint64(ptr >>> 0, STEP, true); return 0;
    },
    clock_time_get(id, _precision, ptr) {
      if (share < 1 && (++calls & 1023) === 0) throttle();
      let v;
      if (id === 1) v = U64(tickMono());
      else if (id === 0) v = tickReal();
      else return E.INVAL;
      view(); dv.setBigUint64(ptr >>> 0, v, true);
      return 0;
    },
    random_get(buf, len) {
      const out = bytesAt(buf, len);
      for (let i = 0; i < out.length; i++) {
        if (rngLeft === 0) { rngView.setBigUint64(0, rngNext(), true); rngLeft = 8; }
        out[i] = rngBuf[8 - rngLeft]; rngLeft--;
      }
      return 0;
    },
    sched_yield() { return 0; },
    proc_exit(code) { throw new ExitSignal(code >>> 0); },
    proc_raise() { return E.NOSYS; },
    // poll_oneoff copies wazero: every clock subscription is answered at
    // once and the smallest relative timeout is added to the clock; fd_read
    // subscriptions on stdin or on files are ready at once; fd_write ones
    // are ENOTSUP.
    poll_oneoff(inPtr, outPtr, nsubs, neventsPtr) {
      if (share < 1) throttle();
      if (nsubs === 0) return E.INVAL;
      view();
      const inb = inPtr >>> 0, outb = outPtr >>> 0;
      if (inb + nsubs * 48 > u8.length || outb + nsubs * 32 > u8.length) return E.FAULT;
      u8.fill(0, outb, outb + nsubs * 32);
      dv.setUint32(neventsPtr >>> 0, nsubs, true);
      let timeout = (1n << 63n) - 1n, nevents = 0;
      const stdinSubs = [];
      const writeEvent = (i, errno, type) => {
        const o = outb + nevents * 32;
        u8.copyWithin(o, inb + i * 48, inb + i * 48 + 8);
        dv.setUint8(o + 8, errno); dv.setUint8(o + 9, 0); dv.setUint32(o + 10, type, true);
        nevents++;
      };
      for (let i = 0; i < nsubs; i++) {
        const s = inb + i * 48, type = dv.getUint8(s + 8), arg = s + 16;
        if (type === 0) { // clock
          const flags = dv.getUint16(arg + 24, true);
          if (flags === 1) return E.NOTSUP;
          if (flags !== 0) return E.INVAL;
          const t = dv.getBigInt64(arg + 8, true);
          if (t < timeout) timeout = t;
          writeEvent(i, 0, 0);
        } else if (type === 1) { // fd_read
          const fd = dv.getInt32(arg, true);
          if (fd < 0) return E.BADF;
          const d = fds[fd];
          if (!d) writeEvent(i, E.BADF, 1);
          else if (fd !== 0 && d.flags & 4) writeEvent(i, 0, 1);
          else stdinSubs.push(i);
        } else if (type === 2) { // fd_write
          const fd = dv.getInt32(arg, true);
          if (fd < 0) return E.BADF;
          writeEvent(i, fds[fd] ? E.NOTSUP : E.BADF, 2);
        } else return E.INVAL;
      }
      if (nevents === nsubs) { if (timeout > 0n) clock = I64(clock + timeout); return 0; }
      for (const i of stdinSubs) writeEvent(i, 0, 1); // in-memory stdin is always ready
      return 0;
    },
    fd_write(fd, iovs, n, nwritten) {
      const d = fds[fd];
      if (!d) return E.BADF;
      let total = 0;
      for (const [ptr, len] of iovecs(iovs, n)) {
        const b = bytesAt(ptr, len);
        if (d.kind === "stdout") writeStdout(b);
        else if (d.kind === "stderr") writeLog(b);
        else if (d.kind === "node" && !d.node.dir && d.write) {
          const f = d.node, at = d.flags & 1 ? f.size : d.pos;
          grow(f, at + b.length); ensure(f, at + b.length); f.data.set(b, at); f.size = Math.max(f.size, at + b.length); d.pos = at + b.length; f.mtime = taskNow();
        } else return d.kind === "node" && d.node.dir ? E.ISDIR : E.BADF;
        total += len;
      }
      view(); dv.setUint32(nwritten >>> 0, total, true);
      return 0;
    },
    fd_pwrite(fd, iovs, n, offset, nwritten) {
      const d = fds[fd];
      if (!d) return E.BADF;
      if (d.kind !== "node") return E.SPIPE;
      if (d.node.dir) return E.ISDIR;
      if (!d.write) return E.BADF;
      let at = Number(offset), total = 0;
      for (const [ptr, len] of iovecs(iovs, n)) {
        const b = bytesAt(ptr, len), f = d.node;
        grow(f, at + len); ensure(f, at + len); f.data.set(b, at); f.size = Math.max(f.size, at + len); at += len; total += len; f.mtime = taskNow();
      }
      view(); dv.setUint32(nwritten >>> 0, total, true);
      return 0;
    },
    fd_read(fd, iovs, n, nread) {
      const d = fds[fd];
      if (!d) return E.BADF;
      let src, size;
      if (d.kind === "stdin") { src = d.data; size = d.data.length; }
      else if (d.kind === "node") { if (d.node.dir) return E.ISDIR; if (!d.read) return E.BADF; src = d.node.data; size = d.node.size; }
      else return E.BADF;
      let total = 0;
      for (const [ptr, len] of iovecs(iovs, n)) {
        const dst = bytesAt(ptr, len), k = Math.max(0, Math.min(len, size - d.pos));
        dst.set(src.subarray(d.pos, d.pos + k)); d.pos += k; total += k;
        if (k < len) break;
      }
      view(); dv.setUint32(nread >>> 0, total, true);
      return 0;
    },
    fd_pread(fd, iovs, n, offset, nread) {
      const d = fds[fd];
      if (!d) return E.BADF;
      if (d.kind !== "node") return E.SPIPE;
      if (d.node.dir) return E.ISDIR;
      let at = Number(offset), total = 0;
      for (const [ptr, len] of iovecs(iovs, n)) {
        const dst = bytesAt(ptr, len), k = Math.max(0, Math.min(len, d.node.size - at));
        dst.set(d.node.data.subarray(at, at + k)); at += k; total += k;
        if (k < len) break;
      }
      view(); dv.setUint32(nread >>> 0, total, true);
      return 0;
    },
    fd_seek(fd, offset, whence, newOffset) {
      const d = fds[fd];
      if (!d) return E.BADF;
      if (d.kind !== "node") return E.SPIPE;
      if (d.node.dir) return E.ISDIR;
      const base = whence === 0 ? 0 : whence === 1 ? d.pos : whence === 2 ? d.node.size : NaN;
      if (Number.isNaN(base)) return E.INVAL;
      const pos = base + Number(offset);
      if (pos < 0) return E.INVAL;
      d.pos = pos;
      view(); dv.setBigUint64(newOffset >>> 0, BigInt(pos), true);
      return 0;
    },
    fd_tell(fd, ptr) { return wasi.fd_seek(fd, 0n, 1, ptr); },
    fd_close(fd) { if (!fds[fd]) return E.BADF; fds[fd] = undefined; return 0; },
    fd_sync(fd) { return fds[fd] ? 0 : E.BADF; },
    fd_datasync(fd) { return fds[fd] ? 0 : E.BADF; },
    fd_advise(fd, _off, _len, advice) { return !fds[fd] ? E.BADF : advice > 5 ? E.INVAL : 0; },
    fd_allocate(fd, offset, len) {
      const d = fds[fd];
      if (!d) return E.BADF;
      if (d.kind === "node") ino(d.node);
      if (d.kind !== "node" || d.node.dir || !d.write) return E.BADF;
      const end = Number(offset + len);
      if (end > d.node.size) { grow(d.node, end); ensure(d.node, end); d.node.size = end; d.node.mtime = taskNow(); }
      return 0;
    },
    fd_fdstat_get(fd, buf) {
      const d = fds[fd];
      if (!d) return E.BADF;
      if (d.kind === "node") ino(d.node);
      view(); const b = buf >>> 0;
      u8.fill(0, b, b + 24);
      dv.setUint8(b, d.kind === "node" ? (d.node.dir ? FT.DIR : FT.FILE) : FT.BLOCK);
      dv.setUint16(b + 2, d.flags, true);
      dv.setBigUint64(b + 8, 0xFFFFFFFFn, true);
      dv.setBigUint64(b + 16, 0xFFFFFFFFn, true);
      return 0;
    },
    fd_fdstat_set_flags(fd, flags) {
      const d = fds[fd];
      if (!d) return E.BADF;
      if (d.kind === "node" && !d.node.dir) ino(d.node);
      d.flags = flags;
      return 0;
    },
    fd_fdstat_set_rights(fd) { return fds[fd] ? 0 : E.BADF; },
    fd_filestat_get(fd, buf) {
      const d = fds[fd];
      if (!d) return E.BADF;
      writeFilestat(buf, d.kind === "node" ? d.node : null);
      return 0;
    },
    fd_filestat_set_size(fd, size) {
      const d = fds[fd];
      if (!d) return E.BADF;
      if (d.kind !== "node" || d.node.dir) return E.BADF;
      if (!d.node.writable) return E.ROFS;
      const n = Number(size); grow(d.node, n); ensure(d.node, n);
      if (n < d.node.size) d.node.data.fill(0, n, d.node.size);
      d.node.size = n; d.node.mtime = taskNow();
      return 0;
    },
    fd_filestat_set_times(fd, atim, mtim, fl) {
      const d = fds[fd];
      if (!d) return E.BADF;
      if (d.kind !== "node") return E.BADF;
      return times(d.node, atim, mtim, fl);
    },
    fd_prestat_get(fd, buf) {
      const d = fds[fd];
      if (!d || !d.preopen) return E.BADF;
      view(); dv.setUint32(buf >>> 0, 0, true); dv.setUint32((buf >>> 0) + 4, enc.encode(d.preopen).length, true);
      return 0;
    },
    fd_prestat_dir_name(fd, ptr, len) {
      const d = fds[fd];
      if (!d || !d.preopen) return E.BADF;
      const name = enc.encode(d.preopen);
      if (len < name.length) return E.NAMETOOLONG;
      bytesAt(ptr, name.length).set(name);
      return 0;
    },
    // fd_readdir lists in name order, and takes the cookies wazero takes:
    // 0 (reading the directory again), or one within the entries it
    // returned last (its window); any other is ENOENT.
    fd_readdir(fd, buf, bufLen, cookie, bufused) {
      const d = fds[fd];
      if (!d) return E.BADF;
      if (d.kind !== "node" || !d.node.dir) return E.BADF;
      const n = Math.floor((bufLen >>> 0) / 24) + 2, pos = cookie;
      const take = (c, k) => {
        if (k <= 0 || c.eof) return;
        const got = c.names.slice(c.cursor, c.cursor + k);
        for (const [, node] of got) ino(node);
        c.cursor += got.length; c.eof = got.length < k;
        c.cache.push(...got); c.countRead += BigInt(got.length);
      };
      let c = d.dc;
      if (c && pos === 0n) c = null;
      if (!c) {
        if (pos !== 0n) return E.NOENT;
        const names = [...d.node.entries.keys()].sort(byteCompare).map((k) => [k, d.node.entries.get(k)]);
        ino(d.node);
        c = d.dc = { names, cursor: 0, countRead: 2n, cache: [[".", d.node], ["..", null]], eof: false };
        take(c, n - 2);
      } else {
        if (pos > c.countRead) return E.NOENT;
        const start = c.countRead - BigInt(c.cache.length);
        if (pos < start) return E.NOENT;
        c.cache = c.cache.slice(Number(pos - start));
        take(c, n - c.cache.length);
      }
      const out = bytesAt(buf, bufLen);
      const hdr = new Uint8Array(24), hv = new DataView(hdr.buffer);
      let w = 0;
      for (let i = 0; i < Math.min(n, c.cache.length) && w < out.length; i++) {
        const [k, node] = c.cache[i], name = enc.encode(k);
        hv.setBigUint64(0, pos + BigInt(i + 1), true);
        hv.setBigUint64(8, node ? ino(node) : 0n, true); // ".." is 0, as in wazero
        hv.setUint32(16, name.length, true);
        hv.setUint8(20, !node || node.dir ? FT.DIR : node.link ? FT.LINK : FT.FILE);
        const ent = new Uint8Array(24 + name.length); ent.set(hdr); ent.set(name, 24);
        const k2 = Math.min(ent.length, out.length - w);
        out.set(ent.subarray(0, k2), w); w += k2;
      }
      view(); dv.setUint32(bufused >>> 0, w, true);
      return 0;
    },
    fd_renumber(from, to) {
      if (!fds[from] || !fds[to]) return E.BADF;
      fds[to] = fds[from]; fds[from] = undefined; return 0;
    },
    path_open(dirfd, dirflags, pathPtr, pathLen, oflags, rightsBase, _inh, fdflags, fdOut) {
      const r = resolve(dirfd, str(pathPtr, pathLen), dirflags & LOOKUP_FOLLOW);
      if (typeof r === "number") return r;
      const CREAT = 1, DIRECTORY = 2, EXCL = 4, TRUNC = 8;
      const write = (rightsBase & RIGHT_FD_WRITE) !== 0n || (oflags & TRUNC) !== 0 || (fdflags & 1) !== 0;
      // Read unless opened for writing alone (wazero's O_WRONLY).
      const read = !write || (rightsBase & RIGHT_FD_READ) !== 0n;
      let n = r.node;
      if (n && oflags & CREAT && oflags & EXCL) return E.EXIST;
      if (n && n.link) return E.LOOP; // a link not followed (O_NOFOLLOW)
      if (!n) {
        if (!(oflags & CREAT)) return E.NOENT;
        if (!r.parent.writable) return E.ROFS;
        if (r.name === "." ) return E.ISDIR;
        made();
        n = newFile(new Uint8Array(0), true, taskNow());
        r.parent.entries.set(r.name, n); r.parent.mtime = taskNow();
      }
      if (oflags & DIRECTORY && !n.dir) return E.NOTDIR;
      if (n.dir && write) return E.ISDIR;
      if (!n.dir && write && !n.writable) return E.ROFS;
      if (oflags & TRUNC && !n.dir) { n.size = 0; n.mtime = taskNow(); }
      const fd = newFd({ kind: "node", node: n, pos: 0, flags: fdflags, read, write });
      if (fd < 0) return E.MFILE;
      view(); dv.setUint32(fdOut >>> 0, fd, true);
      return 0;
    },
    path_filestat_get(fd, flags, pathPtr, pathLen, buf) {
      const r = resolve(fd, str(pathPtr, pathLen), flags & LOOKUP_FOLLOW);
      if (typeof r === "number") return r;
      if (!r.node) return E.NOENT;
      writeFilestat(buf, r.node);
      return 0;
    },
    path_filestat_set_times(fd, flags, pathPtr, pathLen, atim, mtim, fl) {
      const r = resolve(fd, str(pathPtr, pathLen), flags & LOOKUP_FOLLOW);
      if (typeof r === "number") return r;
      if (!r.node) {
        // wazero reads the clock before it looks the path up
        const e = times({ writable: false }, atim, mtim, fl);
        return e === E.INVAL ? e : E.NOENT;
      }
      return times(r.node, atim, mtim, fl);
    },
    path_create_directory(fd, pathPtr, pathLen) {
      const r = resolve(fd, str(pathPtr, pathLen));
      if (typeof r === "number") return r;
      if (r.node) return E.EXIST;
      if (!r.parent.writable) return E.ROFS;
      made();
      r.parent.entries.set(r.name, newDir(true, taskNow()));
      return 0;
    },
    path_remove_directory(fd, pathPtr, pathLen) {
      const r = resolve(fd, str(pathPtr, pathLen));
      if (typeof r === "number") return r;
      if (!r.node) return E.NOENT;
      if (!r.node.dir) return E.NOTDIR;
      if ((r.node === r.root || r.name === ".") && r.node.entries.size) return E.NOTEMPTY; // as wazero's host answers
      if (r.node === r.root || r.name === ".") return E.INVAL;
      if (r.node.pinned) return E.PERM;
      if (!r.parent.writable) return E.ROFS;
      if (r.node.entries.size) return E.NOTEMPTY;
      r.parent.entries.delete(r.name);
      return 0;
    },
    path_unlink_file(fd, pathPtr, pathLen) {
      const r = resolve(fd, str(pathPtr, pathLen));
      if (typeof r === "number") return r;
      if (!r.node) return E.NOENT;
      if (r.node.dir) return E.ISDIR;
      if (r.node.pinned) return E.PERM;
      if (!r.parent.writable) return E.ROFS;
      r.parent.entries.delete(r.name);
      if (r.node.nlink > 1) r.node.nlink--;
      return 0;
    },
    path_rename(fd, oldPtr, oldLen, newFdNum, newPtr, newLen) {
      const a = resolve(fd, str(oldPtr, oldLen)), b = resolve(newFdNum, str(newPtr, newLen));
      if (typeof a === "number") return a;
      if (typeof b === "number") return b;
      if (!a.node) return E.NOENT;
      if (a.name === "." || b.name === ".") return E.BUSY;
      if (b.node === a.node) return 0; // the same name, or two names of one file
      if (a.node.dir && holds(a.node, b.parent)) return E.INVAL; // into itself
      if (a.node.pinned || (b.node && b.node.pinned)) return E.PERM;
      if (!a.parent.writable || !b.parent.writable) return E.ROFS;
      if (b.node && b.node.dir && !a.node.dir) return E.ISDIR;
      if (b.node && !b.node.dir && a.node.dir) return E.NOTDIR;
      if (b.node && b.node.dir && b.node.entries.size) return E.NOTEMPTY;
      if (b.node && !b.node.dir && b.node.nlink > 1) b.node.nlink--;
      a.parent.entries.delete(a.name); b.parent.entries.set(b.name, a.node);
      return 0;
    },
    path_symlink(oldPtr, oldLen, fd, newPtr, newLen) {
      const target = str(oldPtr, oldLen), r = resolve(fd, str(newPtr, newLen), 0);
      if (typeof r === "number") return r;
      if (!r.parent.writable) return E.ROFS;
      if (!safeTarget(target)) return E.PERM;
      if (r.node) return E.EXIST;
      made();
      r.parent.entries.set(r.name, newLink(target, taskNow()));
      return 0;
    },
    // A hard link: a second name of the same file (what wazero's host
    // file system does); not of a directory, a mounted blob or across
    // the read-only places.
    path_link(oldFd, flags, oldPtr, oldLen, newFdNum, newPtr, newLen) {
      const a = resolve(oldFd, str(oldPtr, oldLen), flags & LOOKUP_FOLLOW), b = resolve(newFdNum, str(newPtr, newLen), 0);
      if (typeof a === "number") return a;
      if (typeof b === "number") return b;
      if (!a.node) return E.NOENT;
      if (a.node.dir || a.node.pinned) return E.PERM;
      if (b.node) return E.EXIST;
      if (!b.parent.writable) return E.ROFS;
      made();
      b.parent.entries.set(b.name, a.node);
      a.node.nlink = (a.node.nlink || 1) + 1;
      return 0;
    },
    path_readlink(fd, pathPtr, pathLen, buf, bufLen, used) {
      const r = resolve(fd, str(pathPtr, pathLen), 0);
      if (typeof r === "number") return r;
      if (!r.node) return E.NOENT;
      if (!r.node.link) return E.INVAL;
      const t = enc.encode(r.node.target).subarray(0, bufLen >>> 0);
      bytesAt(buf, t.length).set(t);
      view(); dv.setUint32(used >>> 0, t.length, true);
      return 0;
    },
    // A task has no sockets: wazero's answers (EBADF; sock_send looks at
    // its flags before the descriptor).
    sock_accept() { return E.BADF; },
    sock_recv() { return E.BADF; },
    sock_send(_fd, _d, _n, flags) { return flags !== 0 ? E.NOTSUP : E.BADF; },
    sock_shutdown() { return E.BADF; },
  };

  // ---- the cyclepool host functions ----
  const ctl = new Int32Array(p.ctl); // [0]: the last answer, seq × 4 + code
  let lastCkpt = 0, lastProgress = -1, progressAt = 0;
  const cyclepool = {
    progress(f) {
      if (share < 1) throttle();
      if (Number.isNaN(f)) return;
      f = Math.min(1, Math.max(0, f));
      const now = performance.now();
      if (f !== lastProgress && (now - progressAt >= 50 || f === 1)) { postMessage({ type: "progress", attempt: p.attempt, f }); progressAt = now; lastProgress = f; }
    },
    checkpoint_due() {
      if (share < 1) throttle();
      return p.ckptMs > 0 && performance.now() - lastCkpt >= p.ckptMs ? 1 : 0;
    },
    checkpoint(ptr, len) {
      const state = bytesAt(ptr, len).slice();
      const seq = ckptSeq = ckptSeq >= 1 << 28 ? 1 : ckptSeq + 1;
      postMessage({ type: "checkpoint", attempt: p.attempt, seq, state }, [state.buffer]);
      // The worker answers once the server committed it (or refused),
      // within a minute and a little: the Go worker gives up on an
      // acknowledgement after a minute. An answer later than that was
      // lost, and waiting on would block the task for good: it goes on,
      // the checkpoint not saved (nor due again at once), and says so.
      const end = performance.now() + CHECKPOINT_ANSWER_MS;
      let v;
      while ((v = Atomics.load(ctl, 0)) >>> 2 !== seq) {
        const left = end - performance.now();
        if (left <= 0) {
          postMessage({ type: "log", text: `attempt ${p.attempt}: no answer to a checkpoint in ${CHECKPOINT_ANSWER_MS / 1000} s; going on without it` });
          lastCkpt = performance.now();
          return 1;
        }
        Atomics.wait(ctl, 0, v, left);
      }
      // 0: saved; 2: offline, kept by the worker to deliver on reconnecting
      // (not saved yet, so 1 for the task, but not due again at once).
      const code = v & 3;
      if (code === 0 || code === 2) lastCkpt = performance.now();
      return code === 0 ? 0 : 1;
    },
    restore(ptr, cap) {
      const st = p.restore;
      if (!st || st.length === 0) return 0;
      if ((cap >>> 0) >= st.length) bytesAt(ptr, st.length).set(st);
      return st.length;
    },
  };

  // ---- run ----
  const pageLimit = limits.memoryPages * 65536;
  let madeAhead = false; // whether its instance was made ahead of time
  const result = (reason, message) => ({
    type: "done", reason, message, outputs: [], log: logBuf.slice(0, logSize),
    ms: performance.now() - t0, heldMs, memoryBytes: memory ? memory.buffer.byteLength : 0, ahead: madeAhead,
  });
  host = { wasi, cyclepool };
  let instance;
  if (ahead && ahead.key === p.key) {
    instance = ahead.instance;
    ahead = null;
    madeAhead = true;
  } else {
    ahead = null;
    try {
      instance = new WebAssembly.Instance(p.module, p.imports);
    } catch (err) {
      return result("module", "instantiating module: " + err.message);
    }
  }
  memory = instance.exports.memory;
  if (!(memory instanceof WebAssembly.Memory)) return result("module", "the module exports no memory");
  if (typeof instance.exports._start !== "function") return result("module", "the module exports no _start function");
  if (memory.buffer.byteLength > pageLimit) {
    return result("limit_memory", `memory limit exceeded: the module declares ${memory.buffer.byteLength / 65536} pages of memory, the limit is ${limits.memoryPages} pages (64 KiB each)`);
  }
  let exitCode = 0;
  lastCkpt = performance.now();
  const started = now();
  try {
    instance.exports._start();
  } catch (err) {
    if (err instanceof ExitSignal) exitCode = err.code;
    else {
      const grown = memory.buffer.byteLength;
      if (grown > pageLimit) return result("limit_memory", `memory limit exceeded: the module grew its memory to ${grown / 65536} pages, the limit is ${limits.memoryPages} pages (64 KiB each)`);
      if (err instanceof StopSignal) return result(err.reason, err.message);
      if (err instanceof OutOfRange) return result("trap", "trap: a host function was given memory out of bounds\n" + (err.stack || ""));
      return result("trap", "trap: " + (err && err.message) + "\n" + ((err && err.stack) || ""));
    }
  }
  const ran = now();
  if (memory.buffer.byteLength > pageLimit) {
    return result("limit_memory", `memory limit exceeded: the module grew its memory to ${memory.buffer.byteLength / 65536} pages, the limit is ${limits.memoryPages} pages (64 KiB each)`);
  }
  // The module's memory maximum is the limit (worker.js rewrites it), so a
  // refused memory.grow is seen only by the module. A Go task then dies with
  // "out of memory": the reason is still the limit, as in the headless runner.
  if (exitCode !== 0 && /out of memory/.test(dec.decode(logBuf.subarray(0, logSize)))) {
    return result("limit_memory", `memory limit exceeded: the module tried to grow its memory past the limit of ${limits.memoryPages} pages (64 KiB each)`);
  }
  if (exitCode !== 0) {
    const r = result("exit", `exit code ${exitCode}`);
    const text = dec.decode(r.log).replace(/\n+$/, "");
    const last = text.slice(text.lastIndexOf("\n") + 1).trim();
    if (last) r.message += ": " + (last.length > 200 ? last.slice(0, 200) + "…" : last);
    return r;
  }
  // outputs: stdout, then every regular file under /out by name
  const stdout = new Uint8Array(stdoutSize);
  { let o = 0; for (const b of stdoutParts) { stdout.set(b, o); o += b.length; } }
  stdoutParts = null;
  const files = [];
  const walk = (dir, prefix) => {
    for (const [name, n] of dir.entries) {
      if (n.dir) walk(n, prefix + name + "/");
      else if (!n.link) files.push({ name: prefix + name, data: n.data.slice(0, n.size) });
    }
  };
  walk(outDir, "");
  files.sort((a, b) => byteCompare(a.name, b.name));
  let total = stdout.length;
  for (const f of files) {
    if (f.name === "stdout") return result("limit_output", "the task wrote /out/stdout: that output name is reserved for standard output");
    total += f.data.length;
    if (total > limits.outputBytes) {
      return result("limit_output", `output limit of ${limits.outputBytes} bytes exceeded: stdout and files under /out add up to more (at /out/${f.name})`);
    }
  }
  if (tree) {
    // The task's own tree: within its scratch limit, and the files at
    // its output paths are outputs, named by their path.
    const scratch = treeBytes(tree.root, inDir, outDir);
    if (scratch > tree.scratchLimit) {
      return result("limit_output", `scratch limit of ${tree.scratchLimit - tree.baseBytes} bytes exceeded: the task's files outside /out add up to more`);
    }
    for (const path of tree.outputs) {
      const n = lookup(tree.root, path);
      if (!n || n === inDir || n === outDir) continue;
      const add = (node, name) => {
        if (node.dir) { for (const [k, c] of node.entries) add(c, name + "/" + k); return; }
        if (node.pinned || node.link) return; // a mounted blob, a link
        files.push({ name, data: node.data.slice(0, node.size) });
        total += node.size;
      };
      add(n, path);
      if (total > limits.outputBytes) {
        return result("limit_output", `output limit of ${limits.outputBytes} bytes exceeded: stdout, /out and the outputs add up to more (at ${path})`);
      }
    }
    files.sort((a, b) => byteCompare(a.name, b.name));
  }
  const r = result("", "");
  r.started = started; r.ran = ran;
  r.outputs = [{ name: "stdout", data: stdout }, ...files];
  return r;
}
