/**
 * The status-bar item "GPU: 3.0 GiB in 2 notebooks": how much GPU memory this server's notebooks hold, always in
 * view; a click opens the GPU Dashboards sidebar.
 */
import { IStatusBar } from '@jupyterlab/statusbar';
import { IDisposable } from '@lumino/disposable';
import { Signal } from '@lumino/signaling';
import { Widget } from '@lumino/widgets';

import { NotebookMonitor, NotebooksState, summary } from './notebooks';

/** The item's id in the status bar. */
export const STATUS_ITEM_ID = 'nvdash:notebooks';

/** The status-bar widget: its text follows the monitor's readings. */
export class NotebookStatusItem extends Widget {
  constructor(monitor: NotebookMonitor, openSidebar: () => void) {
    super({ node: document.createElement('button') });
    this._monitor = monitor;
    this.id = 'nvdash-notebooks-status';
    this.addClass('jp-nvdash-NotebooksStatus');
    this.node.title = 'Which notebooks hold GPU memory: open the GPU Dashboards sidebar';
    this.node.addEventListener('click', openSidebar);
    this._monitor.changed.connect(this._render);
    this._render(this._monitor, this._monitor.state);
  }

  /** Whether there is something to show: a reading of this server's notebooks. */
  get active(): boolean {
    const kind = this._monitor.state.kind;
    return kind === 'ready' || kind === 'error';
  }

  override dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._monitor.changed.disconnect(this._render);
    super.dispose();
  }

  private readonly _render = (_sender: NotebookMonitor, state: NotebooksState): void => {
    const text =
      state.kind === 'ready' ? summary(state.notebooks) : state.kind === 'error' ? 'GPU: notebooks unknown' : '';
    if (this.node.textContent !== text) {
      this.node.textContent = text;
    }
    this.node.dataset.state = state.kind === 'ready' ? state.notebooks.state : state.kind;
  };

  private readonly _monitor: NotebookMonitor;
}

/**
 * Adds the item to the status bar; it is shown only while the server is up and answers with its notebooks, and
 * it keeps the readings going while the status bar itself is shown (it does not start the server).
 */
export function addNotebookStatus(
  statusBar: IStatusBar,
  monitor: NotebookMonitor,
  openSidebar: () => void
): IDisposable {
  const item = new NotebookStatusItem(monitor, openSidebar);
  const activeStateChanged = new Signal<NotebookStatusItem, void>(item);
  let active = item.active;
  monitor.changed.connect(() => {
    if (item.active !== active) {
      active = item.active;
      activeStateChanged.emit(undefined);
    }
  }, item);
  const registration = statusBar.registerStatusItem(STATUS_ITEM_ID, {
    item,
    align: 'left',
    rank: 100,
    isActive: () => item.active,
    activeStateChanged
  });
  // The item's parent is a side of the status bar: readings go on while the bar is shown, even while the item
  // hides itself (else it would never learn that it has something to show).
  const lease = monitor.use(() => item.parent?.isVisible ?? false);
  return {
    get isDisposed() {
      return item.isDisposed;
    },
    dispose() {
      lease.dispose();
      registration.dispose();
      Signal.clearData(item);
      item.dispose();
    }
  };
}
