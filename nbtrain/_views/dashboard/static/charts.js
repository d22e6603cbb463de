// nbtrain's live charts, as an anywidget front end: SVG line charts of whatever the kernel describes (a run's ranks
// and their mean, a min-max band, the branches a rewind left; a sweep's trials; a comparison's runs), with marks
// (changes, rewinds, resizes, ASHA rungs), and stacked bar charts, drawn by hand (no library, nothing fetched at
// run time). A trace says how it looks (colour, width, opacity, dash), whether it is a sparse series drawn as
// points, and where its line breaks (`breaks`: steps in stretches with no report too wide to cross, found by the
// kernel where the reports are known, so a thinned curve is still joined). The legend sits right of the plot.
// The kernel sends points as increments (binary buffers); a view that opens late says "hello" and is sent every
// trace whole; a finished picture is kept in the model's `snapshot` (float32), so a notebook saved with widget
// state draws it without a kernel.
// This file is a piece, not a module: the kernel joins it with an entry (charts_view.js for the charts widget,
// dashboard.js for the run dashboard) into the one ES module each widget ships (an anywidget's module cannot
// import a sibling file at run time); both draw their charts with mountCharts below.
const SVG = "http://www.w3.org/2000/svg";
const WIDTH = 600, HEIGHT = 280, LEFT = 58, RIGHT = 160, TOP = 30, BOTTOM = 36;
const LEGEND_ROWS = 16, LEGEND_CHARS = 24, DOT = 5;

function node(tag, attrs, parent) {
  const made = document.createElementNS(SVG, tag);
  for (const key in attrs) made.setAttribute(key, attrs[key]);
  if (parent) parent.appendChild(made);
  return made;
}

function ticks(low, high, count) {
  const span = high - low, raw = span / count, power = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 2.5, 5, 10].map((f) => f * power).find((s) => span / s <= count) || 10 * power;
  const out = [];
  for (let v = Math.ceil(low / step) * step; v <= high + step * 1e-9; v += step) out.push(+v.toPrecision(12));
  return out;
}

function label(v) {
  const a = Math.abs(v);
  if (a !== 0 && (a >= 1e6 || a < 1e-3)) return v.toExponential(1);
  return String(+v.toPrecision(4));
}

function floats(view, Type) {  // a DataView from the kernel as a typed array (copied: offsets may not align)
  if (!view) return new Type(0);
  const bytes = view.buffer.slice(view.byteOffset, view.byteOffset + view.byteLength);
  return new Type(bytes);
}

// -------------------------------------------------------------------------------------------- drawing
function extent(traces, store) {
  let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity, points = 0, last = -Infinity;
  for (const trace of traces) {
    const data = store.get(trace.name);
    if (!data) continue;
    points += data.n;
    for (let i = 0; i < data.n; i++) {
      const x = data.x[i], y = data.y[i];
      if (!Number.isFinite(y)) continue;
      if (x < x0) x0 = x;
      if (x > x1) x1 = x;
      if (y < y0) y0 = y;
      if (y > y1) y1 = y;
    }
    if (data.n) last = Math.max(last, data.x[data.n - 1]);
  }
  return { x0, x1, y0, y1, points, last };
}

function frame(svg, x0, x1, y0, y1) {
  const sx = (x) => LEFT + (x - x0) / (x1 - x0) * (WIDTH - LEFT - RIGHT);
  const sy = (y) => HEIGHT - BOTTOM - (y - y0) / (y1 - y0) * (HEIGHT - TOP - BOTTOM);
  node("rect", { x: LEFT, y: TOP, width: WIDTH - LEFT - RIGHT, height: HEIGHT - TOP - BOTTOM,
    class: "nbtrain-chart-box" }, svg);
  for (const t of ticks(y0, y1, 5)) {
    node("line", { x1: LEFT, x2: WIDTH - RIGHT, y1: sy(t), y2: sy(t), class: "nbtrain-chart-grid" }, svg);
    node("text", { x: LEFT - 4, y: sy(t) + 4, "text-anchor": "end" }, svg).textContent = label(t);
  }
  return { sx, sy };
}

