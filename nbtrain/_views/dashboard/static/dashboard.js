// A run's live dashboard, the whole of it, as one anywidget view (joined after charts.js, whose mountCharts draws
// the curves and the step-time bars): header, progress, notice, the ranks box of a wide run, charts, the worker
// table and its pager, the debug hint, a collapsed log pane per rank, the control row and its answer area, the
// final line. The same view in JupyterLab, Notebook 7, VS Code, Colab and marimo.
//
// Kernel -> page: each part is a small synced trait (the header, the table and the final line as HTML the kernel
// escaped, the same HTML the saved notebook's static summary shows; the controls as JSON); points and log text
// come as increments in custom messages ({kind: "points"} for mountCharts, {kind: "logs"} here). A view that
// opens late says "hello" and is sent both whole; a finished dashboard keeps its logs' tails in `log_snapshot`.
//
// Page -> kernel: every click or edit is one custom message, {action, ...fields, id}. Until the kernel has handled
// it (its id is in `controls.handled`) the control shows pending; a field always shows the run's value, never the
// typed one, until the run reports the change.

function made(tag, className, parent, text) {
  const element = document.createElement(tag);
  if (className) element.className = className;
  if (text !== undefined) element.textContent = text;
  if (parent) parent.appendChild(element);
  return element;
}

function shown(element, visible) { element.style.display = visible ? "" : "none"; }

// A text field whose keys stay its own: the notebook around it must not take them as its shortcuts (as
// ipywidgets' text fields do, for Notebook 7's and VS Code's command modes).
function field(className, parent, type = "text") {
  const input = made("input", className, parent);
  input.type = type;
  for (const kind of ["keydown", "keypress", "keyup"]) input.addEventListener(kind, (event) => event.stopPropagation());
  return input;
}

let sentCount = 0;
function messageId() { sentCount += 1; return `${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 8)}-${sentCount}`; }

// ------------------------------------------------------------------------------------------------ log panes
// One <details> per rank, collapsed; the kernel opens a failing rank's pane once. Text comes as increments; each
// pane keeps its last `cap` characters, as the kernel does.
function mountLogs(model, root) {
  const texts = new Map(), panes = new Map(), opened = new Set();
  let cap = 20000;

  function paneOf(rank) {
    if (!panes.has(rank)) {
      const pane = made("details", "nbtrain-log-pane");
      pane.dataset.rank = String(rank);
      const title = made("summary", "nbtrain-log-title", pane);
      const pre = made("pre", "nbtrain-log", pane);
      pre.dataset.rank = String(rank);
      panes.set(rank, { pane, title, pre });
    }
    return panes.get(rank);
  }

  function onPanes() {
    const listed = model.get("log_panes") || [];
    root.replaceChildren();
    for (const entry of listed) {
      const { pane, title, pre } = paneOf(entry.rank);
      title.textContent = entry.title;
      pane.dataset.failed = entry.failed ? "true" : "false";
      if (entry.open && !opened.has(entry.rank)) { pane.open = true; opened.add(entry.rank); }
      pre.textContent = texts.get(entry.rank) || "";
      root.appendChild(pane);
    }
  }

  function put(rank, text, append) {
    const whole = (append ? (texts.get(rank) || "") : "") + text;
    texts.set(rank, whole.length > cap ? whole.slice(whole.length - cap) : whole);
    if (panes.has(rank)) panes.get(rank).pre.textContent = texts.get(rank);
  }

  function receive(msg) {
    if (!msg || msg.kind !== "logs") return false;
    if (msg.cap) cap = msg.cap;
    for (const part of msg.parts || []) put(part.rank, part.text, part.mode === "append");
    return true;
  }

  function loadSnapshot() {
    for (const [rank, text] of Object.entries(model.get("log_snapshot") || {})) put(Number(rank), text, false);
  }

  loadSnapshot();
  onPanes();
  model.on("change:log_panes", onPanes);
  model.on("change:log_snapshot", loadSnapshot);
  return {
    receive,
    text: (rank) => texts.get(rank) || "",
    dispose() { model.off("change:log_panes", onPanes); model.off("change:log_snapshot", loadSnapshot); },
  };
}

// ------------------------------------------------------------------------------------------------ controls
// The run's settings, each an input showing the run's value; Pause/Resume, Checkpoint now, Rewind (to step, skip),
// Stacks, Profile, Stop; the active guards; the stacks or the profile under the row.
const BUTTONS = [  // [action, label, label while pending, title]
  ["pause", "Pause", "Pausing…", "Hold every rank at the same step (resources stay reserved)"],
  ["checkpoint", "Checkpoint now", "Checkpoint asked…", "Ask the ranks for a checkpoint at the next step"],
];

