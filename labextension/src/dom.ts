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