// Runs of consecutive points a line joins, as [start, end) index pairs: a run ends at a value that is not finite
// and where a break lies between two points.
function runs(data, breaks) {
  const found = [];
  let start = -1, b = 0, prev = -Infinity;
  for (let i = 0; i < data.n; i++) {
    const x = data.x[i];
    if (!Number.isFinite(data.y[i])) { if (start >= 0) found.push([start, i]); start = -1; continue; }
    while (b < breaks.length && breaks[b] <= prev) b++;
    if (start >= 0 && b < breaks.length && breaks[b] < x) { found.push([start, i]); start = -1; }
    if (start < 0) start = i;
    prev = x;
  }
  if (start >= 0) found.push([start, data.n]);
  return found;
}

function looks(trace) {
  return { stroke: trace.color, "stroke-width": trace.width || 1.5,
    "stroke-opacity": trace.opacity == null ? 1 : trace.opacity, ...(trace.dash ? { "stroke-dasharray": "5,3" } : {}) };
}

// A trace: its line (left open at each break) and a dot for each point standing alone, or for a sparse series a
// dot per point. Dots are one path of zero-length round-capped strokes.
function drawTrace(svg, trace, data, sx, sy) {
  const dots = [];
  let d = "";
  if (trace.points) {
    for (let i = 0; i < data.n; i++) if (Number.isFinite(data.y[i])) dots.push(i);
  } else {
    for (const [start, end] of runs(data, trace.breaks || [])) {
      if (end - start === 1) { dots.push(start); continue; }
      for (let i = start; i < end; i++) d += (i === start ? "M" : "L") + sx(data.x[i]).toFixed(1) + "," + sy(data.y[i]).toFixed(1);
    }
  }
  if (d) {
    const path = node("path", { d, fill: "none", class: "nbtrain-trace", ...looks(trace) }, svg);
    path.dataset.name = trace.name;
    path.dataset.points = String(data.n);
    path.dataset.mode = "lines";
  }
  if (dots.length) {
    const path = node("path", { d: dots.map((i) => "M" + sx(data.x[i]).toFixed(1) + "," + sy(data.y[i]).toFixed(1) + "h0").join(""),
      fill: "none", class: trace.points ? "nbtrain-trace nbtrain-dots" : "nbtrain-dots", "stroke-linecap": "round",
      ...looks(trace), "stroke-width": Math.max(DOT, (trace.width || 1.5) + 2) }, svg);
    path.dataset.name = trace.name;
    path.dataset.points = String(dots.length);
    path.dataset.mode = "points";
  }
}

