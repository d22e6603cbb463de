// The dashboard's chart widget front end (nbtrain/_views/dashboard/static/charts.js) under Node's own test
// runner: the kernel's messages and a saved snapshot in, the SVG it draws out (points, marks, bars, the
// "hello" a new view sends). Node has no DOM: FakeElement below is the little of one charts.js uses.
// Run: node --test tests/js/   (tests/test_charts_js.py runs it in the suite)
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";

const SOURCE = new URL("../../nbtrain/_views/dashboard/static/charts.js", import.meta.url);

class FakeElement {
  constructor(tag) {
    this.tag = tag; this.attrs = {}; this.children = []; this.dataset = {}; this.textContent = "";
    this.className = ""; this.innerHTML = ""; this.listeners = {}; this.disabled = false;
  }
  setAttribute(key, value) { this.attrs[key] = String(value); }
  appendChild(child) { this.children.push(child); return child; }
  append(...children) { this.children.push(...children); }
  replaceChildren(...children) { this.children = children; }
  addEventListener(kind, fn) { this.listeners[kind] = fn; }
  click() { this.listeners.click?.(); }
  all(tag) {  // every element below this one with ``tag``, in document order
    return this.children.flatMap((child) => [...(child.tag === tag ? [child] : []), ...child.all(tag)]);
  }
}

globalThis.document = {
  createElementNS: (_ns, tag) => new FakeElement(tag),
  createElement: (tag) => new FakeElement(tag),
};
globalThis.window = { requestAnimationFrame: (fn) => fn() };  // draw at once: the test reads what it drew

const charts = (await import("data:text/javascript," + encodeURIComponent(readFileSync(SOURCE, "utf8")))).default;

/** An anywidget model as charts.js uses it: traits by name, change and custom-message listeners, sent messages. */
class FakeModel {
  constructor(traits) { this.traits = { charts: [], html: "", actions: [], snapshot: null, snapshot_index: [], ...traits };
    this.handlers = {}; this.sent = []; }
  get(name) { return this.traits[name]; }
  set(name, value) { this.traits[name] = value; this.handlers[`change:${name}`]?.(); }
  on(event, fn) { this.handlers[event] = fn; }
  off(event) { delete this.handlers[event]; }
  send(message) { this.sent.push(message); }
  custom(message, buffers) { this.handlers["msg:custom"](message, buffers); }
}

const f64 = (values) => new DataView(Float64Array.from(values).buffer);
const lossChart = (marks = []) => ({ id: "loss", title: "loss", kind: "lines", xlabel: "step", marks,
  traces: [{ name: "rank 0", color: "#1f77b4" }, { name: "rank 1", color: "#ff7f0e" }] });

function show(model) {
  const el = new FakeElement("div");
  const dispose = charts.render({ model, el });
  return { el, dispose, svg: (id) => el.all("svg").find((svg) => svg.dataset.chart === id) };
}

function pathPoints(svg, trace) {
  const path = svg.all("path").find((p) => p.dataset.name === trace);
  return path ? path.attrs.d.split(/[ML]/).filter(Boolean).length : 0;
}

test("a new view says hello and waits for its first rows", () => {
  const model = new FakeModel({ charts: [lossChart()] });
  const { svg } = show(model);
  assert.deepEqual(model.sent, [{ kind: "hello" }]);
  assert.equal(svg("loss").dataset.points, "0");
  assert.equal(svg("loss").all("text").at(-1).textContent, "waiting for the first rows…");
});

test("points sent whole, then appended, are each rank's line; the last step is said", () => {
  const model = new FakeModel({ charts: [lossChart()] });
  const view = show(model);
  model.custom({ kind: "points", parts: [{ chart: "loss", trace: "rank 0", mode: "replace" },
    { chart: "loss", trace: "rank 1", mode: "replace" }] },
  [f64([1, 2, 3]), f64([3, 2, 1]), f64([1, 2, 3]), f64([4, 3, 2])]);
  assert.equal(pathPoints(view.svg("loss"), "rank 0"), 3);
  model.custom({ kind: "points", parts: [{ chart: "loss", trace: "rank 0", mode: "append" }] },
    [f64([4, 5]), f64([0.5, 0.25])]);
  const svg = view.svg("loss");
  assert.equal(pathPoints(svg, "rank 0"), 5);
  assert.equal(pathPoints(svg, "rank 1"), 3);
  assert.equal(svg.dataset.points, "8");
  assert.equal(svg.dataset.last, "5");
  assert.deepEqual(svg.all("text").filter((t) => t.attrs.class === "nbtrain-legend").map((t) => t.textContent),
    ["rank 0", "rank 1"]);
});

