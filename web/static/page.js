// The volunteer page: settings kept in localStorage, device state as the
// page sees it, and the browser worker (Go compiled to WebAssembly, in a
// dedicated Web Worker: worker.js) started and stopped from here.
// window.cyclepool exposes the live state for tests and curious volunteers.
"use strict";
(() => {
  const $ = (id) => document.getElementById(id);
  const body = document.body.dataset;
  const store = {
    get(key, fallback) {
      try { const v = JSON.parse(localStorage.getItem("cyclepool." + key)); return v ?? fallback; } catch { return fallback; }
    },
    set(key, v) { try { localStorage.setItem("cyclepool." + key, JSON.stringify(v)); } catch { /* private mode: not remembered */ } },
  };

  const cores = navigator.hardwareConcurrency || 0;
  const phone = navigator.userAgentData ? navigator.userAgentData.mobile : /Mobi|Android|iPhone|iPad/.test(navigator.userAgent);
  // Defaults protect a phone: half the cores (at most 4 on a phone), only
  // while charging, a 30% battery floor, pause on metered connections.
  const defaults = {
    threads: Math.max(1, Math.min(phone ? 4 : 64, Math.floor((cores || 2) / 2))),
    share: 100, charging: true, floor: 30, metered: true, hidden: phone,
  };
  let settings = Object.assign({}, defaults, store.get("settings", {}));

  let volunteer = store.get("volunteer", "");
  if (!/^[0-9a-f-]{16,64}$/.test(volunteer)) {
    const b = crypto.getRandomValues(new Uint8Array(16));
    volunteer = Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
    store.set("volunteer", volunteer);
  }
  const totals = Object.assign({ done: 0, cpuMs: 0 }, store.get("totals", {}));

  // The worker's identity (its id and reconnect token, from the server) is
  // kept across visits, so that the server knows this browser again: its
  // record and reputation carry over, instead of a new worker every visit.
  // One tab at a time uses it, the one holding this Web Lock for its life;
  // another tab, or a browser without Web Locks, computes as a new worker.
  const identityHeld = new Promise((resolve) => {
    if (!navigator.locks) return resolve(false);
    navigator.locks.request("cyclepool.worker", { ifAvailable: true }, (lock) => {
      resolve(!!lock);
      if (lock) return new Promise(() => {}); // released when the page closes
    }).catch(() => resolve(false));
  });
  let keepIdentity = false;

  // ---- device state as the page sees it; "unknown" when an API is absent ----
  const device = {
    battery: null, charging: "unknown", connection: "unknown", downlink: null, rtt: null, saveData: "unknown",
    online: navigator.onLine ? "yes" : "no", visibility: document.visibilityState || "unknown",
    cores, memoryGiB: navigator.deviceMemory ?? null, userAgent: navigator.userAgent, mobile: phone,
  };
  const readConnection = () => {
    const c = navigator.connection;
    if (!c) return;
    device.connection = c.type || c.effectiveType || "unknown";
    device.downlink = typeof c.downlink === "number" ? c.downlink : null;
    device.rtt = typeof c.rtt === "number" ? c.rtt : null;
    device.saveData = typeof c.saveData === "boolean" ? (c.saveData ? "yes" : "no") : "unknown";
  };
  readConnection();
  if (navigator.connection) navigator.connection.addEventListener("change", () => { readConnection(); deviceChanged(); });
  addEventListener("online", () => { device.online = "yes"; deviceChanged(); });
  addEventListener("offline", () => { device.online = "no"; deviceChanged(); });
  document.addEventListener("visibilitychange", () => { device.visibility = document.visibilityState; deviceChanged(); });
  const batteryReady = (async () => {
    if (typeof navigator.getBattery !== "function") return;
    try {
      const b = await navigator.getBattery();
      const read = () => {
        device.battery = Number.isFinite(b.level) ? b.level : null;
        device.charging = typeof b.charging === "boolean" ? (b.charging ? "yes" : "no") : "unknown";
      };
      read();
      for (const ev of ["levelchange", "chargingchange"]) b.addEventListener?.(ev, () => { read(); deviceChanged(); });
    } catch { /* not allowed here: stays unknown */ }
  })();

  // ---- the worker ----
  let worker = null, stopping = null, status = null;
  const post = (m) => worker && worker.postMessage(m);
  function deviceChanged() { post({ type: "device", device: { ...device } }); render(); }
  setInterval(() => { readConnection(); post({ type: "device", device: { ...device } }); }, 5000);

  async function start() {
    if (worker || !body.workerWasm) return;
    await batteryReady;
    keepIdentity = await identityHeld;
    if (worker) return; // started meanwhile
    const saved = keepIdentity ? store.get("worker", null) : null;
    // The handlers act only while this Web Worker is the page's: one that
    // was stopped may still have events queued, and they must not stop
    // its successor (a change of threads restarts the worker).
    const w = new Worker(body.workerJs, { name: "cyclepool-worker" });
    worker = w;
    w.onmessage = (e) => { if (worker === w) onWorkerMessage(e.data); };
    w.onerror = (e) => { if (worker === w) { setState("The worker failed: " + (e.message || "error")); stopNow(); } };
    worker.postMessage({
      type: "init", wasmExec: body.wasmExec, wasm: body.workerWasm, taskJs: body.taskJs,
      // For tests: how short a module's recent runs must be for its
      // attempts to go in batches (?batch_short_ms=; worker.js).
      batchShortMs: Number(new URLSearchParams(location.search).get("batch_short_ms")) || 0,
      server: location.origin, volunteer, settings: { ...settings }, device: { ...device },
      identity: saved && typeof saved.id === "string" && typeof saved.token === "string" ? saved : null,
    });
    status = { connected: false };
    render();
  }
  function stop() {
    if (!worker || stopping) return stopping;
    post({ type: "stop" });
    stopping = new Promise((resolve) => {
      const t = setTimeout(() => { stopNow(); resolve(); }, 3000);
      stopResolve = () => { clearTimeout(t); stopNow(); resolve(); };
    });
    return stopping;
  }
  let stopResolve = null;
  function stopNow() {
    if (worker) worker.terminate();
    worker = null; stopping = null; status = null; stopResolve = null;
    render();
  }
  let lastDone = 0, lastCpu = 0;
  let statusMessages = 0; // how many status reports the worker sent (a test reads it)
  function onWorkerMessage(m) {
    if (m.type === "status") {
      statusMessages++;
      // The worker counts since it started; the page keeps lifetime totals.
      if (!status || status.since !== m.since) { lastDone = 0; lastCpu = 0; }
      totals.done += Math.max(0, m.done - lastDone); totals.cpuMs += Math.max(0, m.cpuMs - lastCpu);
      lastDone = m.done; lastCpu = m.cpuMs;
      store.set("totals", totals);
      const id = m.identity;
      if (keepIdentity && id && id.id && id.id !== store.get("worker", {})?.id) store.set("worker", { id: id.id, token: id.token });
      status = m;
      render();
    } else if (m.type === "stopped") {
      stopResolve && stopResolve();
    } else if (m.type === "log") {
      console[m.level === "error" ? "error" : "log"]("cyclepool worker:", m.text);
    }
  }

  // ---- rendering ----
  const fmtMs = (ms) => ms < 1000 ? Math.round(ms) + " ms" : ms < 120000 ? (ms / 1000).toFixed(1) + " s" :
    ms < 7200000 ? Math.round(ms / 60000) + " min" : (ms / 3600000).toFixed(1) + " h";
  function setState(s) { if ($("state").textContent !== s) $("state").textContent = s; }
  function render() {
    const running = !!worker;
    const t = $("toggle");
    t.textContent = running ? "Stop" : "Start";
    t.setAttribute("aria-pressed", String(running));
    if (!running) setState("Not computing.");
    else if (status && !status.connected && status.server) {
      setState("Offline: still computing; results are delivered when the connection returns.");
    } else if (!status || !status.connected) setState("Connecting…");
    else if (status.paused) setState("Paused: " + status.pausedBecause + ".");
    else setState(status.running && status.running.length ? "Computing." : "Waiting for work.");
    $("stat-done").textContent = String(totals.done);
    $("stat-cpu").textContent = fmtMs(totals.cpuMs);
    const cur = $("stat-current");
    const rs = (status && status.running) || [];
    if (!rs.length) cur.textContent = "nothing";
    else {
      cur.replaceChildren(...rs.map((r) => {
        const s = document.createElement("span");
        s.className = "task";
        const p = document.createElement("progress");
        p.max = 1; p.value = r.progress || 0;
        // r.task is "<workflow id>/<task name>": the name, then the workflow's short id
        const cut = r.task.lastIndexOf("/");
        const name = cut < 0 ? r.task : r.task.slice(cut + 1) + " (workflow " + r.task.slice(0, Math.min(cut, 8)) + ")";
        p.setAttribute("aria-label", name + " progress");
        s.append(name + " " + Math.round((r.progress || 0) * 100) + "% ", p);
        return s;
      }));
    }
    $("stat-battery").textContent = device.battery == null ? "unknown" :
      Math.round(device.battery * 100) + "%" + (device.charging === "yes" ? ", charging" : device.charging === "no" ? ", on battery" : "");
    const net = [device.online === "no" ? "offline" : device.connection];
    if (device.downlink != null) net.push(device.downlink + " Mb/s");
    if (device.rtt != null) net.push(device.rtt + " ms");
    if (device.saveData === "yes") net.push("data saver");
    $("stat-network").textContent = net.join(", ");
  }

  // ---- settings form ----
  const form = { threads: $("threads"), share: $("share"), floor: $("floor"), charging: $("charging"), metered: $("metered"), hidden: $("hidden") };
  if (cores) form.threads.max = String(cores);
  $("threads-hint").textContent = "Tasks run at once" + (cores ? ` (this device has ${cores} logical cores).` : ".");
  function showSettings() {
    form.threads.value = settings.threads; form.share.value = settings.share; form.floor.value = settings.floor;
    form.charging.checked = settings.charging; form.metered.checked = settings.metered; form.hidden.checked = settings.hidden;
    $("share-out").textContent = settings.share + "%";
  }
  function readSettings() {
    const num = (el, lo, hi, d) => { const v = Math.round(Number(el.value)); return Number.isFinite(v) ? Math.min(hi, Math.max(lo, v)) : d; };
    const threads = num(form.threads, 1, cores || 64, settings.threads);
    const next = {
      threads, share: num(form.share, 10, 100, settings.share), floor: num(form.floor, 0, 100, settings.floor),
      charging: form.charging.checked, metered: form.metered.checked, hidden: form.hidden.checked,
    };
    const restart = worker && next.threads !== settings.threads;
    settings = next;
    store.set("settings", settings);
    $("share-out").textContent = settings.share + "%";
    post({ type: "settings", settings: { ...settings } });
    if (restart) stop().then(start); // the number of slots is fixed per connection
  }
  for (const el of Object.values(form)) el.addEventListener("change", readSettings);
  form.share.addEventListener("input", () => { $("share-out").textContent = form.share.value + "%"; });
  $("toggle").addEventListener("click", () => (worker ? stop() : start()));
  $("volunteer").textContent = volunteer;
  showSettings();
  render();

  window.cyclepool = {
    get status() { return status; }, get device() { return { ...device }; }, get settings() { return { ...settings }; },
    get totals() { return { ...totals }; }, get running() { return !!worker; }, get statusMessages() { return statusMessages; },
    start, stop,
  };
  if (new URLSearchParams(location.search).get("autostart") === "1") start();
})();