function lineChart(svg, chart, store) {
  const traces = chart.traces || [];
  const box = extent(traces, store);
  svg.dataset.points = String(box.points);
  svg.dataset.last = box.points ? String(box.last) : "";
  if (!(box.x1 >= box.x0)) {
    node("text", { x: LEFT, y: HEIGHT / 2, class: "nbtrain-chart-empty" }, svg).textContent =
      "waiting for the first rows…";
    return;
  }
  if (box.x1 === box.x0) box.x1 = box.x0 + 1;
  if (box.y1 === box.y0) { box.y0 -= 0.5; box.y1 += 0.5; }
  const pad = (box.y1 - box.y0) * 0.04;
  const { sx, sy } = frame(svg, box.x0, box.x1, box.y0 - pad, box.y1 + pad);
  for (const t of ticks(box.x0, box.x1, 5)) {
    node("text", { x: sx(t), y: HEIGHT - BOTTOM + 14, "text-anchor": "middle" }, svg).textContent = label(t);
  }
  node("text", { x: WIDTH - RIGHT, y: HEIGHT - 6, "text-anchor": "end" }, svg).textContent = chart.xlabel || "step";
  const bandLow = traces.find((t) => t.band === "low"), bandHigh = traces.find((t) => t.band === "high");
  if (bandLow && bandHigh && store.get(bandLow.name) && store.get(bandHigh.name)) {
    const low = store.get(bandLow.name), high = store.get(bandHigh.name);
    const up = [], down = [];
    for (let i = 0; i < high.n; i++) if (Number.isFinite(high.y[i])) up.push(`${sx(high.x[i]).toFixed(1)},${sy(high.y[i]).toFixed(1)}`);
    for (let i = low.n - 1; i >= 0; i--) if (Number.isFinite(low.y[i])) down.push(`${sx(low.x[i]).toFixed(1)},${sy(low.y[i]).toFixed(1)}`);
    if (up.length) node("path", { d: "M" + up.concat(down).join("L") + "Z", fill: bandHigh.color, "fill-opacity": 0.2,
      stroke: "none", class: "nbtrain-band" }, svg);
  }
  for (const trace of traces) {
    const data = store.get(trace.name);
    if (!trace.band && data && data.n) drawTrace(svg, trace, data, sx, sy);
  }
  for (const mark of chart.marks || []) {
    if (mark.x < box.x0 || mark.x > box.x1) continue;
    const x = sx(mark.x);
    const line = node("line", { x1: x, x2: x, y1: TOP, y2: HEIGHT - BOTTOM, stroke: mark.color,
      "stroke-dasharray": mark.dash === "dot" ? "2,2" : "4,3", class: "nbtrain-mark" }, svg);
    line.dataset.kind = mark.kind || "";
    if (mark.text) node("text", { x: x + 3, y: TOP + 10, fill: mark.color, "font-size": 9 }, svg).textContent = mark.text;
  }
  legend(svg, traces.filter((t) => t.band !== "low" && store.get(t.name)));
}

// Right of the plot box, never over a curve: a swatch drawn as the trace looks (a dot for a sparse series) and
// its name (cut short; the whole name as the entry's tooltip).
function legend(svg, traces) {
  const shown = traces.slice(0, LEGEND_ROWS), x = WIDTH - RIGHT + 10;
  shown.forEach((trace, i) => {
    const y = TOP + 8 + 13 * i;
    const entry = node("g", { class: "nbtrain-legend" }, svg);
    entry.dataset.name = trace.name;
    if (trace.points) node("circle", { cx: x + 8, cy: y - 3, r: 2.5, fill: trace.color }, entry);
    else if (trace.values) node("rect", { x, y: y - 8, width: 16, height: 8, fill: trace.color }, entry);
    else node("line", { x1: x, x2: x + 16, y1: y - 3, y2: y - 3, ...looks(trace),
      "stroke-width": Math.min(trace.width || 1.5, 3), "stroke-opacity": Math.max(trace.opacity == null ? 1 : trace.opacity, 0.35) }, entry);
    const text = node("text", { x: x + 20, y, "font-size": 10 }, entry);
    text.textContent = trace.name.length > LEGEND_CHARS ? trace.name.slice(0, LEGEND_CHARS - 1) + "…" : trace.name;
    node("title", {}, entry).textContent = trace.name;
  });
  if (traces.length > shown.length) {
    node("text", { x, y: TOP + 8 + 13 * shown.length, "font-size": 10, class: "nbtrain-legend-more" }, svg)
      .textContent = `and ${traces.length - shown.length} more`;
  }
}

function barChart(svg, chart) {
  const labels = chart.categories || [], traces = chart.traces || [];
  const totals = labels.map((_, i) => traces.reduce((sum, t) => sum + (t.values[i] || 0), 0));
  svg.dataset.points = String(labels.length);
  if (!labels.length) return;
  const top = Math.max(1e-9, ...totals);
  const { sy } = frame(svg, 0, 1, 0, top * 1.05);
  const slot = (WIDTH - LEFT - RIGHT) / labels.length, bar = Math.min(48, slot * 0.7);
  labels.forEach((name, i) => {
    let base = 0;
    const x = LEFT + slot * i + (slot - bar) / 2;
    for (const trace of traces) {
      const v = trace.values[i] || 0;
      node("rect", { x, width: bar, y: sy(base + v), height: Math.max(0, sy(base) - sy(base + v)),
        fill: trace.color, class: "nbtrain-bar" }, svg).dataset.value = String(v);
      base += v;
    }
    node("text", { x: x + bar / 2, y: HEIGHT - BOTTOM + 14, "text-anchor": "middle", "font-size": 10 }, svg)
      .textContent = name;
  });
  legend(svg, traces);
}

