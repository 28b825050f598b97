// Progressive enhancement only: every page works without this file.
"use strict";

// A destructive action asks first: the browser's dialog, then the form goes with
// confirmed=yes (without this script, the server asks on a page of its own).
document.addEventListener("submit", (event) => {
  const form = event.target;
  const question = form instanceof HTMLFormElement ? form.dataset.confirm : undefined;
  if (!question) return;
  if (!window.confirm(question)) {
    event.preventDefault();
    return;
  }
  if (!form.querySelector("input[name=confirmed]")) {
    const yes = document.createElement("input");
    Object.assign(yes, { type: "hidden", name: "confirmed", value: "yes" });
    form.append(yes);
  }
});

// The overview's figures, live (server-sent events).
(function live() {
  const box = document.getElementById("live");
  if (!box || !window.EventSource) return;
  const source = new EventSource(box.dataset.live);
  source.addEventListener("overview", (event) => {
    const figures = JSON.parse(event.data);
    for (const cell of box.querySelectorAll("[data-field]")) {
      const value = figures[cell.dataset.field];
      cell.textContent = value === null || value === undefined ? "–" : value;
    }
    const backends = document.querySelector("#backends tbody");
    if (backends) {
      const entries = Object.entries(figures.backends);
      backends.replaceChildren(...(entries.length ? entries.map(([name, b]) => row([name, b.warm, b.busy, b.starting, b.pools])) : [row(["no live node", "", "", "", ""])]));
    }
    const nodes = document.querySelector("#nodes tbody");
    if (nodes) {
      const shown = figures.nodes.map((n) => row([n.id, `${n.busy} / ${n.slots}`, n.memory_free_mb, n.sandboxes]));
      nodes.replaceChildren(...(shown.length ? shown : [row(["no live node", "", "", ""])]));
    }
    box.dataset.updated = String(Date.now());
  });
  function row(values) {
    const tr = document.createElement("tr");
    for (const v of values) {
      const td = document.createElement("td");
      td.textContent = String(v);
      tr.append(td);
    }
    return tr;
  }
})();

// The usage page's cost chart (Chart.js, served from this server).
window.addEventListener("load", () => {
  const canvas = document.getElementById("cost-chart");
  const data = document.getElementById("chart-data");
  if (!canvas || !data || !window.Chart) return;
  const chart = JSON.parse(data.textContent);
  new window.Chart(canvas, {
    type: "bar",
    data: {
      labels: chart.labels,
      datasets: chart.series.map((s) => ({ label: s.name, data: s.values })),
    },
    options: {
      responsive: true,
      maintainAspectRatio: false,
      animation: false,
      scales: {
        x: { stacked: true },
        y: { stacked: true, beginAtZero: true, ticks: { callback: (v) => Number(v).toPrecision(2) } },
      },
    },
  });
  canvas.dataset.drawn = "true";
});

// A running invocation's page: its status as it changes, the whole page once it ends.
(function watchInvocation() {
  const watch = document.getElementById("watch");
  if (!watch || !window.EventSource) return;
  const source = new EventSource(watch.dataset.live);
  source.addEventListener("invocation", (event) => {
    const figures = JSON.parse(event.data);
    const status = document.getElementById("status");
    status.textContent = figures.status;
    status.className = `status ${figures.status}`;
  });
  source.addEventListener("done", () => {
    source.close();
    window.location.reload();
  });
})();

// A sandbox's page: its state, CPU and memory as they change; the page again when its
// state does (what can be done in it changes with it).
(function watchSandbox() {
  const box = document.getElementById("sandbox-live");
  if (!box || !box.dataset.live || !window.EventSource) return;
  const source = new EventSource(box.dataset.live);
  source.addEventListener("sandbox", (event) => {
    const figures = JSON.parse(event.data);
    if (figures.state !== box.dataset.state) {
      source.close();
      window.location.reload();
      return;
    }
    const memory = document.getElementById("sandbox-memory");
    if (memory && figures.memory_bytes !== null) memory.textContent = `${(figures.memory_bytes / 1e6).toFixed(1)} MB`;
    const cpu = document.getElementById("sandbox-cpu");
    if (cpu && figures.cpu_ms !== null) cpu.textContent = `${(figures.cpu_ms / 1000).toFixed(2)} s`;
    sample(figures);
    box.dataset.updated = String(Date.now());
  });
  source.addEventListener("done", () => source.close());

  // The samples of this page's stream: CPU (cores, from the growth of the CPU time) and
  // memory (MB), plotted as they come; nothing of them is stored.
  let chart = null;
  let last = null;
  function sample(figures) {
    const canvas = document.getElementById("sandbox-chart");
    if (!canvas || !window.Chart || figures.cpu_ms === null) return;
    const now = Date.now();
    if (!chart) {
      chart = new window.Chart(canvas, {
        type: "line",
        data: {
          labels: [],
          datasets: [
            { label: "CPU (cores)", data: [], yAxisID: "cpu", borderColor: "#1d5fbf", pointRadius: 2 },
            { label: "memory (MB)", data: [], yAxisID: "memory", borderColor: "#067647", pointRadius: 2 },
          ],
        },
        options: {
          responsive: true,
          maintainAspectRatio: false,
          animation: false,
          scales: {
            cpu: { position: "left", beginAtZero: true },
            memory: { position: "right", beginAtZero: true, grid: { drawOnChartArea: false } },
          },
        },
      });
    }
    if (last) {
      const cores = (figures.cpu_ms - last.cpu_ms) / Math.max(1, now - last.at);
      chart.data.labels.push(new Date(now).toLocaleTimeString());
      chart.data.datasets[0].data.push(Number(Math.max(0, cores).toFixed(3)));
      const mb = figures.memory_bytes === null ? null : Number((figures.memory_bytes / 1e6).toFixed(1));
      chart.data.datasets[1].data.push(mb);
      if (chart.data.labels.length > 300) {
        chart.data.labels.shift();
        chart.data.datasets.forEach((d) => d.data.shift());
      }
      chart.update();
      canvas.dataset.samples = String(chart.data.labels.length);
    }
    last = { cpu_ms: figures.cpu_ms, at: now };
  }
})();

