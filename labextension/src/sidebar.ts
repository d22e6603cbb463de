/**
 * The "Ray Training" sidebar: the connected cluster, the sweeps with their
 * trials (./sweeps.ts) and one row per run that is not a trial.
 *
 * Rows are keyed by run name and updated in place on every poll (never
 * rebuilt), so a button does not vanish under the pointer between polls.
 */
import { LabIcon } from '@jupyterlab/ui-components';
import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import { ICluster, IRun } from './api';
import { button, el, fmtDuration, fmtMetric, syncRows } from './dom';
import { RunsModel, isRunning } from './model';
import { SweepList } from './sweeps';

import raySvg from '../style/ray.svg';

export const rayIcon = new LabIcon({ name: 'nbtrain:ray', svgstr: raySvg });

/** Metrics shown first when a run reports them; the rest follow in order. */
const PREFERRED_METRICS = ['loss', 'accuracy', 'val_loss', 'val_accuracy'];
const MAX_METRICS = 4;
const NO_RUNS =
  'No runs yet. Start one with %%ray_train in a notebook ' +
  '(command palette: "nbtrain: Insert training cell").';

export interface ISidebarOptions {
  model: RunsModel;
  onStop: (run: IRun) => void;
  onPause: (run: IRun, verb: 'pause' | 'resume') => Promise<void>;
  onOpen: (run: IRun) => void;
  /** Several runs chosen with their checkboxes: their names, to compare in a notebook cell. */
  onCompare: (runs: IRun[]) => void;
}