// -------------------------------------------------------------------------------------------- the charts of a model
// Draws the charts the model's `charts` trait describes into `root` (a bar chart into `barsRoot`, where the run
// dashboard shows step times under its worker table) and keeps them drawn as points come. The caller routes the
// model's custom messages: `receive` takes the "points" ones (and says whether it did).
function mountCharts(model, root, barsRoot = root) {
  const stores = new Map();  // chart id -> trace name -> {x, y, n}
  let due = false;

  function storeOf(chart) {
    if (!stores.has(chart)) stores.set(chart, new Map());
    return stores.get(chart);
  }

  function put(chart, trace, xs, ys, append) {
    const store = storeOf(chart), old = store.get(trace);
    if (!append || !old) { store.set(trace, { x: Float64Array.from(xs), y: Float64Array.from(ys), n: xs.length }); return; }
    const n = old.n + xs.length;
    if (n > old.x.length) {
      const size = Math.max(n, old.x.length * 2), x = new Float64Array(size), y = new Float64Array(size);
      x.set(old.x.subarray(0, old.n)); y.set(old.y.subarray(0, old.n));
      old.x = x; old.y = y;
    }
    old.x.set(xs, old.n); old.y.set(ys, old.n); old.n = n;
  }

  function loadSnapshot() {
    const index = model.get("snapshot_index") || [];
    if (!index.length) return;
    const all = floats(model.get("snapshot"), Float32Array);
    let at = 0;
    for (const [chart, trace, n] of index) {
      put(chart, trace, all.subarray(at, at + n), all.subarray(at + n, at + 2 * n), false);
      at += 2 * n;
    }
  }

  function draw() {
    due = false;
    root.replaceChildren();
    if (barsRoot !== root) barsRoot.replaceChildren();
    for (const chart of model.get("charts") || []) {
      const svg = node("svg", { width: WIDTH, height: HEIGHT, viewBox: `0 0 ${WIDTH} ${HEIGHT}`,
        class: "nbtrain-chart" });
      svg.dataset.chart = chart.id;
      svg.dataset.kind = chart.kind;
      node("text", { x: LEFT, y: 16, class: "nbtrain-chart-title" }, svg).textContent = chart.title;
      if (chart.kind === "bars") barChart(svg, chart);
      else lineChart(svg, chart, storeOf(chart.id));
      (chart.kind === "bars" ? barsRoot : root).appendChild(svg);
    }
  }

  function later() {
    if (due) return;
    due = true;
    (window.requestAnimationFrame || setTimeout)(draw);
  }

  function receive(msg, buffers) {
    if (!msg || msg.kind !== "points") return false;
    msg.parts.forEach((part, i) => {
      put(part.chart, part.trace, floats(buffers[2 * i], Float64Array), floats(buffers[2 * i + 1], Float64Array),
        part.mode === "append");
    });
    later();
    return true;
  }

  function onCharts() {  // traces no chart lists any more are dropped
    const wanted = new Map((model.get("charts") || []).map((c) => [c.id, new Set((c.traces || []).map((t) => t.name))]));
    for (const [chart, store] of stores) {
      for (const trace of [...store.keys()]) if (!wanted.has(chart) || !wanted.get(chart).has(trace)) store.delete(trace);
    }
    later();
  }

  function onSnapshot() { loadSnapshot(); later(); }

  loadSnapshot();
  model.on("change:charts", onCharts);
  model.on("change:snapshot", onSnapshot);
  draw();
  return {
    receive,
    dispose() {
      model.off("change:charts", onCharts);
      model.off("change:snapshot", onSnapshot);
    },
  };
}
