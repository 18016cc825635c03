/**
 * nvdash's JupyterLab extension: plugin wiring only. The sidebar, panes, commands and server calls live in
 * their own modules.
 */
import { ILayoutRestorer, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette, IThemeManager, WidgetTracker } from '@jupyterlab/apputils';
import { IStatusBar } from '@jupyterlab/statusbar';

import { CommandIDs, addPaletteItems, openArgs, registerCommands } from './commands';
import { NotebookMonitor } from './notebooks';
import { NotebookSection } from './notebooksection';
import { addNotebookStatus } from './notebookstatus';
import { DashboardPane } from './pane';
import { DashboardSidebar } from './sidebar';
import { ServerStatus } from './status';

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'nvdash:plugin',
  description: 'GPU Dashboards: live NVIDIA GPU and host dashboards from nvdash, as dockable panes.',
  autoStart: true,
  optional: [ILayoutRestorer, ICommandPalette, IThemeManager, IStatusBar],
  activate: (
    app: JupyterFrontEnd,
    restorer: ILayoutRestorer | null,
    palette: ICommandPalette | null,
    themes: IThemeManager | null,
    statusBar: IStatusBar | null
  ): void => {
    const status = new ServerStatus();
    const monitor = new NotebookMonitor(status);
    const tracker = new WidgetTracker<DashboardPane>({ namespace: 'nvdash' });
    const isDark = (): boolean => {
      const theme = themes?.theme;
      if (themes && theme) {
        return !themes.isLight(theme);
      }
      return document.body.dataset.jpThemeLight === 'false';
    };

    registerCommands(app, { tracker, status, isDark });
    if (palette) {
      addPaletteItems(palette, status);
    }

    const sidebar = new DashboardSidebar({
      status,
      open: dashboard => void app.commands.execute(CommandIDs.open, openArgs(dashboard)),
      notebooks: new NotebookSection({
        monitor,
        kernels: app.serviceManager.kernels,
        open: path => void app.commands.execute('docmanager:open', { path })
      })
    });
    app.shell.add(sidebar, 'left', { rank: 600 });
    if (statusBar) {
      addNotebookStatus(statusBar, monitor, () => {
        app.shell.activateById(sidebar.id);
      });
    }

    if (restorer) {
      restorer.add(sidebar, sidebar.id);
      void restorer.restore(tracker, {
        command: CommandIDs.open,
        args: pane => openArgs(pane.dashboard),
        name: pane => pane.dashboard.route
      });
    }

    themes?.themeChanged.connect(() => {
      const dark = isDark();
      tracker.forEach(pane => {
        pane.dark = dark;
      });
    });
  }
};

export default plugin;
