// Progressive enhancement only: every page works without this file.
"use strict";

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
      backends.replaceChildren(...(entries.length ? entries.map(([name, b]) => row([name, b.warm, b.pools])) : [row(["no live node", "", ""])]));
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
