// The chart widget front end (nbtrain/_views/dashboard/static/charts.js: the run dashboard's, the sweep
// dashboard's and compare()'s live charts) under Node's own test runner: the kernel's messages and a saved
// snapshot in, the SVG it draws out (lines, breaks across gaps, sparse series as points, faded traces, marks,
// the legend beside the plot, bars, the "hello" a new view sends), through the charts widget's own module
// (charts.js joined with charts_view.js, as the kernel joins them). Node has no DOM: tests/js/fake_dom.mjs is the
// little of one the widgets use.
// Run: node --test tests/js/   (tests/test_charts_js.py runs it in the suite)
import { test } from "node:test";
import assert from "node:assert/strict";
import { FakeElement, FakeModel, widgetModule } from "./fake_dom.mjs";

const charts = await widgetModule("charts.js", "charts_view.js");

const f64 = (values) => new DataView(Float64Array.from(values).buffer);
const lossChart = (marks = []) => ({ id: "loss", title: "loss", kind: "lines", xlabel: "step", marks,
  traces: [{ name: "rank 0", color: "#1f77b4" }, { name: "rank 1", color: "#ff7f0e" }] });

function show(model) {
  const el = new FakeElement("div");
  const dispose = charts.render({ model, el });
  return { el, dispose, svg: (id) => el.all("svg").find((svg) => svg.dataset.chart === id) };
}

function pathPoints(svg, trace) {
  const path = svg.all("path").find((p) => p.dataset.name === trace && p.dataset.mode === "lines");
  return path ? path.attrs.d.split(/[ML]/).filter(Boolean).length : 0;
}

const pathOf = (svg, trace, mode) => svg.all("path").find((p) => p.dataset.name === trace && p.dataset.mode === mode);
const moves = (d) => (d.match(/M/g) || []).length;
const legendNames = (svg) => svg.all("g").filter((g) => g.attrs.class === "nbtrain-legend").map((g) => g.dataset.name);

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
  assert.deepEqual(legendNames(svg), ["rank 0", "rank 1"]);
});

