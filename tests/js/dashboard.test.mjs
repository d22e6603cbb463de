// The run dashboard's front end (nbtrain/_views/dashboard/static/dashboard.js joined after charts.js, as the
// kernel ships it) under Node's own test runner: the kernel's traits and messages in, the page out (its parts,
// its charts, its log panes), and each click or edit out as the one message the kernel's dispatcher takes.
// Run: node --test tests/js/   (tests/test_charts_js.py runs it in the suite)
import { test } from "node:test";
import assert from "node:assert/strict";
import { FakeElement, FakeModel, widgetModule } from "./fake_dom.mjs";

const dashboard = await widgetModule("charts.js", "dashboard.js");

const CONTROLS = {
  live: true, paused: false, stopped: false, profile_steps: 10, guards: "", pending: {}, handled: [],
  fields: [{ key: "lr", value: "0.1", tooltip: "lr" }, { key: "momentum", value: "0.9", tooltip: "momentum" }],
  rewind: { enabled: true, placeholder: "latest (40)", tooltip: "Every rank back to a restore point in place" },
};

function show(traits = {}) {
  const model = new FakeModel({ header: "", progress: {}, notice: {}, ranks: {}, workers: {}, debug_hint: "",
    log_panes: [], log_snapshot: {}, controls: CONTROLS, answer: "", final: "", ...traits });
  const el = new FakeElement("div");
  const dispose = dashboard.render({ model, el });
  const one = (name) => el.byClass(name)[0];
  const button = (action) => one("nbtrain-controls").find((b) => b.tag === "button" && b.dataset.action === action)[0];
  const field = (key) => one("nbtrain-controls").find((f) => f.classList.contains("nbtrain-field") && f.dataset.key === key)[0];
  return { model, el, dispose, one, button, field, actions: () => model.sent.filter((m) => m.action) };
}

const f64 = (values) => new DataView(Float64Array.from(values).buffer);

test("one root, every part drawn from the kernel's traits, and a hello for the points and logs", () => {
  const { model, one, el } = show({
    header: '<b>run-a</b> <span class="nbtrain-state" data-state="running">running</span>',
    progress: { fraction: 0.25, style: "", label: " 25% · ETA 0:00:30" },
    notice: { text: "restarted <after> a failure", colour: "#ff7f0e" },
    workers: { summary: "", table: '<table class="nbtrain-workers"></table>', pager: null },
    debug_hint: "", final: "" });
  assert.equal(el.children.length, 1);
  assert.equal(el.children[0].className, "nbtrain-dashboard");
  assert.deepEqual(model.sent, [{ kind: "hello" }]);
  assert.match(one("nbtrain-header").innerHTML, /data-state="running"/);
  assert.equal(one("nbtrain-progress-fill").style.width, "25%");
  assert.equal(one("nbtrain-progress-label").innerHTML, " 25% · ETA 0:00:30");
  assert.equal(one("nbtrain-notice-line").textContent, "restarted <after> a failure", "the notice is text, not HTML");
  assert.equal(one("nbtrain-worker-table").innerHTML, '<table class="nbtrain-workers"></table>');
  assert.ok(!one("nbtrain-pager").visible && !one("nbtrain-ranks").visible, "a narrow run: no pager, no ranks box");

  model.set("progress", { fraction: 1, style: "danger", label: " step 50" });
  model.set("final", '<p class="nbtrain-final">Run run-a: failed</p>');
  assert.equal(one("nbtrain-progress").dataset.style, "danger");
  assert.equal(one("nbtrain-progress-fill").style.width, "100%");
  assert.match(one("nbtrain-final-line").innerHTML, /nbtrain-final/);

  model.set("progress", { fraction: null, style: "", label: '<span class="nbtrain-progress-indeterminate"></span>' });
  assert.ok(!one("nbtrain-progress").visible, "no total: the moving stripes in the label instead of a bar");
});