export class RaySidebar extends Widget {
  constructor(options: ISidebarOptions) {
    super();
    this._model = options.model;
    this._options = options;
    this.id = 'nbtrain-sidebar';
    this.title.icon = rayIcon;
    this.title.caption = 'Ray Training';
    this.addClass('jp-nbtrain-Sidebar');

    const header = el('header', 'jp-nbtrain-header');
    header.appendChild(el('h2', 'jp-nbtrain-title', 'Ray Training'));
    this.node.appendChild(header);

    this._clusterNode = el('section', 'jp-nbtrain-cluster');
    this.node.appendChild(this._clusterNode);

    this._sweeps = new SweepList({ onOpen: options.onOpen });
    this.node.appendChild(this._sweeps.node);

    const runsSection = el('section', 'jp-nbtrain-runs');
    this._runsHeading = el('h3', 'jp-nbtrain-section-title', 'Runs');
    this._list = el('ul', 'jp-nbtrain-run-list');
    this._empty = el('p', 'jp-nbtrain-empty', NO_RUNS);
    this._compare.title = 'Draw the checked runs on one plot, in a cell of the active notebook';
    this._compare.addEventListener('click', () => {
      const chosen = this._model.runs.filter(run => this._checked.has(run.name));
      if (chosen.length >= 2) {
        options.onCompare(chosen);
      }
    });
    runsSection.append(this._runsHeading, this._compare, this._list, this._empty);
    this.node.appendChild(runsSection);

    this._errorNode = el('p', 'jp-nbtrain-error');
    this.node.appendChild(this._errorNode);

    this._model.changed.connect(this._render, this);
    this._render();
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._model.changed.disconnect(this._render, this);
    window.clearInterval(this._ticker);
    super.dispose();
  }

  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    this._model.setActive(true);
    // Elapsed times tick between polls.
    this._ticker = window.setInterval(() => this._renderElapsed(), 1000);
  }

  protected onAfterHide(msg: Message): void {
    super.onAfterHide(msg);
    this._model.setActive(false);
    window.clearInterval(this._ticker);
  }

  private _render(): void {
    this._renderCluster(this._model.cluster);
    const sweeps = this._model.sweeps;
    this._sweeps.update(sweeps, this._model.runs);

    // A trial's run is listed under its sweep, not here.
    const trials = SweepList.trialRuns(sweeps);
    const runs = this._model.runs.filter(run => !trials.has(run.name));
    for (const name of [...this._checked]) {
      if (!runs.some(run => run.name === name)) {
        this._checked.delete(name);
      }
    }
    const checked = (name: string, on: boolean): void => {
      if (on) {
        this._checked.add(name);
      } else {
        this._checked.delete(name);
      }
      this._renderCompare();
    };
    syncRows(this._list, this._rows, runs, run => run.name, () => new RunRow(this._options, checked), (row, run) => {
      try {
        row.update(run, this._model.elapsed(run));
      } catch (error) {
        // One run the browser cannot draw must not empty the list.
        row.showBroken(run.name, error);
      }
    });

    this._renderCompare();
    const running = runs.filter(isRunning).length;
    this._runsHeading.textContent = runs.length
      ? `Runs (${running} running, ${runs.length} total)`
      : 'Runs';
    this._empty.textContent = sweeps.length
      ? 'No runs besides the trials of the sweeps above.'
      : NO_RUNS;
    this._empty.hidden = !this._model.loaded || runs.length > 0;
    this._errorNode.textContent = this._model.error
      ? `Cannot reach the nbtrain server extension: ${this._model.error}`
      : '';
    this._errorNode.hidden = !this._model.error;
  }

  private _renderElapsed(): void {
    for (const run of this._model.runs) {
      try {
        this._rows.get(run.name)?.setElapsed(this._model.elapsed(run));
      } catch {
        // drawn as a broken row already
      }
    }
  }

  private _renderCluster(cluster: ICluster | null): void {
    const node = this._clusterNode;
    node.textContent = '';
    node.appendChild(el('h3', 'jp-nbtrain-section-title', 'Cluster'));
    if (!cluster) {
      node.appendChild(
        el(
          'p',
          'jp-nbtrain-muted',
          'Not connected. Use "nbtrain: Connect to cluster…" or %ray_connect.'
        )
      );
      return;
    }
    const table = el('dl', 'jp-nbtrain-cluster-info');
    const add = (label: string, value: string) => {
      table.append(el('dt', '', label), el('dd', '', value));
    };
    add('Address', cluster.address);
    (table.lastChild as HTMLElement).classList.add('jp-nbtrain-address');  // wraps at its spaces, never mid-port
    if (cluster.kind) {
      add('Kind', cluster.kind);
    }
    add('Nodes', typeof cluster.nodes === 'number' ? String(cluster.nodes) : '–');
    for (const resource of ['CPU', 'GPU']) {
      const pair = cluster.resources?.[resource];
      if (Array.isArray(pair)) {
        // "?": the cluster has not answered lately, so the numbers are its last known ones.
        const mark = cluster.stale ? '?' : '';
        add(`${resource}s`, `${fmtCount(pair[0])} / ${fmtCount(pair[1])} used${mark}`);
      }
    }
    const warm = cluster.warm;
    if (warm && warm.idle + warm.busy > 0) {
      const exit =
        typeof warm.next_exit_s === 'number'
          ? `, next exits in ${Math.ceil(warm.next_exit_s / 60)} min`
          : '';
      add('Warm workers', `${warm.idle} idle, ${warm.busy} in runs${exit}`);
    }
    table.title = cluster.stale
      ? 'The cluster has not answered lately; its resources are the last known ones.'
      : '';
    node.appendChild(table);
  }

  private _model: RunsModel;
  private _options: ISidebarOptions;
  private _clusterNode: HTMLElement;
  private _sweeps: SweepList;
  private _renderCompare(): void {
    this._compare.disabled = this._checked.size < 2;
    this._compare.textContent = this._checked.size
      ? `Compare ${this._checked.size} runs`
      : 'Compare (check 2+ runs)';
  }

  private _checked = new Set<string>();
  private _compare = button('Compare (check 2+ runs)', 'jp-nbtrain-compare');
  private _runsHeading: HTMLElement;
  private _list: HTMLElement;
  private _empty: HTMLElement;
  private _errorNode: HTMLElement;
  private _rows = new Map<string, RunRow>();
  private _ticker = 0;
}

/** One run's row; its DOM nodes live as long as the run is listed. */
class RunRow {
  readonly node = el('li', 'jp-nbtrain-run');

  constructor(options: ISidebarOptions, checked: (name: string, on: boolean) => void) {
    this._select.type = 'checkbox';
    this._select.className = 'jp-nbtrain-select';
    this._select.title = 'Choose this run to compare';
    this._select.addEventListener('change', () => {
      if (this._run) {
        checked(this._run.name, this._select.checked);
      }
    });
    this._top.append(this._select, this._name, this._badge, this._rewound, this._patched, this._straggler,
      this._elapsed);

    const bar = el('div', 'jp-nbtrain-progress');
    bar.appendChild(this._fill);
    this._progress.append(bar, this._progressLabel);

    this._stop.addEventListener('click', () => {
      if (this._run) {
        this._stop.disabled = true;
        options.onStop(this._run);
      }
    });
    this._pause.addEventListener('click', () => {
      if (this._run) {
        const verb = this._run.paused_at !== null && this._run.paused_at !== undefined ? 'resume' : 'pause';
        // shown at once: the ranks hold (or go on) only at their next step, seconds later
        this._asked = verb;
        this.update(this._run, null);
        void options.onPause(this._run, verb).catch(() => {
          this._asked = null;
        }).finally(() => {
          if (this._run) {
            this.update(this._run, null);
          }
        });
      }
    });
    this._open.addEventListener('click', () => {
      if (this._run) {
        options.onOpen(this._run);
      }
    });
    const actions = el('div', 'jp-nbtrain-run-actions');
    actions.append(this._pause, this._stop, this._open);

    this.node.append(this._top, this._parent, this._progress, this._metrics, this._message, actions);
  }

