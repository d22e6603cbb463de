/**
 * Plugin wiring: one RunsModel shared by the sidebar, the status bar item
 * and the commands.
 */
import {
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ICommandPalette, showErrorMessage } from '@jupyterlab/apputils';
import { INotebookTracker, NotebookActions } from '@jupyterlab/notebook';
import { IStatusBar } from '@jupyterlab/statusbar';

import { CommandIDs, SIDEBAR_ID, addCommands } from './commands';
import { RunsModel } from './model';
import { RaySidebar } from './sidebar';
import { RayStatus } from './status';

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'nbtrain:plugin',
  description: 'Ray Training sidebar, status bar item and commands for nbtrain.',
  autoStart: true,
  requires: [INotebookTracker],
  optional: [ICommandPalette, IStatusBar],
  activate: (
    app: JupyterFrontEnd,
    notebooks: INotebookTracker,
    palette: ICommandPalette | null,
    statusBar: IStatusBar | null
  ) => {
    const model = new RunsModel();
    // a cell that starts may launch a run: the status bar counts it as it starts, not at the next slow poll
    NotebookActions.executionScheduled.connect(() => model.watch());
    addCommands({ app, model, notebooks, palette });

    const sidebar = new RaySidebar({
      model,
      onStop: run =>
        void app.commands
          .execute(CommandIDs.stopRun, { name: run.name })
          .catch(console.error),
      onPause: (run, verb) =>
        model
          .steer(run.name, verb)
          .catch(error =>
            showErrorMessage(
              `Could not ${verb} run "${run.name}"`,
              (error as Error).message
            )
          ),
      onOpen: run =>
        void app.commands
          .execute(CommandIDs.openRun, { name: run.name })
          .catch(console.error),
      onCompare: runs =>
        void app.commands
          .execute(CommandIDs.compareRuns, { names: runs.map(run => run.name) })
          .catch(console.error)
    });
    sidebar.id = SIDEBAR_ID;
    app.shell.add(sidebar, 'left', { rank: 700 });

    if (statusBar) {
      const item = new RayStatus(model, () =>
        app.shell.activateById(SIDEBAR_ID)
      );
      statusBar.registerStatusItem('nbtrain:status', {
        item,
        align: 'left',
        rank: 100
      });
    }
  }
};

export default plugin;