test("a value that is not finite breaks the line instead of drawing it", () => {
  const model = new FakeModel({ charts: [lossChart()] });
  const view = show(model);
  model.custom({ kind: "points", parts: [{ chart: "loss", trace: "rank 0", mode: "replace" }] },
    [f64([1, 2, 3, 4]), f64([1, NaN, 3, 4])]);
  const svg = view.svg("loss");
  const d = pathOf(svg, "rank 0", "lines").attrs.d;
  assert.equal(moves(d), 1, d);
  assert.equal((d.match(/L/g) || []).length, 1, d);  // 3 -> 4 joined
  assert.equal(pathOf(svg, "rank 0", "points").dataset.points, "1", "the point alone before the NaN is a dot");
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

test("no line crosses a break the kernel found: each side is drawn, a point left alone is a dot", () => {
  // loss each step 1..5, nothing from 6 to 99, then 100..103 and, after another gap, 200 alone
  const chart = { ...lossChart(), traces: [{ name: "rank 0", color: "#1f77b4", breaks: [52.5, 151.5] }] };
  const model = new FakeModel({ charts: [chart] });
  const view = show(model);
  model.custom({ kind: "points", parts: [{ chart: "loss", trace: "rank 0", mode: "replace" }] },
    [f64([1, 2, 3, 4, 5, 100, 101, 102, 103, 200]), f64([5, 4, 3, 2, 1, 1, 0.9, 0.8, 0.7, 0.5])]);
  const svg = view.svg("loss");
  const line = pathOf(svg, "rank 0", "lines").attrs.d;
  assert.equal(moves(line), 2, line);
  assert.equal(line.split("M")[1].split("L").length, 5, "steps 1..5 joined");
  assert.equal(line.split("M")[2].split("L").length, 4, "steps 100..103 joined");
  const dot = pathOf(svg, "rank 0", "points");
  assert.equal(dot.dataset.points, "1");
  assert.equal(dot.attrs["stroke-linecap"], "round");
  assert.match(dot.attrs.d, /^M[\d.]+,[\d.]+h0$/);
});

test("points thinned far apart with no break between them are still joined", () => {
  const model = new FakeModel({ charts: [lossChart()] });
  const view = show(model);
  model.custom({ kind: "points", parts: [{ chart: "loss", trace: "rank 0", mode: "replace" }] },
    [f64([0, 1000, 1001, 5000, 5001]), f64([1, 2, 1, 2, 1])]);
  assert.equal(moves(pathOf(view.svg("loss"), "rank 0", "lines").attrs.d), 1);
});

test("a sparse series (epoch_loss once an epoch beside loss each step) is dots, never a line", () => {
  const chart = { id: "loss", title: "loss", kind: "lines", xlabel: "step", marks: [], traces: [
    { name: "loss mean", color: "#222222", width: 3 },
    { name: "epoch_loss mean", color: "#ff7f0e", width: 3, points: true }] };
  const model = new FakeModel({ charts: [chart] });
  const view = show(model);
  const steps = Array.from({ length: 300 }, (_, i) => i + 1);
  model.custom({ kind: "points", parts: [{ chart: "loss", trace: "loss mean", mode: "replace" },
    { chart: "loss", trace: "epoch_loss mean", mode: "replace" }] },
  [f64(steps), f64(steps.map((s) => 1 / s)), f64([100, 200, 300]), f64([0.02, 0.01, 0.005])]);
  const svg = view.svg("loss");
  assert.equal(pathOf(svg, "epoch_loss mean", "lines"), undefined, "a line joined the epochs");
  const dots = pathOf(svg, "epoch_loss mean", "points");
  assert.equal(dots.dataset.points, "3");
  assert.equal(moves(dots.attrs.d), 3);
  assert.equal(pathPoints(svg, "loss mean"), 300);
  const entry = svg.all("g").find((g) => g.dataset.name === "epoch_loss mean");
  assert.equal(entry.children[0].tag, "circle", "its legend shows a dot");
});

test("ranks are thin and translucent, the mean thick: as the kernel describes them", () => {
  const chart = { ...lossChart(), traces: [{ name: "loss rank 0", color: "#1f77b4", width: 1, opacity: 0.45 },
    { name: "loss mean", color: "#222222", width: 3 }] };
  const model = new FakeModel({ charts: [chart] });
  const view = show(model);
  model.custom({ kind: "points", parts: [{ chart: "loss", trace: "loss rank 0", mode: "replace" },
    { chart: "loss", trace: "loss mean", mode: "replace" }] }, [f64([1, 2]), f64([2, 1]), f64([1, 2]), f64([2, 1])]);
  const rank = pathOf(view.svg("loss"), "loss rank 0", "lines").attrs, mean = pathOf(view.svg("loss"), "loss mean", "lines").attrs;
  assert.equal(rank["stroke-width"], "1");
  assert.equal(rank["stroke-opacity"], "0.45");
  assert.equal(mean["stroke-width"], "3");
  assert.equal(mean["stroke-opacity"], "1");
});

test("a sweep's trials: stopped ones faded, a failed one dashed, a trial of one report a dot, rungs marked", () => {
  const chart = { id: "trials", title: "loss per training_iteration, every trial", kind: "lines",
    xlabel: "training_iteration",
    marks: [{ x: 1, text: "rung 0", color: "#999999", dash: "dash", kind: "rung" },
      { x: 2, text: "rung 1", color: "#999999", dash: "dash", kind: "rung" },
      { x: 4, text: "rung 2", color: "#999999", dash: "dash", kind: "rung" }],
    traces: [{ name: "trial 0", color: "#1f77b4", width: 2 },
      { name: "trial 1", color: "#ff7f0e", width: 2, opacity: 0.25 },
      { name: "trial 2", color: "#2ca02c", width: 2, opacity: 0.25, dash: true }] };
  const model = new FakeModel({ charts: [chart] });
  const view = show(model);
  model.custom({ kind: "points", parts: ["trial 0", "trial 1", "trial 2"].map((trace) => ({ chart: "trials", trace,
    mode: "replace" })) }, [f64([1, 2, 3]), f64([1, 0.6, 0.4]), f64([1, 2]), f64([2, 1.8]), f64([1]), f64([1.5])]);
  const svg = view.svg("trials");
  assert.equal(pathOf(svg, "trial 0", "lines").attrs["stroke-opacity"], "1");
  assert.equal(pathOf(svg, "trial 1", "lines").attrs["stroke-opacity"], "0.25");
  const failed = pathOf(svg, "trial 2", "points");
  assert.equal(failed.dataset.points, "1", "a trial with one report is a dot");
  assert.equal(failed.attrs["stroke-opacity"], "0.25");
  assert.ok(failed.attrs["stroke-dasharray"]);
  const rungs = svg.all("line").filter((line) => line.attrs.class === "nbtrain-mark");
  assert.deepEqual(rungs.map((line) => line.dataset.kind), ["rung", "rung"], "rung 2 lies past the curves");
  assert.ok(svg.all("text").some((t) => t.textContent === "rung 1"));
  assert.equal(svg.dataset.last, "3");
});

test("the legend sits right of the plot box, cut short past its rows, each name whole in its tooltip", () => {
  const traces = Array.from({ length: 20 }, (_, i) => ({ name: `a rather long trace name number ${i}`, color: "#1f77b4" }));
  const model = new FakeModel({ charts: [{ ...lossChart(), traces }] });
  const view = show(model);
  model.custom({ kind: "points", parts: traces.map((t) => ({ chart: "loss", trace: t.name, mode: "replace" })) },
    traces.flatMap((_, i) => [f64([1, 2]), f64([i, i + 1])]));
  const svg = view.svg("loss");
  const box = svg.all("rect").find((r) => r.attrs.class === "nbtrain-chart-box");
  const right = parseFloat(box.attrs.x) + parseFloat(box.attrs.width);
  const entries = svg.all("g").filter((g) => g.attrs.class === "nbtrain-legend");
  assert.equal(entries.length, 16);
  for (const entry of entries) {
    assert.ok(entry.all("text").every((t) => parseFloat(t.attrs.x) > right), "a legend entry over the curves");
  }
  assert.equal(entries[0].all("text")[0].textContent.length, 24);
  assert.equal(entries[0].all("title")[0].textContent, "a rather long trace name number 0");
  assert.ok(svg.all("text").some((t) => t.textContent === "and 4 more"));
});
