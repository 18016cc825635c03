/**
 * The `nvdash:open` command and its command-palette entries, one per dashboard the server offers.
 */
import { JupyterFrontEnd } from '@jupyterlab/application';
import { ICommandPalette, WidgetTracker } from '@jupyterlab/apputils';
import { ReadonlyJSONObject, ReadonlyPartialJSONObject } from '@lumino/coreutils';
import { DisposableSet } from '@lumino/disposable';
import { DockLayout } from '@lumino/widgets';

import { IDashboard } from './api';
import { nvdashIcon } from './icons';
import { DashboardPane } from './pane';
import { ServerState, ServerStatus } from './status';

export const CommandIDs = {
  /** Opens (or focuses) a dashboard pane; args `{route: '/GPU-Utilization', title: 'GPU Utilization'}`. */
  open: 'nvdash:open'
} as const;

/** The command palette's category for nvdash. */
export const PALETTE_CATEGORY = 'GPU Dashboards';

/** What the commands work with. */
export interface ICommandOptions {
  readonly tracker: WidgetTracker<DashboardPane>;
  readonly status: ServerStatus;
  readonly isDark: () => boolean;
}

/** The arguments of {@link CommandIDs.open} for a dashboard. */
export function openArgs(dashboard: IDashboard): ReadonlyJSONObject {
  return { route: dashboard.route, title: dashboard.title };
}

/** Registers {@link CommandIDs.open}. */
export function registerCommands(app: JupyterFrontEnd, options: ICommandOptions): void {
  const { tracker, status, isDark } = options;
  app.commands.addCommand(CommandIDs.open, {
    label: args => (typeof args.title === 'string' ? `Open ${args.title}` : 'Open a GPU Dashboard'),
    caption: args => (typeof args.title === 'string' ? `Open the nvdash ${args.title} dashboard in a pane` : ''),
    icon: args => (args.isPalette ? undefined : nvdashIcon),
    describedBy: {
      args: {
        type: 'object',
        properties: {
          route: { type: 'string', description: 'The dashboard route, e.g. /GPU-Utilization' },
          title: { type: 'string', description: 'The pane title' }
        },
        required: ['route']
      }
    },
    execute: args => {
      const dashboard = dashboardFrom(args);
      const existing = tracker.find(pane => pane.dashboard.route === dashboard.route);
      if (existing) {
        app.shell.activateById(existing.id);
        return existing;
      }
      const panes: DashboardPane[] = [];
      tracker.forEach(pane => panes.push(pane));
      const pane = new DashboardPane({ dashboard, status, dark: isDark() });
      void tracker.add(pane);
      app.shell.add(pane, 'main', placement(panes));
      app.shell.activateById(pane.id);
      return pane;
    }
  });
}

/** Keeps one palette entry per dashboard of the latest catalog. */
export function addPaletteItems(palette: ICommandPalette, status: ServerStatus): void {
  let items = new DisposableSet();
  let routes = '';
  const sync = (_sender: ServerStatus, state: ServerState): void => {
    if (state.kind !== 'up') {
      return;
    }
    const dashboards = state.catalog.dashboards;
    const signature = JSON.stringify(dashboards);
    if (signature === routes) {
      return;
    }
    routes = signature;
    items.dispose();
    items = new DisposableSet();
    for (const dashboard of dashboards) {
      items.add(palette.addItem({ command: CommandIDs.open, args: openArgs(dashboard), category: PALETTE_CATEGORY }));
    }
  };
  status.changed.connect(sync);
  sync(status, status.state);
}

function dashboardFrom(args: ReadonlyPartialJSONObject): IDashboard {
  const route = typeof args.route === 'string' ? args.route.trim() : '';
  if (!/^\/[A-Za-z0-9_-]+$/.test(route)) {
    throw new Error(`${CommandIDs.open} needs a dashboard route such as "/GPU-Utilization", not ${JSON.stringify(args.route)}`);
  }
  const title = typeof args.title === 'string' && args.title ? args.title : route.slice(1).replace(/-/g, ' ');
  return { route, title };
}

/**
 * The first dashboard opens beside what the user works on, the second below it, later ones as tabs with
 * the last: dashboards gather on one side of the notebook instead of covering it.
 */
function placement(open: readonly DashboardPane[]): { mode: DockLayout.InsertMode; ref?: string } {
  const last = open[open.length - 1];
  if (last === undefined) {
    return { mode: 'split-right' };
  }
  if (open.length === 1) {
    return { mode: 'split-bottom', ref: last.id };
  }
  return { mode: 'tab-after', ref: last.id };
}
