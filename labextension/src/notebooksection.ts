/**
 * The sidebar's "Notebooks on the GPU" section: one row per kernel that holds GPU memory, the most first, with
 * what it holds, how busy it was over the last minute, whether it sits idle, and buttons to free the memory.
 */
import { IDisposable } from '@lumino/disposable';

import { INotebookKernel } from './api';
import { ACTION_LABELS, IKernels, KernelAction, confirmAction, performAction } from './kernelactions';
import {
  NotebookMonitor,
  NotebooksState,
  elsewhere,
  formatGpus,
  formatIdle,
  formatKernelMemory,
  formatPercent,
  holders,
  kernelLabel,
  openablePath
} from './notebooks';

/** The note when no kernel holds GPU memory. */
const EMPTY = 'No notebook of this server holds GPU memory.';

/** What the section needs from JupyterLab. */
export interface INotebookSectionOptions {
  readonly monitor: NotebookMonitor;
  readonly kernels: IKernels;
  /** Opens a notebook (or file) by its path. */
  readonly open: (path: string) => void;
}

/**
 * A DOM section the sidebar places above its dashboard list; hidden while there is nothing to say (the server is
 * not up, or this nvdash has no kernels file). Rows are kept by kernel id, so a poll never swaps a button away
 * under the pointer.
 */
export class NotebookSection implements IDisposable {
  constructor(options: INotebookSectionOptions) {
    this._monitor = options.monitor;
    this._kernels = options.kernels;
    this._open = options.open;
    this.node = document.createElement('section');
    this.node.className = 'jp-nvdash-Notebooks';
    const header = document.createElement('h3');
    header.className = 'jp-nvdash-Notebooks-header';
    header.textContent = 'Notebooks on the GPU';
    this._error = paragraph('jp-nvdash-Notebooks-error', '');
    this._error.hidden = true;
    this._note = paragraph('jp-nvdash-Notebooks-note', '');
    this._holders = document.createElement('ul');
    this._holders.className = 'jp-nvdash-Notebooks-list';
    this._remote = document.createElement('div');
    this._remote.className = 'jp-nvdash-Notebooks-elsewhere';
    this._remoteList = document.createElement('ul');
    this._remote.append(paragraph('jp-nvdash-Notebooks-subheader', 'Not on this machine'), this._remoteList);
    this.node.append(header, this._error, this._note, this._holders, this._remote);
    this._monitor.changed.connect(this._render);
    this._render(this._monitor, this._monitor.state);
  }

  /** The section's element. */
  readonly node: HTMLElement;

  get isDisposed(): boolean {
    return this._disposed;
  }

  /** Starts reading the notebooks while the sidebar is shown; stops when it is hidden. */
  setShown(shown: boolean): void {
    if (shown) {
      this._lease ??= this._monitor.use();
    } else {
      this._lease?.dispose();
      this._lease = null;
    }
  }

  dispose(): void {
    if (this._disposed) {
      return;
    }
    this._disposed = true;
    this._lease?.dispose();
    this._monitor.changed.disconnect(this._render);
  }

  private readonly _render = (_sender: NotebookMonitor, state: NotebooksState): void => {
    switch (state.kind) {
      case 'off':
      case 'absent':
        this.node.hidden = true;
        return;
      case 'error':
        this.node.hidden = false;
        this._show(state.message, [], []);
        return;
      case 'ready': {
        this.node.hidden = false;
        const notebooks = state.notebooks;
        if (notebooks.state !== 'ok') {
          const reason = notebooks.reason ?? `nvdash cannot tell which notebooks hold the GPUs (${notebooks.state}).`;
          this._show(reason, [], []);
        } else {
          const held = holders(notebooks);
          this._show(held.length ? null : EMPTY, held, elsewhere(notebooks));
        }
        return;
      }
    }
  };

  /**
   * Shows a note (or none), the holders' rows and the kernels on other machines. The parts are fixed elements
   * shown or hidden, and rows are reused by kernel id, so a poll moves no node that the pointer may be on.
   */
  private _show(note: string | null, held: readonly INotebookKernel[], remote: readonly INotebookKernel[]): void {
    setText(this._note, note ?? '');
    this._note.hidden = note === null;
    this._note.classList.toggle('jp-nvdash-Notebooks-empty', note === EMPTY);

    const rows = new Map<string, NotebookRow>();
    for (const kernel of held) {
      const row = this._rows.get(kernel.id) ?? new NotebookRow(this._run, this._open);
      row.update(kernel);
      rows.set(kernel.id, row);
    }
    this._rows = rows;
    if (this._errorKernel !== null && !rows.has(this._errorKernel)) {
      this._showError(null); // the kernel it was about is gone or holds nothing any more
    }
    setChildren(this._holders, [...rows.values()].map(row => row.node));
    this._holders.hidden = held.length === 0;

    const names = remote.map(kernel => `${kernel.id}\n${kernelLabel(kernel)}`).join('\n');
    if (names !== this._remoteNames) {
      this._remoteNames = names;
      this._remoteList.replaceChildren(
        ...remote.map(kernel => {
          const entry = document.createElement('li');
          entry.dataset.kernelId = kernel.id;
          entry.textContent = kernelLabel(kernel);
          return entry;
        })
      );
    }
    this._remote.hidden = remote.length === 0;
  }