  update(run: IRun, elapsed: number | null): void {
    this._run = run;
    this.node.classList.remove('jp-mod-broken');
    this.node.classList.toggle('jp-mod-malformed', Boolean(run.malformed));
    this._top.hidden = false;
    this._progress.hidden = Boolean(run.malformed);
    const paused =
      run.state === 'running' && run.paused_at !== null && run.paused_at !== undefined;
    if (run.state !== 'running' || (this._asked === 'pause' && paused) || (this._asked === 'resume' && !paused)) {
      this._asked = null;  // done (or moot): the run's own state says it from here
    }
    const shown = this._asked === 'pause' ? 'pausing…' : this._asked === 'resume' ? 'resuming…'
      : paused ? `paused at step ${run.paused_at}` : run.state;
    const state = run.stale ? `${shown}?` : shown;
    this.node.dataset.runName = run.name;
    this.node.dataset.state = run.state;
    this._name.textContent = run.name;
    this._name.title =
      run.notebook ? `${run.name} — from ${run.notebook}` : run.name;
    this._select.hidden = Boolean(run.malformed);
    this._badge.textContent = state;
    this._badge.className = `jp-nbtrain-badge jp-nbtrain-state-${run.state}`;
    this._badge.title = run.stale
      ? 'Its cluster has not answered for a while; the state shown is ' +
        'the last one known.'
      : `Attempt ${run.attempt ?? 1}, ${run.workers ?? '?'} workers`;
    if (elapsed !== null) {
      this.setElapsed(elapsed);
    }

    const rewinds = run.rewinds ?? 0;
    this._rewound.hidden = rewinds === 0;
    this._rewound.textContent = rewinds > 1 ? `rewound ×${rewinds}` : 'rewound';
    this._rewound.title =
      `Rewound in place ${rewinds} time${rewinds === 1 ? '' : 's'} (run.rewind() or a guard): ` +
      'the branches it went back from are kept, marked superseded, and drawn faded on its dashboard.';

    const patches = run.patches ?? 0;
    this._patched.hidden = patches === 0;
    this._patched.textContent = patches > 1 ? `patched ×${patches}` : 'patched';
    this._patched.title =
      `Its code was patched ${patches} time${patches === 1 ? '' : 's'} while it ran (run.patch() or ` +
      '%%ray_patch): run.changes lists each, with the step every rank took it at.';

    const late = !run.terminal && run.stragglers ? run.stragglers : [];
    this._straggler.hidden = late.length === 0;
    this._straggler.textContent = late.length
      ? `straggler${late.length > 1 ? 's' : ''}: rank${late.length > 1 ? 's' : ''} ${late.join(', ')}`
      : '';
    this._straggler.title =
      'Own step time (data wait + compute) stays above 1.25x the median of the ranks; ' +
      'the other ranks wait for it. The dashboard shows where its time goes.';

    const fraction = progressFraction(run);
    this._fill.style.width = `${Math.round((fraction ?? 0) * 1000) / 10}%`;
    this._fill.className = `jp-nbtrain-progress-fill jp-nbtrain-state-${run.state}`;
    this._fill.classList.toggle('jp-mod-indeterminate', fraction === null);
    this._progressLabel.textContent = progressLabel(run, fraction);

    this._parent.textContent = run.parent ? `forked from ${run.parent}` : '';
    this._parent.hidden = !run.parent;

    this._metrics.textContent = metricsText(run.latest);
    this._metrics.hidden = !this._metrics.textContent;

    const message = run.error
      ? run.error
      : run.stop?.status === 'failed'
        ? `Stop failed: ${run.stop.message ?? 'unknown error'}`
        : run.stop?.status === 'stopping'
          ? 'Stopping…'
          : '';
    this._message.textContent = message;
    this._message.hidden = !message;
    this._message.classList.toggle(
      'jp-mod-error',
      Boolean(run.error) || run.stop?.status === 'failed'
    );

    this._stop.disabled = run.terminal || run.stop?.status === 'stopping';
    this._stop.hidden = run.terminal;
    this._pause.hidden = run.terminal || run.stale || run.state !== 'running';
    this._pause.textContent = this._asked === 'pause' ? 'Pausing…' : this._asked === 'resume' ? 'Resuming…'
      : paused ? 'Resume' : 'Pause';
    this._pause.disabled = this._asked !== null;
    this._pause.title = paused
      ? 'Let every rank go on'
      : 'Hold every rank at the same step (its workers stay reserved)';
    this._open.hidden = false;
    this._open.disabled = !run.notebook && !run.attach_cell;
    this._open.title = run.notebook
      ? `Open ${run.notebook}`
      : run.attach_cell
        ? `Insert "${run.attach_cell.replace(/\n/g, '; ')}" into the active notebook`
        : 'This run cannot be opened from here.';
  }

