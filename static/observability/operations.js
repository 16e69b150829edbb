// The operations page: charts of the last hour from the service's own rolling store, refreshed
// every ten seconds, and the workers and queues now. Everything shown is set as text, never HTML.
(function () {
  "use strict";
  const root = document.getElementById("operations");
  if (!root) return;
  const source = root.dataset.source;
  const status = document.getElementById("ops-status");
  const palette = ["#2563eb", "#dc2626", "#16a34a", "#d97706", "#7c3aed", "#0891b2", "#be185d", "#4b5563"];
  const charts = {};

  function columns(series, chart) {
    const x = series.minutes;
    if (chart === "ttft") {
      const names = [], data = [x];
      for (const d of series.deployments) {
        names.push(d + " p50", d + " p95");
        data.push(series.ttft_p50[d], series.ttft_p95[d]);
      }
      return { names, data };
    }
    if (chart === "tokens") return { names: ["tokens/s"], data: [x, series.tokens_per_s] };
    const groups = { queue: series.queue_depth, outcomes: series.outcomes, moderation: series.moderation }[chart];
    const names = Object.keys(groups);
    return { names, data: [x, ...names.map((n) => groups[n])] };
  }

  function draw(element, chart, series) {
    const { names, data } = columns(series, chart);
    const key = chart + ":" + names.join("|");
    const existing = charts[chart];
    if (existing && existing.key === key) {
      existing.plot.setData(data);
      return;
    }
    if (existing) existing.plot.destroy();
    element.textContent = "";
    const width = Math.max(320, element.clientWidth || 420);
    const plot = new uPlot(
      {
        width,
        height: 200,
        series: [{}, ...names.map((name, i) => ({ label: name, stroke: palette[i % palette.length], width: 2, spanGaps: false }))],
        axes: [{}, { size: 50 }],
        scales: { x: { time: true } },
      },
      data,
      element,
    );
    charts[chart] = { key, plot };
  }

  function cell(row, text) {
    const td = document.createElement("td");
    td.textContent = text;
    row.appendChild(td);
  }

  function table(bodyId, rows, cells) {
    const body = document.getElementById(bodyId);
    body.textContent = "";
    for (const item of rows) {
      const tr = document.createElement("tr");
      for (const text of cells(item)) cell(tr, String(text));
      body.appendChild(tr);
    }
  }

  async function refresh() {
    try {
      const response = await fetch(source, { credentials: "same-origin", headers: { Accept: "application/json" } });
      if (!response.ok) throw new Error("HTTP " + response.status);
      const data = await response.json();
      for (const element of root.querySelectorAll("[data-chart]")) draw(element, element.dataset.chart, data.series);
      table("ops-workers", data.workers, (w) => [
        w.name,
        w.heartbeat_age_s ?? "",
        Object.entries(w.engines || {}).map(([d, s]) => d + ": " + s).join(", "),
        (w.queues || []).join(", "),
        w.active ?? "",
        w.engine_requests ?? "",
      ]);
      table("ops-queues", data.queues, (q) => [q.deployment, q.priority, q.queued]);
      status.textContent = "Updated " + new Date(data.now * 1000).toLocaleTimeString() + ".";
      root.dataset.loaded = "true";
    } catch (error) {
      status.textContent = "Could not load the figures (" + error.message + "); trying again.";
    }
  }

  refresh();
  setInterval(refresh, 10000);
})();