test("the charts are the charts widget's: points as increments, step-time bars under the worker table", () => {
  const { model, one } = show({ charts: [
    { id: "loss", title: "loss", kind: "lines", marks: [], traces: [{ name: "loss mean", color: "#222" }] },
    { id: "step-time", title: "time per step (ms)", kind: "bars", categories: ["rank 0"],
      traces: [{ name: "compute", color: "#1f77b4", values: [12] }] }] });
  model.custom({ kind: "points", parts: [{ chart: "loss", trace: "loss mean", mode: "replace" }] },
    [f64([1, 2, 3]), f64([3, 2, 1])]);
  const lines = one("nbtrain-charts").all("svg");
  assert.deepEqual(lines.map((svg) => svg.dataset.chart), ["loss"]);
  assert.equal(lines[0].dataset.points, "3");
  assert.deepEqual(one("nbtrain-step-times").all("svg").map((svg) => svg.dataset.kind), ["bars"]);
});

test("each control sends the one message shape; a button shows pending until the kernel has it", () => {
  const { model, button, actions } = show();
  button("pause").click();
  assert.equal(actions().at(-1).action, "pause");
  assert.ok(actions().at(-1).id, "each message has an id the kernel lists once handled");
  assert.ok(button("pause").disabled && button("pause").textContent === "Pausing…");
  // a redraw the kernel made before it took the click: still pending here
  model.set("controls", { ...CONTROLS });
  assert.equal(button("pause").textContent, "Pausing…");
  // taken, pending in the kernel until the run pauses
  const id = actions().at(-1).id;
  model.set("controls", { ...CONTROLS, pending: { pause: "" }, handled: [id] });
  assert.equal(button("pause").textContent, "Pausing…");
  model.set("controls", { ...CONTROLS, paused: true, handled: [id] });
  assert.ok(!button("resume").disabled && button("resume").textContent === "Resume");
  button("resume").click();
  assert.equal(actions().at(-1).action, "resume");

  for (const action of ["checkpoint", "stacks", "profile", "stop"]) {
    button(action).click();
    assert.equal(actions().at(-1).action, action);
  }
  assert.equal(button("stop").textContent, "Stopping…");
  assert.equal(button("profile").textContent, "Profiling…");
  model.set("controls", { ...CONTROLS, handled: actions().map((m) => m.id) });
  assert.equal(button("profile").textContent, "Profile 10 steps", "the kernel took it, and its call returned");
});

test("rewind sends its step and skip fields", () => {
  const { el, button, actions } = show();
  el.byClass("nbtrain-rewind-step")[0].value = "40";
  el.byClass("nbtrain-rewind-skip")[0].value = "2";
  button("rewind").click();
  const sent = actions().at(-1);
  assert.deepEqual({ ...sent, id: undefined }, { action: "rewind", step: "40", skip: "2", id: undefined });
  assert.equal(el.byClass("nbtrain-rewind-step")[0].placeholder, "latest (40)");
});

test("a typed setting is never shown as applied: the field keeps the run's value, pending, until the run reports", () => {
  const { model, field, actions } = show();
  const lr = field("lr"), input = lr.all("input")[0];
  assert.equal(input.value, "0.1");
  input.typeIn("0.01");
  assert.deepEqual({ ...actions().at(-1), id: undefined }, { action: "adjust", key: "lr", value: "0.01", id: undefined });
  assert.equal(input.value, "0.1", "the run's value, not the typed one");
  assert.ok(lr.classList.contains("nbtrain-pending"));
  assert.equal(lr.byClass("nbtrain-pending-note")[0].textContent, "→ 0.01 asked…");
  const id = actions().at(-1).id;
  model.set("controls", { ...CONTROLS, pending: { lr: "0.01" }, handled: [id] });
  assert.equal(input.value, "0.1");
  assert.ok(lr.classList.contains("nbtrain-pending"));
  model.set("controls", { ...CONTROLS, fields: [{ key: "lr", value: "0.01", tooltip: "lr" }], handled: [id] });
  assert.equal(input.value, "0.01", "the run reported it");
  assert.ok(!lr.classList.contains("nbtrain-pending"));
  assert.ok(!field("momentum").visible, "a setting the run no longer reports is hidden");
});

test("keys typed in a field stay in it: the notebook does not take them as its shortcuts", () => {
  const { field, el } = show();
  for (const input of [field("lr").all("input")[0], ...el.byClass("nbtrain-rewind-step"), ...el.byClass("nbtrain-ranks-input")]) {
    assert.equal(input.fire("keydown", { key: "a" }).propagates, false);
  }
});

