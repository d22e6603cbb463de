// What the widgets' front ends (nbtrain/_views/dashboard/static/) need of a browser, for Node's test runner: a
// fake element (tree, attributes, listeners), a fake anywidget model, and the widget's ES module joined from its
// pieces as the kernel joins them (charts_widget.front_end). Not a test file: node --test runs *.test.mjs.
import { readFileSync } from "node:fs";

const STATIC = new URL("../../nbtrain/_views/dashboard/static/", import.meta.url);

export class FakeElement {
  constructor(tag) {
    this.tag = tag; this.attrs = {}; this.children = []; this.dataset = {}; this.textContent = "";
    this.className = ""; this.innerHTML = ""; this.listeners = {}; this.disabled = false; this.style = {};
    this.value = ""; this.open = false; this.title = ""; this.placeholder = "";
    const element = this;
    this.classList = {
      add: (name) => { element.className = [...element.className.split(" ").filter(Boolean), name].join(" "); },
      contains: (name) => element.className.split(" ").includes(name),
      toggle: (name, on) => {
        const names = element.className.split(" ").filter((n) => n && n !== name);
        element.className = (on ? [...names, name] : names).join(" ");
      },
    };
  }
  setAttribute(key, value) { this.attrs[key] = String(value); }
  appendChild(child) { this.children = this.children.filter((c) => c !== child); this.children.push(child); return child; }
  append(...children) { for (const child of children) this.appendChild(child); }
  replaceChildren(...children) { this.children = children; }
  addEventListener(kind, fn) { (this.listeners[kind] ||= []).push(fn); }
  fire(kind, event = {}) {
    const fired = { target: this, propagates: true, stopPropagation() { fired.propagates = false; }, ...event };
    for (const fn of this.listeners[kind] || []) fn(fired);
    return fired;
  }
  click() { if (!this.disabled) this.fire("click"); }
  /** A person typing ``text`` into this input, then pressing Enter. */
  typeIn(text) { this.value = text; this.fire("input"); this.fire("keydown", { key: "Enter" }); this.fire("change"); }
  all(tag) {  // every element below this one with ``tag``, in document order
    return this.children.flatMap((child) => [...(child.tag === tag ? [child] : []), ...child.all(tag)]);
  }
  find(test) {  // every element below this one that ``test`` accepts, in document order
    return this.children.flatMap((child) => [...(test(child) ? [child] : []), ...child.find(test)]);
  }
  byClass(name) { return this.find((child) => child.className.split(" ").includes(name)); }
  get visible() { return this.style.display !== "none"; }
}

globalThis.document = {
  createElementNS: (_ns, tag) => new FakeElement(tag),
  createElement: (tag) => new FakeElement(tag),
};
globalThis.window = { requestAnimationFrame: (fn) => fn() };  // draw at once: the test reads what it drew

/** An anywidget model: traits by name, change and custom-message listeners (several per event), sent messages. */
export class FakeModel {
  constructor(traits) {
    this.traits = { charts: [], snapshot: null, snapshot_index: [], ...traits };
    this.handlers = {}; this.sent = [];
  }
  get(name) { return this.traits[name]; }
  set(name, value) { this.traits[name] = value; for (const fn of this.handlers[`change:${name}`] || []) fn(); }
  on(event, fn) { (this.handlers[event] ||= []).push(fn); }
  off(event, fn) { this.handlers[event] = (this.handlers[event] || []).filter((f) => f !== fn); }
  send(message) { this.sent.push(message); }
  custom(message, buffers) { for (const fn of this.handlers["msg:custom"] || []) fn(message, buffers); }
}

/** The default export of the ES module joined from ``pieces`` of static/, as the kernel ships it. */
export async function widgetModule(...pieces) {
  const code = pieces.map((piece) => readFileSync(new URL(piece, STATIC), "utf8")).join("\n");
  return (await import("data:text/javascript," + encodeURIComponent(code))).default;
}
