/**
 * Command palette commands. They only write notebook cells or open files:
 * launching and connecting stay in the kernel (the magics), so the lab
 * extension never has its own copy of that logic.
 */
import { JupyterFrontEnd } from '@jupyterlab/application';
import {
  Dialog,
  ICommandPalette,
  InputDialog,
  Notification,
  showDialog
} from '@jupyterlab/apputils';
import {
  INotebookTracker,
  NotebookActions,
  NotebookPanel
} from '@jupyterlab/notebook';

import { IRun } from './api';
import { RunsModel } from './model';

export namespace CommandIDs {
  export const connect = 'nbtrain:connect';
  export const insertTrainingCell = 'nbtrain:insert-training-cell';
  export const openTutorials = 'nbtrain:open-tutorials';
  export const openSidebar = 'nbtrain:open-sidebar';
  export const stopRun = 'nbtrain:stop-run';
  export const openRun = 'nbtrain:open-run';
  export const compareRuns = 'nbtrain:compare-runs';
}

export const SIDEBAR_ID = 'nbtrain-sidebar';

const TUTORIALS_DIR = 'notebooks';
const QUICKSTART = 'notebooks/01_quickstart.ipynb';

export const TRAINING_CELL = `%%ray_train --workers 2 --config lr=0.01 epochs=2
# Runs on every worker; \`config\` holds the --config values.
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import nbtrain

torch.manual_seed(0)
data = TensorDataset(torch.randn(512, 8), torch.randn(512, 1))
loader = nbtrain.prepare_loader(DataLoader(data, batch_size=32, shuffle=True))
model = nbtrain.prepare_model(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)))
optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])

for epoch in range(config["epochs"]):
    for x, y in loader:
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        nbtrain.report(loss=loss.item(), epoch=epoch)
`;

export interface ICommandsOptions {
  app: JupyterFrontEnd;
  model: RunsModel;
  notebooks: INotebookTracker;
  palette: ICommandPalette | null;
}

export function addCommands(options: ICommandsOptions): void {
  const { app, model, notebooks, palette } = options;
  const { commands } = app;

  commands.addCommand(CommandIDs.connect, {
    label: 'nbtrain: Connect to cluster…',
    caption: 'Insert and run %ray_connect in the active notebook',
    execute: async () => {
      const result = await InputDialog.getText({
        title: 'Connect to a Ray cluster',
        label: 'Address (ray://host:10001); leave empty for a local cluster',
        placeholder: 'ray://127.0.0.1:10001',
        okLabel: 'Connect'
      });
      if (!result.button.accept) {
        return;
      }
      const address = (result.value ?? '').trim();
      const panel = await activeNotebook(app, notebooks);
      const source =
        loadExtLine(panel) + `%ray_connect${address ? ' ' + address : ''}`;
      await insertCell(app, panel, source, true);
      void model.refresh();
    }
  });

  commands.addCommand(CommandIDs.insertTrainingCell, {
    label: 'nbtrain: Insert training cell',
    caption: 'Insert a %%ray_train template cell below the active cell',
    execute: async () => {
      const panel = await activeNotebook(app, notebooks);
      await insertCell(app, panel, TRAINING_CELL, false);
    }
  });

  commands.addCommand(CommandIDs.openTutorials, {
    label: 'nbtrain: Open tutorials',
    caption: `Open ${QUICKSTART} and the ${TUTORIALS_DIR}/ folder`,
    execute: async () => {
      const contents = app.serviceManager.contents;
      const exists = (path: string) =>
        contents.get(path, { content: false }).then(
          () => true,
          () => false
        );
      if (!(await exists(TUTORIALS_DIR))) {
        Notification.warning(
          `No ${TUTORIALS_DIR}/ folder under the Jupyter root directory; ` +
            'start JupyterLab from the nbtrain checkout to see the tutorials.',
          { autoClose: 8000 }
        );
        return;
      }
      if (commands.hasCommand('filebrowser:go-to-path')) {
        await commands.execute('filebrowser:go-to-path', {
          path: TUTORIALS_DIR
        });
      }
      if (await exists(QUICKSTART)) {
        await commands.execute('docmanager:open', { path: QUICKSTART });
      }
    }
  });

  commands.addCommand(CommandIDs.openSidebar, {
    label: 'nbtrain: Show Ray Training sidebar',
    execute: () => app.shell.activateById(SIDEBAR_ID)
  });

  commands.addCommand(CommandIDs.stopRun, {
    label: args => (args.name ? `Stop run ${args.name}` : 'Stop run'),
    execute: async args => {
      const name = String(args.name ?? '');
      if (!name) {
        return;
      }
      if (args.confirm !== false) {
        const answer = await showDialog({
          title: `Stop run "${name}"?`,
          body: 'Its workers are stopped; checkpoints and metrics are kept.',
          buttons: [
            Dialog.cancelButton(),
            Dialog.warnButton({ label: 'Stop run' })
          ]
        });
        if (!answer.button.accept) {
          await model.refresh();
          return;
        }
      }
      try {
        await model.stop(name);
      } catch (error) {
        Notification.error(
          `Could not stop run "${name}": ${(error as Error).message}`,
          { autoClose: 10000 }
        );
      }
    }
  });

  commands.addCommand(CommandIDs.compareRuns, {
    label: 'Compare runs',
    execute: async args => {
      const names = (args.names as string[] | undefined) ?? [];
      const runs = model.runs.filter(r => names.includes(r.name) && r.attach_cell);
      if (runs.length < 2) {
        return;
      }
      // A cell, not a panel: it stays in the notebook with its picture, follows live runs through
      // the kernel's own connection, and the metric or the x axis is one edit away.
      const connect = (runs[0].attach_cell ?? '').split('\n')[0];
      const quoted = runs.map(r => JSON.stringify(r.name)).join(', ');
      const panel = await activeNotebook(app, notebooks);
      await insertCell(
        app,
        panel,
        `${loadExtLine(panel)}${connect.startsWith('%ray_connect') ? connect + '\n' : ''}` +
          `import nbtrain\nnbtrain.compare([${quoted}], metric="loss")`,
        true
      );
    }
  });

  commands.addCommand(CommandIDs.openRun, {
    label: 'Open run dashboard',
    execute: async args => {
      const run = model.runs.find(r => r.name === args.name);
      if (run) {
        await openRun(app, notebooks, run);
      }
    }
  });

  if (palette) {
    const category = 'Ray Training';
    for (const command of [
      CommandIDs.connect,
      CommandIDs.insertTrainingCell,
      CommandIDs.openTutorials,
      CommandIDs.openSidebar
    ]) {
      palette.addItem({ command, category });
    }
  }
}

