/**
 * Which notebooks hold the GPU: one poll of nvdash's `api/notebooks.json` per JupyterLab tab, shared by the
 * sidebar section and the status-bar item, and the plain functions that turn its figures into words.
 */
import { IDisposable, DisposableDelegate } from '@lumino/disposable';
import { Poll } from '@lumino/polling';
import { ISignal, Signal } from '@lumino/signaling';

import { INotebookGpu, INotebookKernel, INotebooks, NvdashError, fetchNotebooks } from './api';
import { ServerState, ServerStatus } from './status';

/**
 * What this tab knows of the notebooks: `off` while the server is not up (or not read yet), `absent` when this
 * nvdash was started without the Jupyter server's kernels file (the document answers 404), `error` when the read
 * failed, `ready` with the latest document.
 */
export type NotebooksState =
  | { readonly kind: 'off' }
  | { readonly kind: 'absent' }
  | { readonly kind: 'error'; readonly message: string }
  | { readonly kind: 'ready'; readonly notebooks: INotebooks };

/** How often the notebooks are read while someone looks at them. */
const POLL_INTERVAL_MS = 2000;

/**
 * Reads the notebooks every couple of seconds while the server is up and a viewer is shown; stands by when
 * nobody looks, the browser tab is hidden, or the server answered 404 (until it is restarted).
 */
export class NotebookMonitor implements IDisposable {
  constructor(status: ServerStatus, intervalMs: number = POLL_INTERVAL_MS) {
    this._status = status;
    this._poll = new Poll({
      auto: false,
      factory: () => this.check(),
      frequency: { interval: intervalMs, backoff: false, max: intervalMs },
      name: 'nvdash:notebooks',
      standby: () => (this._idle() ? true : 'when-hidden')
    });
    this._status.changed.connect(this._onStatus);
  }

  /** The latest known state. */
  get state(): NotebooksState {
    return this._state;
  }

  /** Emitted with each new reading, and when the state's kind or error changes. */
  get changed(): ISignal<this, NotebooksState> {
    return this._changed;
  }

  get isDisposed(): boolean {
    return this._poll.isDisposed;
  }

  /**
   * Declares a viewer, counted while `shown()` is true (a status-bar item counts only while the status bar is
   * shown). Polling needs one; the server is not started for it. Dispose to release.
   */
  use(shown: () => boolean = () => true): IDisposable {
    const viewer = { shown };
    this._viewers.add(viewer);
    if (!this._started) {
      this._started = true;
      void this._poll.start();
    }
    if (!this._idle()) {
      void this.check();
    }
    return new DisposableDelegate(() => {
      this._viewers.delete(viewer);
    });
  }

  /**
   * Reads now, unless the server is not up or has no notebooks document. `fresh`: a read that starts after this
   * call (after a kernel action), not one already under way.
   */
  check(fresh = false): Promise<NotebooksState> {
    if (this._status.state.kind !== 'up' || this._absentIn === this._generation()) {
      return Promise.resolve(this._state);
    }
    if (fresh && this._inflight) {
      return this._inflight.then(() => this.check());
    }
    this._inflight ??= this._check().finally(() => {
      this._inflight = null;
    });
    return this._inflight;
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._status.changed.disconnect(this._onStatus);
    this._poll.dispose();
    Signal.clearData(this);
  }

  private async _check(): Promise<NotebooksState> {
    const generation = this._generation();
    let next: NotebooksState;
    try {
      next = { kind: 'ready', notebooks: await fetchNotebooks() };
    } catch (error) {
      if (error instanceof NvdashError && error.status === 404) {
        this._absentIn = generation;
        next = { kind: 'absent' };
      } else {
        const message = error instanceof NvdashError ? error.message : `Unexpected error: ${String(error)}`;
        next = { kind: 'error', message };
        // The server may be gone: let the shared status find out (and the proxy restart it).
        void this._status.check();
      }
    }
    if (this._generation() === generation) {
      this._set(next);
    }
    return this._state;
  }

  private readonly _onStatus = (_sender: ServerStatus, state: ServerState): void => {
    if (state.kind === 'up') {
      if (!this._idle()) {
        void this.check();
      }
    } else {
      this._set({ kind: 'off' });
    }
  };

  /** The server process this tab sees (it changes when the server is restarted); null while it is not up. */
  private _generation(): number | null {
    const state = this._status.state;
    return state.kind === 'up' ? state.generation : null;
  }

  private _idle(): boolean {
    const shown = [...this._viewers].some(viewer => viewer.shown());
    return !shown || this._status.state.kind !== 'up' || this._absentIn === this._generation();
  }

  private _set(state: NotebooksState): void {
    const previous = this._state;
    const same =
      previous.kind === state.kind &&
      state.kind !== 'ready' &&
      (state.kind !== 'error' || (previous.kind === 'error' && previous.message === state.message));
    this._state = state;
    if (!same) {
      this._changed.emit(state);
    }
  }

  private _state: NotebooksState = { kind: 'off' };
  private _absentIn: number | null = null;
  private _started = false;
  private _inflight: Promise<NotebooksState> | null = null;
  private readonly _viewers = new Set<{ readonly shown: () => boolean }>();
  private readonly _status: ServerStatus;
  private readonly _poll: Poll;
  private readonly _changed = new Signal<this, NotebooksState>(this);
}

