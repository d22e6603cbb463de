/**
 * The sidebar's "Sweeps" section: one row per sweep (state, metric, best
 * value), which opens to its trials. A trial is an ordinary run: its "Open
 * dashboard" is that run's (the sidebar's onOpen), and the run is listed here
 * under its sweep instead of among the runs.
 *
 * Rows are keyed by name and updated in place, like the run rows, so an
 * opened sweep stays open and a button stays under the pointer between polls.
 */
import { IRun, ISweep, ITrial } from './api';
import { button, el, fmtMetric, syncRows } from './dom';

export interface ISweepListOptions {
  onOpen: (run: IRun) => void;
}

export class SweepList {
  readonly node = el('section', 'jp-nbtrain-sweeps');

  constructor(options: ISweepListOptions) {
    this._options = options;
    this.node.append(this._heading, this._list);
    this.node.hidden = true;
  }

  /** The names of the runs that are trials of a listed sweep (the run list leaves them out). */
  static trialRuns(sweeps: readonly ISweep[]): Set<string> {
    const names = new Set<string>();
    for (const sweep of sweeps) {
      for (const trial of sweep.trials) {
        if (typeof trial?.run === 'string') {
          names.add(trial.run);
        }
      }
    }
    return names;
  }

  update(sweeps: readonly ISweep[], runs: readonly IRun[]): void {
    const byName = new Map(runs.map(run => [run.name, run]));
    syncRows(this._list, this._rows, sweeps, sweep => sweep.name, () => new SweepRow(this._options), (row, sweep) => {
      try {
        row.update(sweep, byName);
      } catch (error) {
        row.showBroken(sweep.name, error);
      }
    });
    const running = sweeps.filter(sweep => !sweep.terminal).length;
    this._heading.textContent = `Sweeps (${running} running, ${sweeps.length} total)`;
    this.node.hidden = sweeps.length === 0;
  }

  private _options: ISweepListOptions;
  private _heading = el('h3', 'jp-nbtrain-section-title', 'Sweeps');
  private _list = el('ul', 'jp-nbtrain-sweep-list');
  private _rows = new Map<string, SweepRow>();
}

/** One sweep: a summary line that opens to its trials. */
class SweepRow {
  readonly node = el('li', 'jp-nbtrain-sweep');

  constructor(options: ISweepListOptions) {
    this._options = options;
    const top = el('div', 'jp-nbtrain-run-top');
    top.append(el('span', 'jp-nbtrain-caret'), this._name, this._badge);
    this._summary.append(top, this._info);
    this._details.append(this._summary, this._message, this._trials);
    this.node.appendChild(this._details);
  }

  update(sweep: ISweep, runs: Map<string, IRun>): void {
    this.node.classList.remove('jp-mod-broken');
    this.node.classList.toggle('jp-mod-malformed', Boolean(sweep.malformed));
    this.node.dataset.sweepName = sweep.name;
    this.node.dataset.state = sweep.state;
    this._name.textContent = sweep.name;
    this._name.title = sweep.address ? `${sweep.name} on ${sweep.address}` : sweep.name;
    this._badge.textContent = sweep.stale ? `${sweep.state}?` : sweep.state;
    this._badge.className = `jp-nbtrain-badge jp-nbtrain-state-${sweep.state}`;
    this._badge.title = sweep.stale
      ? 'Its cluster has not answered for a while; the state shown is the last one known.'
      : '';
    this._info.textContent = sweepInfo(sweep);
    this._message.textContent = sweep.error ?? '';
    this._message.hidden = !sweep.error;

    syncRows(this._trials, this._rows, sweep.trials, trial => trial.index, () => new TrialRow(this._options),
      (row, trial) => row.update(trial, trial.run ? runs.get(trial.run) ?? null : null));
  }

  /** A sweep this browser could not draw: its name and why. */
  showBroken(name: string, error: unknown): void {
    this.node.classList.add('jp-mod-broken');
    this.node.dataset.sweepName = name;
    this.node.dataset.state = 'unknown';
    this._name.textContent = name;
    this._badge.textContent = 'unknown';
    this._badge.className = 'jp-nbtrain-badge jp-nbtrain-state-unknown';
    this._info.textContent = '';
    this._message.textContent = `This sweep cannot be shown: ${
      error instanceof Error ? error.message : String(error)
    }`;
    this._message.hidden = false;
  }