/**
 * Open the notebook that started the run; when it is unknown or gone,
 * attach to the run from the active notebook instead.
 */
async function openRun(
  app: JupyterFrontEnd,
  notebooks: INotebookTracker,
  run: IRun
): Promise<void> {
  if (run.notebook) {
    const found = await app.serviceManager.contents
      .get(run.notebook, { content: false })
      .then(
        () => true,
        () => false
      );
    if (found) {
      await app.commands.execute('docmanager:open', { path: run.notebook });
      return;
    }
  }
  if (!run.attach_cell) {
    // The server builds the cell only from a run name and address it has checked.
    Notification.error(
      `Cannot open run "${run.name}" here: ${run.error ?? 'the server did not say how to attach to it'}`,
      { autoClose: 10000 }
    );
    return;
  }
  const panel = await activeNotebook(app, notebooks);
  // Connecting again to the same address is a no-op for nbtrain, and it
  // makes the attach work in a notebook that never connected.
  await insertCell(app, panel, loadExtLine(panel) + run.attach_cell, true);
}

/**
 * `%load_ext nbtrain` unless a cell of the notebook already has it: loading
 * twice only prints a warning, but a cell should not start with noise.
 */
function loadExtLine(panel: NotebookPanel): string {
  const loaded = panel.content.widgets.some(cell =>
    cell.model.sharedModel.getSource().includes('%load_ext nbtrain')
  );
  return loaded ? '' : '%load_ext nbtrain\n';
}

/** The notebook the user last worked in, or a new one when there is none. */
async function activeNotebook(
  app: JupyterFrontEnd,
  notebooks: INotebookTracker
): Promise<NotebookPanel> {
  let panel = notebooks.currentWidget;
  if (!panel) {
    panel = (await app.commands.execute('notebook:create-new', {
      kernelName: 'python3'
    })) as NotebookPanel;
  }
  await panel.context.ready;
  return panel;
}

async function insertCell(
  app: JupyterFrontEnd,
  panel: NotebookPanel,
  source: string,
  run: boolean
): Promise<void> {
  const notebook = panel.content;
  const active = notebook.activeCell;
  const reuse =
    active !== null &&
    active.model.type === 'code' &&
    active.model.sharedModel.getSource().trim() === '';
  if (!reuse) {
    NotebookActions.insertBelow(notebook);
  }
  const cell = notebook.activeCell;
  if (!cell) {
    return;
  }
  cell.model.sharedModel.setSource(source);
  app.shell.activateById(panel.id);
  if (run) {
    await panel.sessionContext.ready;
    await NotebookActions.run(notebook, panel.sessionContext);
  }
}
