/**
 * One poller shared by the sidebar and the status bar item: the runs, the
 * sweeps (with their trials) and the cluster.
 *
 * It polls fast (FAST_MS) while the sidebar is visible, while a run is going
 * (so the status bar's count drops as it ends) and for WATCH_MS after a cell
 * starts (so a run the cell launches is counted as it starts), and slowly
 * otherwise; it stands by while the browser tab is hidden, and backs off when
 * the server does not answer, so an idle JupyterLab costs the server almost
 * nothing.
 */
import { Poll } from '@lumino/polling';
import { ISignal, Signal } from '@lumino/signaling';

import {
  ICluster,
  IRun,
  ISweep,
  getCluster,
  listRuns,
  steerRun,
  stopRun
} from './api';

const FAST_MS = 1500;
const SLOW_MS = 10000;
const WATCH_MS = 60000;

export class RunsModel {
  constructor() {
    this._poll = new Poll({
      factory: () => this._fetch(),
      frequency: { interval: SLOW_MS, backoff: true, max: 60000 },
      standby: 'when-hidden',
      name: 'nbtrain:runs'
    });
  }

  /** Emitted after every poll, successful or not. */
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  get runs(): readonly IRun[] {
    return this._runs;
  }

  get sweeps(): readonly ISweep[] {
    return this._sweeps;
  }

  get cluster(): ICluster | null {
    return this._cluster;
  }

  /** The last error message from the server, or null when the last poll worked. */
  get error(): string | null {
    return this._error;
  }

  /** Whether at least one poll has completed (an empty list means "no runs"). */
  get loaded(): boolean {
    return this._loaded;
  }

  /** Runs known to be going now: not ended, and their cluster answered lately (a stale one may be gone). */
  get runningCount(): number {
    return this._runs.filter(isRunning).length;
  }

  /** Seconds since the run was created, on the server's clock. */
  elapsed(run: IRun): number | null {
    if (!isNumber(run.created)) {
      return null;
    }
    const end = run.terminal
      ? [run.ended, run.updated, this._serverNow].find(isNumber)!
      : this._serverNow + (Date.now() - this._fetchedAt) / 1000;
    return Math.max(0, end - run.created);
  }

  /** Poll fast while someone is looking at the runs. */
  setActive(active: boolean): void {
    this._active = active;
    if (this._retune() && active) {
      void this.refresh();
    }
  }

  /** A notebook cell started: it may launch a run, which is then counted within FAST_MS. */
  watch(): void {
    this._watchUntil = Date.now() + WATCH_MS;
    if (this._retune()) {
      void this.refresh();
    }
  }

  /** FAST_MS while the sidebar shows, a run is going or a cell started lately; else SLOW_MS. Whether it changed. */
  private _retune(): boolean {
    const busy =
      this._active ||
      Date.now() < this._watchUntil ||
      this._runs.some(isRunning);
    const interval = busy ? FAST_MS : SLOW_MS;
    if (this._poll.frequency.interval === interval) {
      return false;
    }
    this._poll.frequency = { ...this._poll.frequency, interval };
    return true;
  }

  refresh(): Promise<void> {
    return this._poll.refresh();
  }

  async steer(name: string, verb: 'pause' | 'resume'): Promise<void> {
    try {
      await steerRun(name, verb);
    } finally {
      await this.refresh();
    }
  }

  async stop(name: string): Promise<void> {
    try {
      await stopRun(name);
    } finally {
      await this.refresh();
    }
  }

  dispose(): void {
    this._poll.dispose();
  }

  private async _fetch(): Promise<void> {
    try {
      const [list, cluster] = await Promise.all([listRuns(), getCluster()]);
      if (!Array.isArray(list?.runs)) {
        throw new Error('the server answered something that is not a run list');
      }
      // Rows are keyed by name: anything else is dropped here, and each row draws defensively.
      this._runs = list.runs.filter(
        run => run !== null && typeof run === 'object' && typeof run.name === 'string'
      );
      this._sweeps = (Array.isArray(list.sweeps) ? list.sweeps : []).filter(
        sweep =>
          sweep !== null &&
          typeof sweep === 'object' &&
          typeof sweep.name === 'string' &&
          Array.isArray(sweep.trials)
      );
      this._serverNow = isNumber(list.now) ? list.now : Date.now() / 1000;
      this._fetchedAt = Date.now();
      this._cluster = cluster;
      this._error = null;
    } catch (error) {
      this._error = (error as Error).message || String(error);
      throw error;
    } finally {
      this._loaded = true;
      this._retune(); // the next poll's pace: a run still going keeps it fast
      this._changed.emit();
    }
  }

  private _poll: Poll;
  private _changed = new Signal<this, void>(this);
  private _runs: IRun[] = [];
  private _sweeps: ISweep[] = [];
  private _cluster: ICluster | null = null;
  private _error: string | null = null;
  private _loaded = false;
  private _active = false;
  private _watchUntil = 0;
  private _serverNow = Date.now() / 1000;
  private _fetchedAt = Date.now();
}

function isNumber(value: unknown): value is number {
  return typeof value === 'number' && Number.isFinite(value);
}

/** Whether a served run is known to be going now (the status bar's and the sidebar's "running"). */
export function isRunning(run: IRun): boolean {
  return !run.terminal && !run.stale;
}