test("an edit in progress is not overwritten by a redraw; the same value typed again sends nothing", () => {
  const { model, field, actions } = show();
  const input = field("lr").all("input")[0];
  input.value = "0.0";
  input.fire("input");
  model.set("controls", { ...CONTROLS, guards: "nan guard" });
  assert.equal(input.value, "0.0");
  input.value = "0.1";
  input.fire("change");
  assert.equal(actions().length, 0);
});

test("a finished run: its controls hidden but a disabled Stop that says so", () => {
  const { button, field } = show({ controls: { ...CONTROLS, live: false, stopped: true } });
  assert.ok(!button("pause").visible && !button("rewind").visible && !field("lr").visible);
  assert.ok(button("stop").disabled && button("stop").textContent === "Stopped");
});

test("the pager and the ranks box of a wide run send their own actions", () => {
  const { model, one, el, actions } = show({ ranks: { shown: true, value: "0, 17", error: "" },
    workers: { summary: "<table></table>", table: "", pager: { page: 0, pages: 16, label: "ranks 0–15 of 256" } } });
  assert.ok(one("nbtrain-pager").visible && one("nbtrain-ranks").visible);
  assert.ok(one("nbtrain-page-previous").disabled);
  one("nbtrain-page-next").click();
  assert.deepEqual({ ...actions().at(-1), id: undefined }, { action: "page", by: 1, id: undefined });
  const box = el.byClass("nbtrain-ranks-input")[0];
  assert.equal(box.value, "0, 17");
  box.typeIn("200-201");
  assert.deepEqual({ ...actions().at(-1), id: undefined }, { action: "ranks", value: "200-201", id: undefined });
  model.set("ranks", { shown: true, value: "0, 17", error: "not a rank or range of ranks: 'abc'" });
  assert.equal(one("nbtrain-ranks-note").textContent, "not a rank or range of ranks: 'abc'");
  assert.ok(one("nbtrain-ranks-note").classList.contains("nbtrain-error"));
});

test("logs: a collapsed pane per rank, text appended as it comes and capped, a failing rank's pane opened once", () => {
  const { model, el } = show();
  model.set("log_panes", [{ rank: 0, title: "rank 0 log", failed: false, open: false }]);
  model.custom({ kind: "logs", cap: 12, parts: [{ rank: 0, text: "epoch 1\n", mode: "append" }] });
  model.custom({ kind: "logs", cap: 12, parts: [{ rank: 0, text: "epoch 2\n", mode: "append" }] });
  const pane = () => el.all("details").find((d) => d.dataset.rank === "0");
  assert.equal(pane().all("pre")[0].textContent, "h 1\nepoch 2\n", "the last 12 characters");
  assert.equal(pane().open, false);
  model.custom({ kind: "logs", cap: 12, parts: [{ rank: 1, text: "Traceback", mode: "append" }] });
  model.set("log_panes", [{ rank: 0, title: "rank 0 log", failed: false, open: false },
    { rank: 1, title: "rank 1 log — failed", failed: true, open: true }]);
  const failed = el.all("details").find((d) => d.dataset.rank === "1");
  assert.equal(failed.all("summary")[0].textContent, "rank 1 log — failed");
  assert.equal(failed.all("pre")[0].textContent, "Traceback", "text that came before its pane is shown in it");
  assert.ok(failed.open);
  failed.open = false;  // the user closed it: a redraw leaves it closed
  model.set("log_panes", [...model.get("log_panes")]);
  assert.equal(failed.open, false);
  model.custom({ kind: "logs", cap: 12, parts: [{ rank: 1, text: "replaced", mode: "replace" }] });
  assert.equal(failed.all("pre")[0].textContent, "replaced");
});

test("a saved notebook's dashboard shows the logs' tails kept in the model, with no kernel", () => {
  const { el } = show({ log_panes: [{ rank: 3, title: "rank 3 log — failed", failed: true, open: true }],
    log_snapshot: { 3: "ZeroDivisionError: boom" } });
  const pane = el.all("details")[0];
  assert.equal(pane.all("pre")[0].textContent, "ZeroDivisionError: boom");
  assert.equal(pane.all("pre")[0].dataset.rank, "3");
});

test("closing the view stops listening", () => {
  const { model, dispose } = show();
  dispose();
  assert.ok(Object.values(model.handlers).every((fns) => fns.length === 0));
});
