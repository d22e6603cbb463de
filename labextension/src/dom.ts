/**
 * Small DOM and number-formatting helpers shared by the sidebar's run and sweep rows.
 */

export function fmtMetric(value: number): string {
  if (Number.isInteger(value)) {
    return String(value);
  }
  const abs = Math.abs(value);
  return abs !== 0 && (abs < 1e-3 || abs >= 1e5)
    ? value.toExponential(2)
    : String(Number(value.toPrecision(4)));
}

export function fmtDuration(seconds: number): string {
  const s = Math.floor(seconds);
  const h = Math.floor(s / 3600);
  const m = Math.floor((s % 3600) / 60);
  const rest = s % 60;
  const pad = (n: number) => String(n).padStart(2, '0');
  if (h > 0) {
    return `${h}h ${pad(m)}m`;
  }
  return m > 0 ? `${m}m ${pad(rest)}s` : `${rest}s`;
}

export function el(tag: string, className: string, text?: string): HTMLElement {
  const node = document.createElement(tag);
  if (className) {
    node.className = className;
  }
  if (text !== undefined) {
    node.textContent = text;
  }
  return node;
}

export function button(label: string, className: string): HTMLButtonElement {
  const node = document.createElement('button');
  node.type = 'button';
  node.className = `jp-Button jp-mod-styled jp-mod-small ${className}`;
  node.textContent = label;
  return node;
}

/**
 * Keep `list`'s children one row per item, in the items' order: a row is made once per key,
 * updated on every call, and removed with its key. (Rows are kept, not rebuilt, so an opened
 * row stays open across refreshes.)
 */
export function syncRows<K, T, R extends { readonly node: HTMLElement }>(
  list: HTMLElement,
  rows: Map<K, R>,
  items: readonly T[],
  key: (item: T) => K,
  make: () => R,
  update: (row: R, item: T) => void
): void {
  const seen = new Set<K>();
  items.forEach((item, index) => {
    const id = key(item);
    seen.add(id);
    let row = rows.get(id);
    if (!row) {
      row = make();
      rows.set(id, row);
    }
    update(row, item);
    if (list.children[index] !== row.node) {
      list.insertBefore(row.node, list.children[index] ?? null);
    }
  });
  for (const [id, row] of rows) {
    if (!seen.has(id)) {
      row.node.remove();
      rows.delete(id);
    }
  }
}
