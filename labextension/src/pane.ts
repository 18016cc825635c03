/**
 * A dashboard as a main-area pane: an iframe of its route, or a plain message with a retry button.
 */
import { IFrame } from '@jupyterlab/ui-components';
import { IDisposable } from '@lumino/disposable';
import { Message } from '@lumino/messaging';
import { Panel, Widget } from '@lumino/widgets';

import { IDashboard, dashboardUrl } from './api';
import { nvdashIcon } from './icons';
import { ServerState, ServerStatus } from './status';

/** What a pane needs to know. */
export interface IPaneOptions {
  readonly dashboard: IDashboard;
  readonly status: ServerStatus;
  /** Whether JupyterLab shows a dark theme now. */
  readonly dark: boolean;
}

/**
 * One open dashboard. Its id derives from its route, so a route is open at most once.
 *
 * A pane loads its page only while it is shown: a pane restored, re-themed or reconnected while hidden behind
 * another tab loads when it is next shown, so a layout with many panes does not open every session at once.
 */
export class DashboardPane extends Panel {
  constructor(options: IPaneOptions) {
    super();
    this.dashboard = options.dashboard;
    this._status = options.status;
    this._dark = options.dark;
    this.id = DashboardPane.idFor(this.dashboard.route);
    this.addClass('jp-nvdash-Pane');
    this.title.label = this.dashboard.title;
    this.title.caption = `${this.dashboard.title} (nvdash)`;
    this.title.icon = nvdashIcon;
    this.title.closable = true;
    this.node.tabIndex = -1;

    this._frame = new IFrame({ sandbox: ['allow-scripts', 'allow-same-origin'], referrerPolicy: 'same-origin' });
    this._frame.addClass('jp-nvdash-Pane-frame');
    this._frame.node.querySelector('iframe')?.setAttribute('title', this.dashboard.title);
    this.addWidget(this._frame);

    this._message = new Widget();
    this._message.addClass('jp-nvdash-Pane-message');
    this.addWidget(this._message);

    this._status.changed.connect(this._onStatus);
    this._lease = this._status.use();
    this._onStatus(this._status, this._status.state);
  }

  /** The pane id for a route: `nvdash-GPU-Utilization`. */
  static idFor(route: string): string {
    return `nvdash${route.replace(/[^A-Za-z0-9_-]/g, '-')}`;
  }

  readonly dashboard: IDashboard;

  /** The page the iframe shows, or null while it shows a message instead. */
  get url(): string | null {
    return this._frame.url || null;
  }

  /** Follows JupyterLab's theme: a new theme reloads the dashboard with the matching Bokeh theme. */
  set dark(value: boolean) {
    if (value !== this._dark) {
      this._dark = value;
      if (this._status.state.kind === 'up') {
        this._show();
      }
    }
  }

  get dark(): boolean {
    return this._dark;
  }

  /** Loads the dashboard again (a new Bokeh session). */
  reload(): void {
    this._frame.url = '';
    this._show();
  }

  override dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._lease.dispose();
    this._status.changed.disconnect(this._onStatus);
    super.dispose();
  }

  protected override onAfterAttach(msg: Message): void {
    super.onAfterAttach(msg);
    this._loadPending();
  }

  protected override onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    this._loadPending();
  }

  protected override onActivateRequest(msg: Message): void {
    super.onActivateRequest(msg);
    (this._message.node.querySelector('button') ?? this.node).focus();
  }

  private readonly _onStatus = (_sender: ServerStatus, state: ServerState): void => {
    switch (state.kind) {
      case 'idle':
      case 'starting':
        if (!this._frame.url && this._pending === null) {
          this._say('Starting the nvdash server…', null);
        }
        break;
      case 'up':
        // A new server process (first start, back after a stop, restarted) has none of our sessions.
        if (state.generation !== this._generation) {
          this._generation = state.generation;
          this.reload();
        }
        break;
      case 'down':
        this._pending = null;
        this._frame.url = '';
        this._say(`${this.dashboard.title} is not available. ${state.message}`, 'Retry');
        break;
    }
  };

  private _show(): void {
    this.removeClass('jp-mod-message');
    this._message.node.replaceChildren();
    this._pending = dashboardUrl(this.dashboard.route, this._dark);
    this._loadPending();
  }

  /** Points the iframe at the wanted page if the pane is shown now; a hidden pane waits until it is. */
  private _loadPending(): void {
    const url = this._pending;
    if (url === null || !this.isVisible) {
      return;
    }
    this._pending = null;
    if (this._frame.url !== url) {
      this._frame.url = url;
    }
  }

  private _say(text: string, action: string | null): void {
    this.addClass('jp-mod-message');
    const node = this._message.node;
    const paragraph = document.createElement('p');
    paragraph.className = 'jp-nvdash-message-text';
    paragraph.textContent = text;
    node.replaceChildren(paragraph);
    if (action !== null) {
      const button = document.createElement('button');
      button.className = 'jp-mod-styled jp-mod-accept jp-nvdash-retry';
      button.textContent = action;
      button.addEventListener('click', () => {
        button.disabled = true;
        paragraph.textContent = 'Retrying: starting the nvdash server…';
        void this._status.check().then(state => {
          if (state.kind === 'down' && button.disabled) {
            this._onStatus(this._status, state);
          }
        });
      });
      node.appendChild(button);
    }
  }

  private readonly _frame: IFrame;
  private readonly _message: Widget;
  private readonly _status: ServerStatus;
  private readonly _lease: IDisposable;
  private _dark: boolean;
  private _generation = 0;
  /** The page to load when the pane is next shown, or null when the iframe shows what it should. */
  private _pending: string | null = null;
}