function mountControls(model, root, send) {
  const row = made("div", "nbtrain-control-row", root);
  const fieldsRoot = made("span", "nbtrain-fields", row);
  const fields = new Map();  // key -> {label, input, note, editing}
  const buttons = new Map();
  const local = new Map();   // what this view asked and the kernel has not handled yet: key -> {id, text}

  function button(action, label, title) {
    const b = made("button", "nbtrain-control", row, label);
    b.dataset.action = action;
    b.title = title;
    buttons.set(action, b);
    return b;
  }

  function ask(key, message, text) {
    const id = messageId();
    local.set(key, { id, text });
    send({ ...message, id });
    draw();
  }

  for (const [action, label, , title] of BUTTONS) {
    button(action, label, title).addEventListener("click", () => {
      const which = action === "pause" && (model.get("controls") || {}).paused ? "resume" : action;
      ask(which, { action: which }, "");
    });
  }
  const rewindStep = field("nbtrain-rewind-step", row);
  rewindStep.size = 8;
  rewindStep.title = "a step with a restore point on every rank; empty: the latest";
  const rewindSkip = field("nbtrain-rewind-skip", row, "number");
  rewindSkip.min = "0";
  rewindSkip.value = "0";
  rewindSkip.title = "batches to skip after the rewind (e.g. the one that diverged)";
  button("rewind", "Rewind", "").addEventListener("click", () =>
    ask("rewind", { action: "rewind", step: rewindStep.value.trim(), skip: rewindSkip.value.trim() }, ""));
  button("stacks", "Stacks", "Where every rank is now: its Python stacks, taken without pausing it")
    .addEventListener("click", () => ask("stacks", { action: "stacks" }, ""));
  button("profile", "Profile", "").addEventListener("click", () => ask("profile", { action: "profile" }, ""));
  const stop = button("stop", "Stop", "Stop the run: all workers are stopped and their resources freed");
  stop.classList.add("nbtrain-stop");
  stop.addEventListener("click", () => ask("stop", { action: "stop" }, ""));
  const guards = made("div", "nbtrain-guards", root);
  const answer = made("div", "nbtrain-answer", root);

  function setting(key) {
    if (fields.has(key)) return fields.get(key);
    const label = made("label", "nbtrain-field", fieldsRoot);
    label.dataset.key = key;
    made("span", "nbtrain-field-name", label, key + " ");
    const input = field("", label);
    input.size = 10;
    const note = made("span", "nbtrain-pending-note", label);
    const entry = { label, input, note, value: "", editing: false };
    input.addEventListener("input", () => { entry.editing = true; });
    const commit = () => {
      if (!entry.editing) return;
      entry.editing = false;
      const typed = input.value.trim();
      input.value = entry.value;  // the run's value until the run reports the change
      if (typed !== entry.value) ask(key, { action: "adjust", key, value: typed }, typed);
    };
    input.addEventListener("change", commit);
    input.addEventListener("keydown", (event) => { if (event.key === "Enter") commit(); });
    fields.set(key, entry);
    return entry;
  }

  function draw() {
    const state = model.get("controls") || {};
    const handled = new Set(state.handled || []);
    for (const [key, asked] of [...local]) if (handled.has(asked.id)) local.delete(key);
    const pending = { ...(state.pending || {}) };
    for (const [key, asked] of local) if (!(key in pending)) pending[key] = asked.text;
    const live = !!state.live;
    const wanted = new Set();
    for (const spec of state.fields || []) {
      const f = setting(spec.key);
      wanted.add(spec.key);
      f.value = spec.value;
      if (!f.editing) f.input.value = spec.value;
      f.input.title = spec.tooltip || spec.key;
      f.input.disabled = !live;
      const waiting = spec.key in pending;
      f.label.classList.toggle("nbtrain-pending", waiting);
      f.note.textContent = waiting ? `→ ${pending[spec.key]} asked…` : "";
      shown(f.label, live);
    }
    for (const [key, f] of fields) if (!wanted.has(key)) shown(f.label, false);
    const pause = buttons.get("pause");
    pause.textContent = state.paused ? "Resume" : "Pause";
    pause.dataset.action = state.paused ? "resume" : "pause";
    for (const [action, , waitingLabel] of BUTTONS) {
      const b = buttons.get(action);
      const waiting = action in pending || (action === "pause" && "resume" in pending);
      b.disabled = !live || waiting;
      b.classList.toggle("nbtrain-pending", waiting);
      if (waiting) b.textContent = action === "pause" && "resume" in pending ? "Resuming…" : waitingLabel;
      shown(b, live);
    }
    const rewind = state.rewind || {};
    const rewindButton = buttons.get("rewind");
    rewindButton.disabled = !live || !rewind.enabled || "rewind" in pending;
    rewindButton.classList.toggle("nbtrain-pending", "rewind" in pending);
    rewindButton.textContent = "rewind" in pending ? "Rewinding…" : "Rewind";
    rewindButton.title = rewind.tooltip || "";
    rewindStep.placeholder = rewind.placeholder || "latest";
    for (const element of [rewindStep, rewindSkip, rewindButton]) shown(element, live);
    for (const [action, idle, waitingLabel] of [["stacks", "Stacks", "Taking stacks…"],
      ["profile", `Profile ${state.profile_steps || 10} steps`, "Profiling…"]]) {
      const b = buttons.get(action);
      b.disabled = !live || action in pending;
      b.classList.toggle("nbtrain-pending", action in pending);
      b.textContent = action in pending ? waitingLabel : idle;
      shown(b, live);
    }
    buttons.get("profile").title = `torch.profiler on rank 0 for the next ${state.profile_steps || 10} steps: ` +
      "the top operators, and the trace's path";
    const stopping = "stop" in pending;
    stop.disabled = !live || stopping || !!state.stopped;
    stop.textContent = state.stopped ? "Stopped" : stopping ? "Stopping…" : "Stop";
    guards.textContent = state.guards || "";
    answer.innerHTML = model.get("answer") || "";
  }

  draw();
  model.on("change:controls", draw);
  model.on("change:answer", draw);
  return { draw, dispose() { model.off("change:controls", draw); model.off("change:answer", draw); } };
}