// A sandbox's CPU per metered interval (stored), as a bar chart.
window.addEventListener("load", () => {
  const canvas = document.getElementById("metered-chart");
  const data = document.getElementById("metered-data");
  if (!canvas || !data || !window.Chart) return;
  const metered = JSON.parse(data.textContent);
  new window.Chart(canvas, {
    type: "bar",
    data: {
      labels: metered.map((m) => m.end),
      datasets: [{ label: "CPU (cores, average)", data: metered.map((m) => m.cores), backgroundColor: "#1d5fbf" }],
    },
    options: { responsive: true, maintainAspectRatio: false, animation: false, scales: { y: { beginAtZero: true } } },
  });
  canvas.dataset.drawn = "true";
});

// A sandbox's file upload: the file is sent as the request's body (a PUT the server
// streams to the sandbox as it arrives, never held whole), with the session's CSRF
// token in a header; the directory's listing is shown again once it is written.
document.addEventListener("submit", async (event) => {
  const form = event.target;
  if (!(form instanceof HTMLFormElement) || !form.dataset.upload) return;
  event.preventDefault();
  const file = form.querySelector("input[type=file]").files[0];
  const status = document.getElementById("upload-status");
  if (!file) return;
  const dir = form.dataset.dir.replace(/\/+$/, "");
  const target = `${form.dataset.upload}?${new URLSearchParams({ path: `${dir}/${file.name}` })}`;
  status.textContent = `uploading ${file.name}…`;
  const token = document.querySelector("meta[name=csrf-token]").content;
  const answer = await fetch(target, {
    method: "PUT",
    body: file,
    headers: { "X-CSRF-Token": token, "Content-Type": "application/octet-stream" },
    credentials: "same-origin",
  });
  if (answer.ok) {
    window.location.reload();
    return;
  }
  let message = `${answer.status}`;
  try {
    message = (await answer.json()).error.message;
  } catch (_) {
    // not JSON: the status is all there is
  }
  status.textContent = `not uploaded: ${message}`;
  status.className = "error";
});

// The overview's history: executions and errors, and latency, per interval.
window.addEventListener("load", () => {
  const data = document.getElementById("history-data");
  const counts = document.getElementById("executions-chart");
  const latency = document.getElementById("latency-chart");
  if (!data || !counts || !latency || !window.Chart) return;
  const past = JSON.parse(data.textContent);
  const options = (stacked) => ({
    responsive: true,
    maintainAspectRatio: false,
    animation: false,
    spanGaps: false,
    scales: { x: { stacked, ticks: { maxTicksLimit: 12 } }, y: { stacked, beginAtZero: true } },
  });
  const ok = past.executions.map((n, i) => n - past.errored[i] - past.failed[i]);
  new window.Chart(counts, {
    type: "bar",
    data: {
      labels: past.labels,
      datasets: [
        { label: "succeeded or open", data: ok, backgroundColor: "#1d5fbf" },
        { label: "failed (the code)", data: past.failed, backgroundColor: "#f79009" },
        { label: "errored (the platform)", data: past.errored, backgroundColor: "#b42318" },
      ],
    },
    options: options(true),
  });
  new window.Chart(latency, {
    type: "line",
    data: {
      labels: past.labels,
      datasets: [
        { label: "p50", data: past.p50_ms, borderColor: "#1d5fbf", pointRadius: 2 },
        { label: "p99", data: past.p99_ms, borderColor: "#b42318", pointRadius: 2 },
      ],
    },
    options: options(false),
  });
  counts.dataset.drawn = "true";
  latency.dataset.drawn = "true";
});

// A sandbox's terminal: xterm.js over the console's WebSocket (binary frames both ways,
// a JSON text frame to resize; the close says how the shell ended).
window.addEventListener("load", () => {
  const box = document.getElementById("terminal");
  const status = document.getElementById("terminal-status");
  if (!box || !window.Terminal || !window.FitAddon || !window.WebSocket) return;
  const term = new window.Terminal({ cursorBlink: true, convertEol: false, fontSize: 14 });
  const fit = new window.FitAddon.FitAddon();
  term.loadAddon(fit);
  term.open(box);
  fit.fit();
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  const url = `${scheme}//${location.host}${box.dataset.terminal}?cols=${term.cols}&rows=${term.rows}`;
  const socket = new WebSocket(url);
  socket.binaryType = "arraybuffer";
  const encoder = new TextEncoder();
  socket.addEventListener("open", () => {
    status.textContent = "connected";
    box.dataset.connected = "true";
    term.focus();
  });
  socket.addEventListener("message", (event) => {
    if (event.data instanceof ArrayBuffer) term.write(new Uint8Array(event.data));
  });
  socket.addEventListener("close", (event) => {
    status.textContent = `closed: ${event.reason || "code " + event.code}`;
    box.dataset.closed = String(event.code);
  });
  term.onData((data) => {
    if (socket.readyState === WebSocket.OPEN) socket.send(encoder.encode(data));
  });
  term.onResize(({ cols, rows }) => {
    if (socket.readyState === WebSocket.OPEN) socket.send(JSON.stringify({ type: "resize", cols, rows }));
  });
  window.addEventListener("resize", () => fit.fit());
});