/** Whether the kernel holds GPU memory: a positive amount, or an unknown amount on some GPU. */
export function holdsMemory(kernel: INotebookKernel): boolean {
  return kernel.memory_bytes === null ? kernel.gpus.length > 0 : kernel.memory_bytes > 0;
}

/** The local kernels that hold GPU memory, the most first (unknown amounts last), then by title. */
export function holders(notebooks: INotebooks): INotebookKernel[] {
  const held = notebooks.kernels.filter(kernel => kernel.local && holdsMemory(kernel));
  return held.sort(
    (a, b) => (b.memory_bytes ?? -1) - (a.memory_bytes ?? -1) || a.title.localeCompare(b.title)
  );
}

/** The kernels that run on another machine, whose GPU use nvdash cannot see. */
export function elsewhere(notebooks: INotebooks): INotebookKernel[] {
  return notebooks.kernels.filter(kernel => !kernel.local);
}

const MIB = 1024 ** 2;
const GIB = 1024 ** 3;

/** GPU memory as nvidia-smi-minded users read it: `3.0 GiB`, `512 MiB` under 1 GiB. */
export function formatMemory(bytes: number): string {
  if (bytes >= GIB - MIB / 2) {
    return `${(bytes / GIB).toFixed(1)} GiB`;
  }
  if (bytes > 0 && bytes < MIB / 2) {
    return '< 1 MiB';
  }
  return `${Math.round(bytes / MIB)} MiB`;
}

/** A kernel's memory, or that it is unknown (NVML gave none for one of its processes). */
export function formatKernelMemory(kernel: INotebookKernel): string {
  return kernel.memory_bytes === null ? 'memory unknown' : formatMemory(kernel.memory_bytes);
}

/** The GPUs a kernel uses: `GPU 0`, `GPUs 0, 1`; a MIG instance by its short UUID: `GPU 0 (MIG-4a8e3f9e)`. */
export function formatGpus(gpus: readonly INotebookGpu[]): string {
  const unit = (gpu: INotebookGpu): string =>
    gpu.mig_uuid ? `${gpu.index} (${shortUuid(gpu.mig_uuid)})` : `${gpu.index}`;
  const units = [...new Set(gpus.map(unit))];
  if (units.length === 0) {
    return 'no GPU';
  }
  return `${units.length === 1 ? 'GPU' : 'GPUs'} ${units.join(', ')}`;
}

/** `MIG-4a8e3f9e-…` → `MIG-4a8e3f9e`: enough to tell instances apart on screen (the title has the whole). */
export function shortUuid(uuid: string): string {
  const match = /^([A-Za-z]+-)?([0-9a-fA-F]{8})/.exec(uuid);
  return match ? `${match[1] ?? ''}${match[2] ?? ''}` : uuid;
}

/** SM utilization in percent, `—` when unknown. */
export function formatPercent(pct: number | null): string {
  return pct === null ? '—' : `${Math.round(pct)} %`;
}

/** How long a kernel has held memory without computing: `idle 45 s`, `idle 4 min`, `idle 2 h 5 min`, `idle 3 d 2 h`. */
export function formatIdle(seconds: number): string {
  const s = Math.max(0, Math.floor(seconds));
  if (s < 60) {
    return `idle ${s} s`;
  }
  const minutes = Math.floor(s / 60);
  if (minutes < 60) {
    return `idle ${minutes} min`;
  }
  const hours = Math.floor(minutes / 60);
  if (hours < 24) {
    return minutes % 60 ? `idle ${hours} h ${minutes % 60} min` : `idle ${hours} h`;
  }
  const days = Math.floor(hours / 24);
  return hours % 24 ? `idle ${days} d ${hours % 24} h` : `idle ${days} d`;
}

/** What a kernel is called on screen: its title (the notebook's path, a console's name, or the kernel's). */
export function kernelLabel(kernel: INotebookKernel): string {
  return kernel.title || kernel.id;
}

/** The path a click opens: a notebook's or file's, not a console's; null when there is none. */
export function openablePath(kernel: INotebookKernel): string | null {
  const session = kernel.sessions.find(s => s.type === 'notebook' || s.type === 'file');
  return session ? session.path : null;
}

/** The status bar's words: `GPU: 3.0 GiB in 2 notebooks`; `≥` when some amount is unknown. */
export function summary(notebooks: INotebooks): string {
  if (notebooks.state !== 'ok') {
    return 'GPU: notebooks unknown';
  }
  const held = holders(notebooks);
  if (held.length === 0) {
    return 'GPU: no notebook holds memory';
  }
  const count = `${held.length} ${held.length === 1 ? 'notebook' : 'notebooks'}`;
  const known = held.filter(kernel => kernel.memory_bytes !== null);
  if (known.length === 0) {
    return `GPU: held by ${count} (amount unknown)`;
  }
  const bytes = known.reduce((sum, kernel) => sum + (kernel.memory_bytes ?? 0), 0);
  return `GPU: ${known.length < held.length ? '≥ ' : ''}${formatMemory(bytes)} in ${count}`;
}
