/**
 * Status bar item: "Ray: <address> · N running"; a click opens the sidebar.
 */
import { Widget } from '@lumino/widgets';

import { ICluster } from './api';
import { RunsModel } from './model';

export class RayStatus extends Widget {
  constructor(model: RunsModel, onClick: () => void) {
    super();
    this._model = model;
    this.addClass('jp-nbtrain-Status');
    this.node.title = 'Ray Training: click to show the runs';
    this.node.addEventListener('click', onClick);
    this._model.changed.connect(this._render, this);
    this._render();
  }

  dispose(): void {
    this._model.changed.disconnect(this._render, this);
    super.dispose();
  }

  private _render(): void {
    const address = shortAddress(this._model.cluster);
    this.node.textContent = `Ray: ${address} · ${this._model.runningCount} running`;
  }

  private _model: RunsModel;
}

/** `ray://10.0.0.5:10001` -> `10.0.0.5:10001`; no cluster -> `not connected`. */
export function shortAddress(cluster: ICluster | null): string {
  if (!cluster?.address) {
    return 'not connected';
  }
  return cluster.address.replace(/^[a-z]+:\/\//, '');
}