test("a value that is not finite breaks the line instead of drawing it", () => {
  const model = new FakeModel({ charts: [lossChart()] });
  const view = show(model);
  model.custom({ kind: "points", parts: [{ chart: "loss", trace: "rank 0", mode: "replace" }] },
    [f64([1, 2, 3, 4]), f64([1, NaN, 3, 4])]);
  const d = view.svg("loss").all("path").find((p) => p.dataset.name === "rank 0").attrs.d;
  assert.equal((d.match(/M/g) || []).length, 2, d);
  assert.equal((d.match(/L/g) || []).length, 1, d);
});

test("marks inside the steps drawn are lines with their text; one outside is left out", () => {
  const model = new FakeModel({ charts: [lossChart([
    { x: 2, text: "lr 0.1 → 0.01", color: "#d62728" }, { x: 50, text: "beyond", color: "#d62728" }])] });
  const view = show(model);
  model.custom({ kind: "points", parts: [{ chart: "loss", trace: "rank 0", mode: "replace" }] },
    [f64([1, 2, 3]), f64([3, 2, 1])]);
  const svg = view.svg("loss");
  assert.equal(svg.all("line").filter((line) => line.attrs.class === "nbtrain-mark").length, 1);
  assert.ok(svg.all("text").some((t) => t.textContent === "lr 0.1 → 0.01"));
  assert.ok(!svg.all("text").some((t) => t.textContent === "beyond"));
});

test("a trace no chart lists any more is dropped", () => {
  const model = new FakeModel({ charts: [lossChart()] });
  const view = show(model);
  model.custom({ kind: "points", parts: [{ chart: "loss", trace: "rank 1", mode: "replace" }] },
    [f64([1, 2]), f64([1, 2])]);
  model.set("charts", [{ ...lossChart(), traces: [{ name: "rank 0", color: "#1f77b4" }] }]);
  assert.equal(view.svg("loss").dataset.points, "0");
});

test("a saved notebook's snapshot draws with no kernel: float32 x then y per trace", () => {
  const snapshot = Float32Array.from([1, 2, 3, 0.5, 0.25, 0.125, 1, 2, 1, 1]);  // rank 0: 3 points, rank 1: 2
  const model = new FakeModel({ charts: [lossChart()], snapshot: new DataView(snapshot.buffer),
    snapshot_index: [["loss", "rank 0", 3], ["loss", "rank 1", 2]] });
  const svg = show(model).svg("loss");
  assert.equal(pathPoints(svg, "rank 0"), 3);
  assert.equal(pathPoints(svg, "rank 1"), 2);
  assert.equal(svg.dataset.last, "3");
});

test("stacked bars: one bar per category, each part its value", () => {
  const model = new FakeModel({ charts: [{ id: "time", title: "step time", kind: "bars", categories: ["0", "1"],
    traces: [{ name: "data", color: "#aaa", values: [1, 2] }, { name: "compute", color: "#bbb", values: [3, 4] }] }] });
  const svg = show(model).svg("time");
  assert.deepEqual(svg.all("rect").filter((r) => r.attrs.class === "nbtrain-bar").map((r) => r.dataset.value),
    ["1", "3", "2", "4"]);
});

test("where it is shown alone, the kernel's buttons send their action once", () => {
  const model = new FakeModel({ charts: [], html: "<b>run</b>", actions: ["Stop"] });
  const { el } = show(model);
  const button = el.all("button")[0];
  assert.equal(button.textContent, "Stop");
  button.click();
  assert.deepEqual(model.sent.at(-1), { kind: "action", name: "Stop" });
  assert.equal(button.disabled, true);
});
