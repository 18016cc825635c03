/**
 * The left-sidebar panel "GPU Dashboards": the machine, its GPUs, which notebooks hold them, and one button per
 * dashboard.
 */
import { IDisposable } from '@lumino/disposable';
import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import { IDashboard, describeGpus } from './api';
import { nvdashIcon } from './icons';
import { NotebookSection } from './notebooksection';
import { ServerState, ServerStatus } from './status';

/** What the sidebar needs: the shared server status and what a click on a dashboard does. */
export interface ISidebarOptions {
  readonly status: ServerStatus;
  readonly open: (dashboard: IDashboard) => void;
  /** The "Notebooks on the GPU" section, shown above the dashboards; the sidebar disposes it. */
  readonly notebooks?: NotebookSection | null;
}

/** Lists the dashboards the server offers; says so plainly, with a retry, when the server is not there. */
export class DashboardSidebar extends Widget {
  constructor(options: ISidebarOptions) {
    super();
    this._status = options.status;
    this._open = options.open;
    this._notebooks = options.notebooks ?? null;
    this.id = 'nvdash-sidebar';
    this.addClass('jp-nvdash-Sidebar');
    this.title.icon = nvdashIcon;
    this.title.caption = 'GPU Dashboards';

    const header = document.createElement('header');
    header.className = 'jp-nvdash-Sidebar-header';
    header.textContent = 'GPU Dashboards';
    this._body = document.createElement('div');
    this._body.className = 'jp-nvdash-Sidebar-body';
    this.node.append(header, this._body);

    this._status.changed.connect(this._render);
    this._render(this._status, this._status.state);
  }

  override dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._lease?.dispose();
    this._notebooks?.dispose();
    this._status.changed.disconnect(this._render);
    super.dispose();
  }

  /** The server is started when the panel is first shown, not when JupyterLab loads. */
  protected override onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    this._lease ??= this._status.use();
    this._notebooks?.setShown(true);
  }

  protected override onAfterHide(msg: Message): void {
    super.onAfterHide(msg);
    this._lease?.dispose();
    this._lease = null;
    this._notebooks?.setShown(false);
  }

  private readonly _render = (_sender: ServerStatus, state: ServerState): void => {
    const body = this._body;
    switch (state.kind) {
      case 'idle':
      case 'starting':
        body.replaceChildren(paragraph('jp-nvdash-Sidebar-note', 'Starting the nvdash server…'));
        break;
      case 'down': {
        const retry = document.createElement('button');
        retry.className = 'jp-mod-styled jp-mod-accept jp-nvdash-retry';
        retry.textContent = 'Retry';
        retry.addEventListener('click', () => {
          retry.disabled = true;
          void this._status.check().then(next => {
            if (next.kind === 'down' && retry.disabled) {
              this._render(this._status, next);
            }
          });
        });
        body.replaceChildren(
          paragraph('jp-nvdash-Sidebar-error', `The GPU dashboards are not available. ${state.message}`),
          retry
        );
        break;
      }
      case 'up': {
        const { dashboards, info } = state.catalog;
        const machine = paragraph('jp-nvdash-Sidebar-host', info.hostname);
        const gpus = document.createElement('ul');
        gpus.className = 'jp-nvdash-Sidebar-gpus';
        gpus.append(...describeGpus(info).map(item));
        const parts: HTMLElement[] = [machine];
        if (info.simulated) {
          parts.push(paragraph('jp-nvdash-Sidebar-note', `Simulated GPUs (profile ${info.simulated}).`));
        }
        parts.push(gpus);
        if (this._notebooks) {
          parts.push(this._notebooks.node);
        }
        parts.push(this._list(dashboards));
        body.replaceChildren(...parts);
        break;
      }
    }
  };

  private _list(dashboards: readonly IDashboard[]): HTMLElement {
    const list = document.createElement('ul');
    list.className = 'jp-nvdash-Sidebar-dashboards';
    for (const dashboard of dashboards) {
      const button = document.createElement('button');
      button.className = 'jp-nvdash-Sidebar-dashboard';
      button.dataset.route = dashboard.route;
      button.title = `Open ${dashboard.title} in a pane`;
      const icon = nvdashIcon.element({ tag: 'span', className: 'jp-nvdash-Sidebar-icon' });
      const label = document.createElement('span');
      label.textContent = dashboard.title;
      button.append(icon, label);
      button.addEventListener('click', () => {
        this._open(dashboard);
      });
      const entry = document.createElement('li');
      entry.append(button);
      list.append(entry);
    }
    return list;
  }

  private readonly _status: ServerStatus;
  private readonly _open: (dashboard: IDashboard) => void;
  private readonly _body: HTMLElement;
  private readonly _notebooks: NotebookSection | null;
  private _lease: IDisposable | null = null;
}

function paragraph(className: string, text: string): HTMLParagraphElement {
  const node = document.createElement('p');
  node.className = className;
  node.textContent = text;
  return node;
}

function item(text: string): HTMLLIElement {
  const node = document.createElement('li');
  node.textContent = text;
  return node;
}
