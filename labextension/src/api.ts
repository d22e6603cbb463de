/**
 * REST client for the nbtrain server extension (`/nbtrain/api/...`).
 *
 * Every request goes through ServerConnection, so it carries the Jupyter
 * token/XSRF cookie like the rest of JupyterLab; the server rejects anything
 * else with 403.
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

/** What the server knows about a stop it was asked for. */
export interface IStopRequest {
  status: 'stopping' | 'failed';
  requested: number;
  message: string | null;
}

export interface IRun {
  name: string;
  /** `pending`, `running`, `succeeded`, ...: shown as is (the server knows the states). */
  state: string;
  /** Whether the state is final, as the server says (the browser keeps no list of states). */
  terminal: boolean;
  address: string | null;
  created: number | null;
  updated: number | null;
  ended: number | null;
  notebook: string | null;
  workers: number | null;
  attempt: number | null;
  progress: {
    step: number | null;
    total_steps: number | null;
    fraction: number | null;
  } | null;
  latest: Record<string, unknown> | null;
  error: string | null;
  /** Ranks the run's supervisor flags as stragglers now (their own step time stays well above the median). */
  stragglers?: number[] | null;
  /** A live run whose cluster has not answered for a while: the state shown is the last one known. */
  stale: boolean;
  /** Added by the server when a stop was requested through it. */
  stop?: IStopRequest | null;
  /** The step every rank is held at by a pause, while the run is paused; else null. */
  paused_at?: number | null;
  /** How many times the run was rewound in place (`run.rewind()` or a guard); null when its cluster did not say. */
  rewinds?: number | null;
  /** How many times its code was patched (`run.patch()`); null when its cluster did not say. */
  patches?: number | null;
  /** `run.fork()`: "<parent run> at step <N>"; else null. */
  parent?: string | null;
  /**
   * The cell "Open dashboard" runs (`%ray_connect '…'` / `%ray_attach '…'`), built by the
   * server from a checked name and address; null for a record that cannot be shown.
   */
  attach_cell: string | null;
  /** A record the server could not show as a run: `error` says why; no actions. */
  malformed: boolean;
}

/** One trial of a sweep; its run (`run`) is an ordinary run, listed in `runs`. */
export interface ITrial {
  index: number;
  /** `pending`, `running`, `succeeded`, `stopped` or `failed`. */
  state: string;
  /** The trial's sampled hyperparameters. */
  config: Record<string, unknown> | null;
  iterations: number | null;
  last: number | null;
  best: number | null;
  /** Why it ended early, e.g. "stopped by ASHA at rung 1 (training_iteration 2)". */
  stop_reason: string | null;
  error: string | null;
  /** A pending trial: the resources it waits for. */
  waiting_for: string | null;
  /** Its run's name; null until it started. */
  run: string | null;
}

export interface ISweep {
  name: string;
  state: string;
  terminal: boolean;
  stale: boolean;
  address: string | null;
  metric: string | null;
  mode: 'min' | 'max' | string | null;
  scheduler: string | null;
  /** The best value of the metric over the trials that did not fail. */
  best: number | null;
  started: number | null;
  ended: number | null;
  error: string | null;
  trials: ITrial[];
  /** A sweep the server could not show: `error` says why; no trials. */
  malformed: boolean;
}

export interface IRunList {
  runs: IRun[];
  /** Absent from servers that predate sweeps. */
  sweeps?: ISweep[];
  /** The server's clock, so elapsed times do not depend on the browser's. */
  now: number;
}

export interface ICluster {
  address: string;
  kind: 'local' | 'remote' | string;
  nodes: number | null;
  resources: Record<string, [number, number]>;
  updated: number | null;
  /** Warm workers of every notebook session: idle ones wait for their session's next run, then exit. */
  warm?: { idle: number; busy: number; next_exit_s: number | null };
  /** The cluster has not answered lately (or not yet): `resources` may be outdated. */
  stale?: boolean;
}

/** Error raised for a non-2xx answer, carrying the server's message. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    message: string
  ) {
    super(message);
  }
}

async function request<T>(path: string, init: RequestInit = {}): Promise<T> {
  const settings = ServerConnection.makeSettings();
  const url = URLExt.join(settings.baseUrl, 'nbtrain', 'api', path);
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, init, settings);
  } catch (error) {
    throw new ServerConnection.NetworkError(error as TypeError);
  }
  const text = await response.text();
  let body: any = null;
  if (text) {
    try {
      body = JSON.parse(text);
    } catch {
      body = { message: text };
    }
  }
  if (!response.ok) {
    const message = body?.message || body?.reason || response.statusText;
    throw new ApiError(response.status, message);
  }
  return body as T;
}

export function listRuns(): Promise<IRunList> {
  return request<IRunList>('runs');
}

export async function getCluster(): Promise<ICluster | null> {
  const body = await request<{ cluster: ICluster | null }>('cluster');
  return body.cluster;
}

/** Pause or resume a live run; answers once the cluster has it (or with its refusal). */
export function steerRun(name: string, verb: 'pause' | 'resume'): Promise<IRun> {
  return request<IRun>(`runs/${encodeURIComponent(name)}/${verb}`, {
    method: 'POST'
  });
}

export function stopRun(name: string): Promise<IRun> {
  return request<IRun>(`runs/${encodeURIComponent(name)}/stop`, {
    method: 'POST'
  });
}