  private _options: ISweepListOptions;
  private _details = el('details', 'jp-nbtrain-sweep-details');
  private _summary = el('summary', 'jp-nbtrain-sweep-summary');
  private _name = el('span', 'jp-nbtrain-run-name');
  private _badge = el('span', 'jp-nbtrain-badge');
  private _info = el('div', 'jp-nbtrain-sweep-info');
  private _message = el('div', 'jp-nbtrain-message jp-mod-error');
  private _trials = el('ul', 'jp-nbtrain-trial-list');
  private _rows = new Map<number, TrialRow>();
}

/** One trial: its hyperparameters, state, best value, why it ended, and its run's dashboard. */
class TrialRow {
  readonly node = el('li', 'jp-nbtrain-trial');

  constructor(options: ISweepListOptions) {
    const top = el('div', 'jp-nbtrain-run-top');
    top.append(this._name, this._config, this._badge);
    this._open.addEventListener('click', () => {
      if (this._run) {
        options.onOpen(this._run);
      }
    });
    const actions = el('div', 'jp-nbtrain-run-actions');
    actions.appendChild(this._open);
    this.node.append(top, this._metrics, this._message, actions);
  }

  update(trial: ITrial, run: IRun | null): void {
    this._run = run;
    this.node.dataset.trialIndex = String(trial.index);
    this.node.dataset.state = trial.state;
    if (trial.run) {
      this.node.dataset.runName = trial.run;
    } else {
      delete this.node.dataset.runName;
    }
    this._name.textContent = `trial ${trial.index}`;
    this._config.textContent = configText(trial.config);
    this._config.title = this._config.textContent;
    this._badge.textContent = trial.state;
    this._badge.className = `jp-nbtrain-badge jp-nbtrain-state-${trial.state}`;

    const parts = [];
    if (typeof trial.best === 'number') {
      parts.push(`best ${fmtMetric(trial.best)}`);
    }
    if (typeof trial.last === 'number') {
      parts.push(`last ${fmtMetric(trial.last)}`);
    }
    if (typeof trial.iterations === 'number' && trial.iterations > 0) {
      parts.push(`${trial.iterations} iteration${trial.iterations === 1 ? '' : 's'}`);
    }
    this._metrics.textContent = parts.join(' · ');
    this._metrics.hidden = !parts.length;

    const message =
      trial.error ??
      trial.stop_reason ??
      (trial.state === 'pending' && trial.waiting_for ? `waiting for ${trial.waiting_for}` : '');
    this._message.textContent = message;
    this._message.hidden = !message;
    this._message.classList.toggle('jp-mod-error', Boolean(trial.error));

    this._open.disabled = !run || (!run.notebook && !run.attach_cell);
    this._open.title = run
      ? `Open the dashboard of its run, ${run.name}`
      : trial.run
        ? `Its run ${trial.run} is not listed (yet).`
        : 'This trial has not started: it has no run yet.';
  }

  private _run: IRun | null = null;
  private _name = el('span', 'jp-nbtrain-run-name');
  private _config = el('span', 'jp-nbtrain-trial-config');
  private _badge = el('span', 'jp-nbtrain-badge');
  private _metrics = el('div', 'jp-nbtrain-metrics');
  private _message = el('div', 'jp-nbtrain-message');
  private _open = button('Open dashboard', 'jp-nbtrain-open');
}

/** "loss (min) · best 1.125 (trial 0) · asha · 3 trials: 1 running, 2 stopped" */
function sweepInfo(sweep: ISweep): string {
  if (sweep.malformed) {
    return '';
  }
  const parts = [];
  if (sweep.metric) {
    parts.push(sweep.mode ? `${sweep.metric} (${sweep.mode})` : sweep.metric);
  }
  if (typeof sweep.best === 'number') {
    const best = sweep.trials.find(t => t.state !== 'failed' && t.best === sweep.best);
    parts.push(`best ${fmtMetric(sweep.best)}${best ? ` (trial ${best.index})` : ''}`);
  } else {
    parts.push('no result yet');
  }
  if (sweep.scheduler) {
    parts.push(sweep.scheduler);
  }
  const counts = new Map<string, number>();
  for (const trial of sweep.trials) {
    counts.set(trial.state, (counts.get(trial.state) ?? 0) + 1);
  }
  const states = [...counts].map(([state, n]) => `${n} ${state}`).join(', ');
  const total = sweep.trials.length;
  parts.push(`${total} trial${total === 1 ? '' : 's'}${states ? `: ${states}` : ''}`);
  return parts.join(' · ');
}

/** `q=0.1, lr=0.001` */
function configText(config: Record<string, unknown> | null): string {
  if (!config || typeof config !== 'object') {
    return '';
  }
  return Object.entries(config)
    .map(([key, value]) => `${key}=${typeof value === 'number' ? fmtMetric(value) : String(value)}`)
    .join(', ');
}