  /** A run this browser could not draw: its name and why, and no actions. */
  showBroken(name: string, error: unknown): void {
    this._run = null;
    this.node.dataset.runName = name;
    this.node.dataset.state = 'unknown';
    this.node.classList.add('jp-nbtrain-run', 'jp-mod-broken');
    this._name.textContent = name;
    this._badge.textContent = 'unknown';
    this._badge.className = 'jp-nbtrain-badge jp-nbtrain-state-unknown';
    this._straggler.hidden = true;
    this._rewound.hidden = true;
    this._patched.hidden = true;
    this._elapsed.textContent = '';
    this._progress.hidden = true;
    this._metrics.hidden = true;
    this._parent.hidden = true;
    this._message.textContent = `This run cannot be shown: ${
      error instanceof Error ? error.message : String(error)
    }`;
    this._message.hidden = false;
    this._message.classList.add('jp-mod-error');
    this._stop.hidden = true;
    this._pause.hidden = true;
    this._open.hidden = true;
  }

  setElapsed(seconds: number | null): void {
    this._elapsed.textContent = seconds === null ? '' : fmtDuration(seconds);
  }

  private _run: IRun | null = null;
  private _asked: 'pause' | 'resume' | null = null;  // clicked, not yet what the run says
  private _top = el('div', 'jp-nbtrain-run-top');
  private _select = document.createElement('input');
  private _progress = el('div', 'jp-nbtrain-progress-row');
  private _name = el('span', 'jp-nbtrain-run-name');
  private _badge = el('span', 'jp-nbtrain-badge');
  private _rewound = el('span', 'jp-nbtrain-rewound');  // not a -badge: that is the state's
  private _patched = el('span', 'jp-nbtrain-patched');
  private _straggler = el('span', 'jp-nbtrain-straggler');  // not a -badge: that is the state's
  private _elapsed = el('span', 'jp-nbtrain-elapsed');
  private _fill = el('div', 'jp-nbtrain-progress-fill');
  private _progressLabel = el('span', 'jp-nbtrain-progress-label');
  private _metrics = el('div', 'jp-nbtrain-metrics');
  private _parent = el('div', 'jp-nbtrain-parent');
  private _message = el('div', 'jp-nbtrain-message');
  private _stop = button('Stop', 'jp-nbtrain-stop jp-mod-warn');
  private _pause = button('Pause', 'jp-nbtrain-pause');
  private _open = button('Open dashboard', 'jp-nbtrain-open');
}

function progressFraction(run: IRun): number | null {
  const p = run.progress;
  if (!p) {
    return null;
  }
  if (typeof p.fraction === 'number') {
    return Math.min(1, Math.max(0, p.fraction));
  }
  if (typeof p.step === 'number' && p.total_steps) {
    return Math.min(1, Math.max(0, p.step / p.total_steps));
  }
  return null;
}

function progressLabel(run: IRun, fraction: number | null): string {
  const p = run.progress;
  const step = p && typeof p.step === 'number' ? p.step : null;
  if (step !== null && p?.total_steps) {
    return `step ${step}/${p.total_steps}`;
  }
  if (step !== null) {
    return `step ${step}`;
  }
  return fraction === null ? '' : `${Math.round(fraction * 100)}%`;
}

function metricsText(latest: Record<string, unknown> | null): string {
  if (!latest) {
    return '';
  }
  const keys = Object.keys(latest).filter(
    key => typeof latest[key] === 'number'
  );
  keys.sort((a, b) => rank(a) - rank(b));
  return keys
    .slice(0, MAX_METRICS)
    .map(key => `${key} ${fmtMetric(latest[key] as number)}`)
    .join(' · ');
}

function rank(key: string): number {
  const index = PREFERRED_METRICS.indexOf(key);
  return index === -1 ? PREFERRED_METRICS.length : index;
}

function fmtCount(value: unknown): string {
  if (typeof value !== 'number') {
    return '?';
  }
  return Number.isInteger(value) ? String(value) : value.toFixed(1);
}