// ------------------------------------------------------------------------------------------------ the view
function render({ model, el }) {
  const root = made("div", "nbtrain-dashboard", el);
  const send = (message) => model.send(message);
  const header = made("div", "nbtrain-header", root);
  const progressRow = made("div", "nbtrain-progress-row", root);
  const bar = made("div", "nbtrain-progress", progressRow);
  const fill = made("div", "nbtrain-progress-fill", bar);
  const progressLabel = made("span", "nbtrain-progress-label", progressRow);
  const notice = made("div", "nbtrain-notice-line", root);
  const ranksRow = made("div", "nbtrain-ranks", root);
  made("span", "nbtrain-ranks-name", ranksRow, "ranks: ");
  const ranksInput = field("nbtrain-ranks-input", ranksRow);
  ranksInput.placeholder = "e.g. 0, 17, 200-203";
  ranksInput.title = "Ranks drawn as lines of their own, besides the mean and band";
  const ranksNote = made("span", "nbtrain-ranks-note", ranksRow);
  const chartsRoot = made("div", "nbtrain-charts", root);
  const workerSummary = made("div", "nbtrain-worker-summary-box", root);
  const pager = made("div", "nbtrain-pager", root);
  const previous = made("button", "nbtrain-page-previous", pager, "‹ previous");
  const pageLabel = made("span", "nbtrain-worker-page", pager);
  const next = made("button", "nbtrain-page-next", pager, "next ›");
  const workerTable = made("div", "nbtrain-worker-table", root);
  const stepTimes = made("div", "nbtrain-charts nbtrain-step-times", root);
  const debugHint = made("div", "nbtrain-debug", root);
  const logsRoot = made("div", "nbtrain-logs", root);
  const controlsRoot = made("div", "nbtrain-controls", root);
  const final = made("div", "nbtrain-final-line", root);

  const charts = mountCharts(model, chartsRoot, stepTimes);
  const logs = mountLogs(model, logsRoot);
  const controls = mountControls(model, controlsRoot, send);

  previous.addEventListener("click", () => send({ action: "page", by: -1, id: messageId() }));
  next.addEventListener("click", () => send({ action: "page", by: 1, id: messageId() }));
  let ranksEditing = false;
  ranksInput.addEventListener("input", () => { ranksEditing = true; });
  ranksInput.addEventListener("change", () => {
    ranksEditing = false;
    send({ action: "ranks", value: ranksInput.value, id: messageId() });
  });

  const parts = {
    header() { header.innerHTML = model.get("header") || ""; },
    progress() {
      const p = model.get("progress") || {};
      shown(bar, p.fraction !== null && p.fraction !== undefined);
      fill.style.width = `${Math.round(100 * (p.fraction || 0))}%`;
      bar.dataset.style = p.style || "";
      progressLabel.innerHTML = p.label || "";
    },
    notice() {
      const n = model.get("notice") || {};
      notice.textContent = n.text || "";
      notice.style.color = n.colour || "";
    },
    ranks() {
      const r = model.get("ranks") || {};
      shown(ranksRow, !!r.shown);
      if (!ranksEditing) ranksInput.value = r.value || "";
      ranksNote.textContent = r.error || "lines of their own, besides the mean and the min–max band across ranks";
      ranksNote.classList.toggle("nbtrain-error", !!r.error);
    },
    workers() {
      const w = model.get("workers") || {};
      workerSummary.innerHTML = w.summary || "";
      workerTable.innerHTML = w.table || "";
      shown(pager, !!w.pager);
      if (w.pager) {
        pageLabel.textContent = w.pager.label;
        previous.disabled = w.pager.page <= 0;
        next.disabled = w.pager.page >= w.pager.pages - 1;
      }
    },
    debug_hint() { debugHint.innerHTML = model.get("debug_hint") || ""; },
    final() { final.innerHTML = model.get("final") || ""; },
  };
  const listeners = Object.entries(parts).map(([name, draw]) => {
    draw();
    model.on(`change:${name}`, draw);
    return [`change:${name}`, draw];
  });

  function onMessage(msg, buffers) {
    if (!charts.receive(msg, buffers)) logs.receive(msg);
  }
  model.on("msg:custom", onMessage);
  model.send({ kind: "hello" });  // a view that opens late: the kernel sends it every trace and log whole
  return () => {
    model.off("msg:custom", onMessage);
    for (const [event, draw] of listeners) model.off(event, draw);
    charts.dispose();
    logs.dispose();
    controls.dispose();
  };
}

export default { render };
