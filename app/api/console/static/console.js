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
    box.dataset.updated = String(Date.now());
  });
  source.addEventListener("done", () => source.close());
})();

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
