// cyclepool dashboard: the live parts of the server-rendered pages. The
// workflow page follows the API's event stream (/app/api/v1/workflows/{id}/events,
// the same handler as /api/v1/, authenticated by the session cookie) and
// updates the task table, the graph and the totals in place; the modules
// page takes a dropped .wasm; the submit page reads a chosen file into the
// text box.
"use strict";

(function () {
  const wf = document.getElementById("workflow");
  if (wf && wf.dataset.id) live(wf); // (the submit page has a textarea of that id)
  const vol = document.getElementById("volunteers");
  if (vol) volunteers(vol);
  const upload = document.getElementById("upload-form");
  if (upload) dropUpload(upload);
  const wfFile = document.getElementById("wf-file");
  if (wfFile) readWorkflowFile(wfFile);
  const dataDir = document.getElementById("data-dir");
  if (dataDir) directoryUpload(dataDir);
  window.cyclepoolData = { tarOf, uploadDirectory };

  function dur(ms) {
    if (ms < 0) ms = 0;
    if (ms < 1000) return Math.round(ms) + "ms";
    const s = ms / 1000;
    if (s < 60) return s.toFixed(1) + "s";
    if (s < 3600) return Math.floor(s / 60) + "m" + String(Math.floor(s) % 60).padStart(2, "0") + "s";
    return Math.floor(s / 3600) + "h" + String(Math.floor(s / 60) % 60).padStart(2, "0") + "m";
  }

  // summary is dag.go's summary: the colour of a node of several tasks.
  function summary(c, total) {
    const n = (k) => c[k] || 0;
    if (n("failed") + n("upstream_failed") > 0) return "failed";
    if (n("running") > 0) return "running";
    if (n("done") === total) return "done";
    if (n("cancelled") > 0 && n("done") + n("cancelled") === total) return "cancelled";
    if (n("ready") > 0) return "ready";
    if (n("cancelled") > 0) return "cancelled";
    return "blocked";
  }

  function setClass(el, prefix, state) {
    for (const c of Array.from(el.classList)) if (c.startsWith(prefix)) el.classList.remove(c);
    el.classList.add(prefix + state);
  }

  function live(wf) {
    const api = "/app/api/v1/workflows/" + encodeURIComponent(wf.dataset.id);
    const created = Number(wf.dataset.created);
    let finishedAt = Number(wf.dataset.finished) || 0;
    let wfState = wf.dataset.state;
    const app = (window.cyclepoolApp = { events: 0, state: wfState, connected: false, applied: 0 });

    const nodes = new Map();
    for (const g of document.querySelectorAll("#dag .node")) {
      nodes.set(Number(g.id.slice(2)), { el: g, total: Number(g.dataset.total), counts: {} });
    }
    // Every task (the table shows a page of them): name -> {state, node, row}.
    const tasks = new Map();
    const totals = {};
    for (const [name, state, n] of JSON.parse(wf.dataset.tasks || "[]")) {
      const node = nodes.get(n);
      tasks.set(name, { state, node, row: null });
      if (node) node.counts[state] = (node.counts[state] || 0) + 1;
      totals[state] = (totals[state] || 0) + 1;
    }
    const running = new Set();
    for (const tr of document.querySelectorAll("#tasks tbody tr")) {
      const rec = tasks.get(tr.dataset.task);
      if (!rec) continue;
      rec.row = {
        tr, started: Number(tr.dataset.started) || 0, ended: Number(tr.dataset.ended) || 0,
        badge: tr.querySelector(".c-state .badge"), progress: tr.querySelector(".c-progress"),
        attempts: tr.querySelector(".c-attempts"),
        run: tr.querySelector(".c-run"), err: tr.querySelector(".c-err"), files: tr.querySelector(".c-files"),
        worker: tr.querySelector(".c-worker code"), ckpt: tr.querySelector(".c-ckpt"), ckptAge: tr.querySelector(".c-ckpt-age"),
        ckptAt: Number(tr.dataset.ckpt) || 0, cancel: tr.querySelector(".task-cancel"),
      };
      if (rec.state === "running") running.add(rec.row);
    }

    function drawNode(nd) {
      const st = summary(nd.counts, nd.total);
      setClass(nd.el, "st-", st);
      if (nd.total > 1) {
        const done = nd.counts.done || 0;
        const bar = nd.el.querySelector(".bar");
        if (bar) bar.setAttribute("width", String(Math.round((Number(bar.dataset.full) * done) / nd.total)));
        const count = nd.el.querySelector(".count");
        if (count) count.textContent = done + "/" + nd.total + " done";
      }
    }

    function drawTotals() {
      const n = (k) => totals[k] || 0;
      document.getElementById("t-done").textContent = n("done");
      document.getElementById("t-running").textContent = n("running");
      document.getElementById("t-waiting").textContent = n("blocked") + n("ready");
      document.getElementById("t-failed").textContent = n("failed") + n("upstream_failed");
      document.getElementById("t-cancelled").textContent = n("cancelled");
    }

    let refreshTimer = 0;
    function apply(t) {
      const rec = tasks.get(t.name);
      if (!rec) return;
      app.applied++;
      const r = rec.row;
      if (t.state && t.state !== rec.state) {
        const old = rec.state;
        rec.state = t.state;
        totals[old]--;
        totals[t.state] = (totals[t.state] || 0) + 1;
        if (rec.node) {
          rec.node.counts[old]--;
          rec.node.counts[t.state] = (rec.node.counts[t.state] || 0) + 1;
          drawNode(rec.node);
        }
        drawTotals();
        if (r) {
          r.tr.dataset.state = t.state;
          setClass(r.badge, "st-", t.state);
          r.badge.textContent = t.state;
          if (t.state === "running") {
            if (!r.started || r.ended) r.started = Date.now();
            r.ended = 0;
            running.add(r);
          } else {
            running.delete(r);
            if (r.started && !r.ended && t.state !== "ready" && t.state !== "blocked") r.ended = Date.now();
          }
          if (t.state === "done" || t.state === "failed") {
            clearTimeout(refreshTimer);
            refreshTimer = setTimeout(refreshFiles, 800);
          }
        }
      }
      if (!r) return;
      if (typeof t.progress === "number") {
        setClass(r.progress, "p-", String(Math.round((rec.state === "done" ? 1 : t.progress) * 100)));
      }
      if (typeof t.attempts === "number") {
        const max = r.attempts.textContent.split("/")[1];
        r.attempts.textContent = t.attempts + " /" + (max === undefined ? " ?" : max);
      }
      if (typeof t.checkpoints === "number") r.ckpt.textContent = t.checkpoints;
      if (t.checkpoint_at) {
        r.ckptAt = Date.parse(t.checkpoint_at);
        r.ckptAge.textContent = dur(Date.now() - r.ckptAt) + " ago";
      }
      if (typeof t.worker === "string") {
        r.worker.textContent = t.worker ? t.worker.slice(0, 8) + "…" : "—";
        r.worker.title = t.worker;
      }
      if (r.cancel && rec.state !== "blocked" && rec.state !== "ready" && rec.state !== "running") {
        r.cancel.remove();
        r.cancel = null;
      }
      if (typeof t.error === "string") r.err.textContent = t.error;
      if (r.started) r.run.textContent = dur((r.ended || Date.now()) - r.started);
    }

    // refreshFiles reads the status (the API's GET) for what events do
    // not carry: outputs, run times, the log link.
    async function refreshFiles() {
      try {
        const res = await fetch(api, { credentials: "same-origin" });
        if (!res.ok) return;
        const st = await res.json();
        for (const t of st.tasks || []) {
          const rec = tasks.get(t.name);
          const r = rec && rec.row;
          if (!r) continue;
          if (t.started_at) r.started = Date.parse(t.started_at);
          if (t.finished_at) r.ended = Date.parse(t.finished_at);
          if (r.started) r.run.textContent = dur((r.ended || Date.now()) - r.started);
          const want = 2 * (t.outputs || []).length + (t.attempts > 0 ? 1 : 0); // download and view links
          if (r.files.querySelectorAll("a").length === want) continue;
          r.files.textContent = "";
          const base = api + "/tasks/" + encodeURIComponent(t.name);
          if (t.attempts > 0) {
            const a = document.createElement("a");
            a.href = base + "/log"; a.className = "log"; a.target = "_blank"; a.textContent = "log";
            r.files.append(a, " ");
          }
          for (const o of t.outputs || []) {
            const a = document.createElement("a");
            // An output named by an absolute path keeps its leading / escaped.
            a.href = base + "/outputs/" + (o.name.startsWith("/") ? "%2F" : "") +
              o.name.replace(/^\//, "").split("/").map(encodeURIComponent).join("/");
            a.className = "output"; a.dataset.output = o.name; a.download = t.name + "-" + o.name;
            a.textContent = o.name + " ";
            const s = document.createElement("span");
            s.className = "muted"; s.textContent = o.size < 1024 ? o.size + " B" : (o.size / 1024).toFixed(1) + " KiB";
            a.append(s);
            const v = document.createElement("a");
            v.href = "/app/workflows/" + encodeURIComponent(wf.dataset.id) + "/tasks/" + encodeURIComponent(t.name) + "/preview/" +
              o.name.replace(/^\//, "").split("/").map(encodeURIComponent).join("/");
            v.className = "preview small"; v.dataset.preview = o.name; v.textContent = "view";
            r.files.append(a, " ", v, " ");
          }
        }
        if (st.finished_at) finishedAt = Date.parse(st.finished_at);
        app.refreshed = (app.refreshed || 0) + 1;
      } catch (e) {
        console.warn("refresh status:", e);
      }
    }

    // Deleting takes the outputs and logs with it: asked once more.
    document.getElementById("delete-form").addEventListener("submit", (e) => {
      if (!confirm("Delete this workflow with its outputs and logs?")) e.preventDefault();
    });

    function setWorkflow(state) {
      wfState = state;
      app.state = state;
      wf.dataset.state = state;
      const b = document.querySelector("#wf-state .badge");
      setClass(b, "st-", state);
      b.textContent = state;
      if (state !== "running") {
        document.getElementById("cancel-form").classList.add("hidden");
        document.getElementById("delete-form").classList.remove("hidden");
        if (!finishedAt) finishedAt = Date.now();
      }
    }

    const liveEl = document.getElementById("t-live");
    let es = null;
    function connect() {
      es = new EventSource(api + "/events");
      es.addEventListener("open", () => {
        app.connected = true;
        liveEl.textContent = "on";
        liveEl.classList.add("on");
      });
      es.addEventListener("status", (e) => {
        app.events++;
        const st = JSON.parse(e.data);
        for (const t of st.tasks || []) apply(t);
        setWorkflow(st.state);
      });
      es.addEventListener("task", (e) => {
        app.events++;
        apply(JSON.parse(e.data));
      });
      es.addEventListener("workflow", (e) => {
        app.events++;
        const w = JSON.parse(e.data);
        es.close();
        app.connected = false;
        liveEl.textContent = "ended";
        liveEl.classList.remove("on");
        setWorkflow(w.state);
        refreshFiles();
      });
      es.addEventListener("error", () => {
        app.connected = false;
        liveEl.textContent = "reconnecting";
        liveEl.classList.remove("on");
      });
    }
    if (wfState === "running") connect();
    else liveEl.textContent = "ended";

    const makespan = document.getElementById("t-makespan");
    setInterval(() => {
      if (wfState === "running" || finishedAt) makespan.textContent = dur((finishedAt || Date.now()) - created);
      for (const r of running) {
        if (r.started) r.run.textContent = dur(Date.now() - r.started);
        if (r.ckptAt) r.ckptAge.textContent = dur(Date.now() - r.ckptAt) + " ago";
      }
    }, 1000);
  }

  // volunteers polls /app/volunteers.json every few seconds (not while the
  // tab is hidden, never two requests at once) and redraws the counts, the
  // plots and the table in place: one timer, a fixed set of nodes apart
  // from the table's rows, which are replaced.
  function volunteers(root) {
    const src = root.dataset.json;
    const liveEl = document.getElementById("v-live");
    const tbody = document.querySelector("#workers tbody");
    const app = (window.cyclepoolVolunteers = { polls: 0, failures: 0 });
    let timer = 0;
    let busy = false;
    const text = (id, s) => {
      const el = document.getElementById(id);
      if (el) el.textContent = s;
    };
    function plot(id, p) {
      const fig = document.getElementById(id);
      for (const k of ["bars", "line", "area"]) {
        const path = fig.querySelector("path." + k);
        if (path) path.setAttribute("d", p[k] || "");
      }
      fig.querySelector(".ymax").textContent = p.max;
      fig.querySelector(".caption").textContent = p.caption;
    }
    // The labels of the cells, which a phone shows in front of each.
    const labels = Array.from(document.querySelectorAll("#workers thead th"), (th) => th.textContent);
    function cell(tr, cls, ...kids) {
      const td = document.createElement("td");
      if (cls) td.className = cls;
      td.dataset.label = labels[tr.children.length] || "";
      td.append(...kids);
      tr.append(td);
      return td;
    }
    function el(tag, cls, s, title) {
      const e = document.createElement(tag);
      if (cls) e.className = cls;
      if (s !== undefined) e.textContent = s;
      if (title) e.title = title;
      return e;
    }
    function row(w) {
      const tr = document.createElement("tr");
      tr.dataset.worker = w.full_id;
      cell(tr, "", el("code", "", w.id, w.full_id));
      cell(tr, "", w.kind);
      const st = cell(tr, "c-stability", el("span", "stab stab-" + w.stability, w.stability));
      if (w.reasons) st.append(el("div", "muted small reasons", w.reasons));
      cell(tr, "num", String(w.slots));
      cell(tr, "", w.battery);
      cell(tr, "", w.connection);
      cell(tr, "", w.visibility);
      const bar = el("span", "pbar");
      bar.append(el("span", w.jobs_class));
      cell(tr, "c-jobs", bar, " ", el("span", "n", w.jobs));
      cell(tr, "num", String(w.done));
      cell(tr, "num", String(w.lost));
      const cur = cell(tr, "", w.current);
      if (w.paused) cur.append(" ", el("span", "muted", w.paused));
      cell(tr, "", w.since);
      return tr;
    }
    async function poll() {
      timer = 0;
      busy = true;
      try {
        const res = await fetch(src, { credentials: "same-origin", cache: "no-store" });
        if (res.status === 401 || res.redirected) {
          liveEl.textContent = "signed out";
          busy = false;
          return;
        }
        if (!res.ok) throw new Error(res.status + " " + res.statusText);
        const d = await res.json();
        text("v-count", d.count);
        text("v-variance", d.variance);
        text("v-strategy", d.strategy);
        text("v-fairness", d.fairness);
        plot("plot-done", d.done);
        plot("plot-connected", d.connected);
        tbody.replaceChildren(...(d.workers || []).map(row));
        app.polls++;
        liveEl.textContent = "live";
      } catch (e) {
        app.failures++;
        liveEl.textContent = "reconnecting";
      }
      busy = false;
      schedule();
    }
    function schedule() {
      clearTimeout(timer);
      timer = document.hidden ? 0 : setTimeout(poll, 5000);
    }
    document.addEventListener("visibilitychange", () => {
      if (!document.hidden && !timer && !busy) poll();
      else if (document.hidden) {
        clearTimeout(timer);
        timer = 0;
      }
    });
    schedule();
  }

  function dropUpload(form) {
    const zone = document.getElementById("dropzone");
    const input = document.getElementById("module");
    const show = () => {
      if (input.files.length) zone.textContent = input.files[0].name + " (" + input.files[0].size + " bytes): press Upload";
    };
    input.addEventListener("change", show);
    for (const ev of ["dragenter", "dragover"]) {
      zone.addEventListener(ev, (e) => {
        e.preventDefault();
        zone.classList.add("over");
      });
    }
    zone.addEventListener("dragleave", () => zone.classList.remove("over"));
    zone.addEventListener("drop", (e) => {
      e.preventDefault();
      zone.classList.remove("over");
      if (!e.dataTransfer.files.length) return;
      input.files = e.dataTransfer.files;
      show();
      form.requestSubmit();
    });
  }

  // tarOf writes files ([{path, bytes}], paths relative to the directory,
  // slash-separated) as a tar archive the way `cyclepool data push DIR`
  // writes one (client.WriteArchive, docs/DATA.md): entries in byte order
  // of their names, each directory before what it holds, with a trailing
  // slash and mode 0755, files with mode 0644 (a page cannot read
  // permissions), no times or owners. The same tree gets the same id as
  // from the CLI. Names must be ASCII and at most 100 bytes.
  function tarOf(files) {
    const enc = new TextEncoder();
    const entries = new Map(); // name without the trailing slash -> bytes, or null for a directory
    for (const f of files) {
      const parts = f.path.split("/");
      for (let i = 1; i < parts.length; i++) entries.set(parts.slice(0, i).join("/"), null);
      entries.set(f.path, f.bytes);
    }
    const names = [...entries.keys()].sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
    const oct = (v, len) => v.toString(8).padStart(len - 1, "0") + "\0";
    const header = (name, mode, size, type) => {
      const h = new Uint8Array(512);
      const put = (off, str) => h.set(enc.encode(str), off);
      put(0, name); put(100, oct(mode, 8)); put(108, oct(0, 8)); put(116, oct(0, 8));
      put(124, oct(size, 12)); put(136, oct(0, 12)); put(156, type);
      put(257, "ustar\0"); put(263, "00"); put(329, oct(0, 8)); put(337, oct(0, 8));
      h.fill(32, 148, 156);
      let sum = 0;
      for (const b of h) sum += b;
      put(148, sum.toString(8).padStart(6, "0") + "\0 ");
      return h;
    };
    const parts = [];
    for (const n of names) {
      const bytes = entries.get(n), name = bytes ? n : n + "/";
      if (!/^[\x20-\x7e]+$/.test(name) || name.length > 100) {
        throw new Error(`${name}: names must be ASCII and at most 100 bytes here; push this directory with \`cyclepool data push\``);
      }
      if (!bytes) { parts.push(header(name, 0o755, 0, "5")); continue; }
      parts.push(header(name, 0o644, bytes.length, "0"), bytes);
      if (bytes.length % 512) parts.push(new Uint8Array(512 - (bytes.length % 512)));
    }
    parts.push(new Uint8Array(1024));
    return new Blob(parts);
  }

  // uploadDirectory uploads files ([{path, bytes}]) as the archive of a
  // directory called name (POST /api/v1/blobs?archive=1) and says what
  // became of it.
  async function uploadDirectory(name, files) {
    const csrf = document.querySelector("#data-form input[name=csrf]").value;
    const res = await fetch("/app/api/v1/blobs?archive=1&name=" + encodeURIComponent(name), {
      method: "POST", headers: { "X-CSRF-Token": csrf }, body: tarOf(files),
    });
    const body = await res.json().catch(() => ({}));
    if (!res.ok) throw new Error(body.error || res.statusText);
    return body;
  }

  function directoryUpload(input) {
    const status = document.getElementById("data-dir-status");
    input.addEventListener("change", async () => {
      if (!input.files.length) return;
      const top = input.files[0].webkitRelativePath.split("/")[0];
      status.className = "";
      status.textContent = "Reading " + input.files.length + " files…";
      try {
        const files = await Promise.all([...input.files].map(async (f) => ({
          path: f.webkitRelativePath.split("/").slice(1).join("/"),
          bytes: new Uint8Array(await f.arrayBuffer()),
        })));
        status.textContent = "Uploading…";
        const b = await uploadDirectory(top, files);
        status.className = "ok";
        status.textContent = "Uploaded " + top + " as " + b.id + ".";
        setTimeout(() => location.reload(), 1500);
      } catch (err) {
        status.className = "error";
        status.textContent = String(err.message || err);
      }
    });
  }

  function readWorkflowFile(input) {
    input.addEventListener("change", () => {
      const f = input.files[0];
      if (!f) return;
      f.text().then((text) => {
        document.getElementById("workflow").value = text;
        input.value = "";
      });
    });
  }
})();