  /** Confirms and does an action, then reads again at once; a failure is shown as one line. */
  private readonly _run = async (action: KernelAction, kernel: INotebookKernel): Promise<void> => {
    if (!(await confirmAction(action, kernel))) {
      return;
    }
    this._showError(null);
    try {
      await performAction(this._kernels, action, kernel);
    } catch (error) {
      const message = error instanceof Error ? error.message : String(error);
      const what = ACTION_LABELS[action].toLowerCase();
      this._showError(`Could not ${what} the kernel of ${kernelLabel(kernel)}: ${message}`, kernel.id);
    }
    await this._monitor.check(true);
  };

  /** Shows (or clears) the one-line error of the last action, about the kernel `kernelId`. */
  private _showError(message: string | null, kernelId: string | null = null): void {
    this._error.textContent = message ?? '';
    this._error.hidden = message === null;
    this._errorKernel = kernelId;
  }

  private readonly _monitor: NotebookMonitor;
  private readonly _kernels: IKernels;
  private readonly _open: (path: string) => void;
  private readonly _error: HTMLElement;
  private readonly _note: HTMLElement;
  private readonly _holders: HTMLElement;
  private readonly _remote: HTMLElement;
  private readonly _remoteList: HTMLElement;
  private _remoteNames = '';
  private _errorKernel: string | null = null;
  private _rows = new Map<string, NotebookRow>();
  private _lease: IDisposable | null = null;
  private _disposed = false;
}

/** One kernel's row; its elements live as long as the kernel holds memory, and are updated in place. */
class NotebookRow {
  constructor(
    run: (action: KernelAction, kernel: INotebookKernel) => Promise<void>,
    open: (path: string) => void
  ) {
    this.node = document.createElement('li');
    this.node.className = 'jp-nvdash-Notebook';
    const head = document.createElement('div');
    head.className = 'jp-nvdash-Notebook-head';
    this._name = document.createElement('button');
    this._name.className = 'jp-nvdash-Notebook-name';
    this._name.addEventListener('click', () => {
      const path = this._kernel ? openablePath(this._kernel) : null;
      if (path !== null) {
        open(path);
      }
    });
    this._memory = span('jp-nvdash-Notebook-memory');
    head.append(this._name, this._memory);

    const detail = document.createElement('div');
    detail.className = 'jp-nvdash-Notebook-detail';
    this._gpus = span('jp-nvdash-Notebook-gpus');
    this._sm = span('jp-nvdash-Notebook-sm');
    this._sm.title = 'Mean SM utilization of its processes over the last minute';
    this._idle = span('jp-nvdash-Notebook-idleFor');
    detail.append(this._gpus, this._sm, this._idle);

    const actions = document.createElement('div');
    actions.className = 'jp-nvdash-Notebook-actions';
    for (const action of Object.keys(ACTION_LABELS) as KernelAction[]) {
      const button = document.createElement('button');
      button.className = 'jp-nvdash-Notebook-action';
      button.dataset.action = action;
      button.textContent = ACTION_LABELS[action];
      button.addEventListener('click', () => {
        const kernel = this._kernel;
        if (!kernel) {
          return;
        }
        button.disabled = true;
        void run(action, kernel).finally(() => {
          button.disabled = false;
        });
      });
      actions.append(button);
    }
    this.node.append(head, detail, actions);
  }

  readonly node: HTMLLIElement;

  update(kernel: INotebookKernel): void {
    this._kernel = kernel;
    const path = openablePath(kernel);
    const label = kernelLabel(kernel);
    const node = this.node;
    node.dataset.kernelId = kernel.id;
    node.dataset.path = path ?? '';
    node.dataset.memoryBytes = kernel.memory_bytes === null ? '' : String(kernel.memory_bytes);
    node.classList.toggle('jp-nvdash-Notebook-idle', kernel.idle_since !== null);
    setText(this._name, label);
    this._name.disabled = path === null;
    this._name.title = path === null ? `${label} (kernel ${kernel.name}, no notebook to open)` : `Open ${path}`;
    setText(this._memory, formatKernelMemory(kernel));
    setText(this._gpus, formatGpus(kernel.gpus));
    this._gpus.title = kernel.gpus.map(gpu => gpu.mig_uuid ?? gpu.uuid).join('\n');
    setText(this._sm, `SM ${formatPercent(kernel.sm_pct_1min)}`);
    const idle = kernel.idle_since === null ? '' : formatIdle(kernel.idle_s ?? 0);
    setText(this._idle, idle);
    this._idle.hidden = idle === '';
    this._idle.title = idle === '' ? '' : 'It holds GPU memory and has not computed on the GPU since then';
  }

  private _kernel: INotebookKernel | null = null;
  private readonly _name: HTMLButtonElement;
  private readonly _memory: HTMLElement;
  private readonly _gpus: HTMLElement;
  private readonly _sm: HTMLElement;
  private readonly _idle: HTMLElement;
}

/** Makes `nodes` the children of `parent`, touching nothing when they already are. */
function setChildren(parent: HTMLElement, nodes: readonly HTMLElement[]): void {
  const current = parent.children;
  if (current.length !== nodes.length || nodes.some((node, i) => current[i] !== node)) {
    parent.replaceChildren(...nodes);
  }
}

/** Sets an element's text only when it changed (no needless DOM churn at every poll). */
function setText(node: HTMLElement, text: string): void {
  if (node.textContent !== text) {
    node.textContent = text;
  }
}

function span(className: string): HTMLSpanElement {
  const node = document.createElement('span');
  node.className = className;
  return node;
}

function paragraph(className: string, text: string): HTMLParagraphElement {
  const node = document.createElement('p');
  node.className = className;
  node.textContent = text;
  return node;
}
