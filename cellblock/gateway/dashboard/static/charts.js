// Cellblock's dashboard: the audit's charts of calls and refusals per server over time, drawn by
// the vendored uPlot (static/vendor/README.md) from what /api/audit counted (charts.py). A server's
// name came from the log, hostile: uPlot sets a series' label as text (textContent), and nothing
// here parses HTML or makes a link.
"use strict";

(() => {
  const CHARTS = ["calls", "refusals"];
  // enough for both charts' busiest servers (five each) to differ
  const COLORS = ["#2a6", "#36c", "#d80", "#c33", "#93c", "#0aa", "#a62", "#c3a", "#6a2", "#567"];
  const OTHER = "#888"; // the servers past the busiest, summed
  const HEIGHT = 170;
  const plots = new Map(); // chart -> { plot, key }: kept while its series stay the same

  const { byId } = window.cellblockDom;

  function forget(name) {
    const held = plots.get(name);
    if (held) held.plot.destroy();
    plots.delete(name);
  }

  function options(holder, labels, strokes) {
    const axis = { stroke: "#888", grid: { stroke: "#8883", width: 1 }, ticks: { stroke: "#8883", width: 1 } };
    return {
      width: holder.clientWidth || 600,
      height: HEIGHT,
      scales: { x: { time: true }, y: { range: (u, min, max) => [0, Math.max(1, max)] } },
      axes: [axis, { ...axis, incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 100000] }],
      series: [
        { label: "time" },
        ...labels.map((label, i) => ({
          label,
          stroke: strokes[i],
          width: 2,
          points: { show: false },
          // a bucket's count is drawn flat from its start to its end
          paths: uPlot.paths.stepped({ align: 1 }),
        })),
      ],
    };
  }

  function draw(name, chart, charts, colors) {
    const holder = byId(`chart-${name}`);
    byId(`${name}-caption`).textContent = `${name} per server, per ${charts.per} (${chart.total} in all)`;
    byId(`no-${name}`).hidden = chart.series.length > 0;
    holder.hidden = chart.series.length === 0;
    if (chart.series.length === 0) {
      forget(name);
      return;
    }
    const times = charts.times;
    // one time more, the end of the last bucket, so that the last bucket is drawn as wide as the rest
    const data = [
      [...times, times[times.length - 1] + charts.step],
      ...chart.series.map((item) => [...item.counts, item.counts[item.counts.length - 1]]),
    ];
    const labels = chart.series.map((item) => (item.other ? `(${item.name})` : item.name));
    const strokes = chart.series.map((item) => (item.other ? OTHER : colors.get(item.name)));
    const key = JSON.stringify([labels, strokes]);
    const held = plots.get(name);
    if (held && held.key === key) {
      held.plot.setData(data);
      return;
    }
    forget(name);
    plots.set(name, { plot: new uPlot(options(holder, labels, strokes), data, holder), key });
  }

  function show(charts) {
    // a server has the same colour in both charts: the busiest in calls first
    const colors = new Map();
    for (const name of CHARTS) {
      for (const item of charts[name].series) {
        if (!item.other && !colors.has(item.name)) colors.set(item.name, COLORS[colors.size % COLORS.length]);
      }
    }
    for (const name of CHARTS) draw(name, charts[name], charts, colors);
    byId("charts-note").textContent = charts.unplaced
      ? `${charts.unplaced} call(s) at a time no clock shows (an edited line?), not drawn`
      : "";
  }

  document.addEventListener("cellblock-audit", (event) => {
    if (event.detail && event.detail.charts) show(event.detail.charts);
  });
  window.addEventListener("resize", () => {
    for (const name of CHARTS) {
      const held = plots.get(name);
      if (held) held.plot.setSize({ width: byId(`chart-${name}`).clientWidth, height: HEIGHT });
    }
  });
})();
