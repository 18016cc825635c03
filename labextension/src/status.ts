/**
 * Whether the nvdash server is up, shared by the sidebar and every pane: one health poll per JupyterLab tab.
 */
import { IDisposable, DisposableDelegate } from '@lumino/disposable';
import { Poll } from '@lumino/polling';
import { ISignal, Signal } from '@lumino/signaling';

import { ICatalog, NvdashError, checkHealth, fetchCatalog } from './api';

/**
 * Where the server stands, as far as this browser tab knows. `generation` counts the server processes seen
 * up: it changes when the server comes back or was restarted in between, and panes then load new sessions.
 */
export type ServerState =
  | { readonly kind: 'idle' }
  | { readonly kind: 'starting' }
  | { readonly kind: 'up'; readonly catalog: ICatalog; readonly generation: number }
  | { readonly kind: 'down'; readonly message: string };

/** How often an up server is checked while someone looks at it. */
const POLL_INTERVAL_MS = 5000;

/**
 * Starts the server on first use (the proxy launches it on the first request) and watches it while a
 * sidebar or pane is shown; polling stops when nobody uses it or the browser tab is hidden.
 */
export class ServerStatus implements IDisposable {
  constructor(intervalMs: number = POLL_INTERVAL_MS) {
    this._poll = new Poll({
      auto: false,
      factory: () => this.check(),
      frequency: { interval: intervalMs, backoff: false, max: intervalMs },
      name: 'nvdash:status',
      standby: () => this._users === 0 || 'when-hidden'
    });
  }

  /** The latest known state. */
  get state(): ServerState {
    return this._state;
  }

  /** Emitted when the state's kind or the catalog changes. */
  get changed(): ISignal<this, ServerState> {
    return this._changed;
  }

  get isDisposed(): boolean {
    return this._poll.isDisposed;
  }

  /** Declares one more viewer; the first one starts the server and the polling. Dispose to release. */
  use(): IDisposable {
    this._users += 1;
    if (this._state.kind === 'idle') {
      void this.check();
    }
    if (!this._started) {
      this._started = true;
      void this._poll.start();
    }
    return new DisposableDelegate(() => {
      this._users = Math.max(0, this._users - 1);
    });
  }

  /** Checks now (starting the server if it is not up); resolves with the new state. */
  check(): Promise<ServerState> {
    this._inflight ??= this._check().finally(() => {
      this._inflight = null;
    });
    return this._inflight;
  }

  dispose(): void {
    this._poll.dispose();
    Signal.clearData(this);
  }

  private async _check(): Promise<ServerState> {
    try {
      if (this._state.kind === 'up') {
        const startedAt = (await checkHealth()).started_at;
        const restarted = startedAt !== this._startedAt;
        this._startedAt = startedAt;
        if (restarted) {
          this._generation += 1;
          this._set({ kind: 'up', catalog: await fetchCatalog(), generation: this._generation });
        }
      } else {
        this._set({ kind: 'starting' });
        const catalog = await fetchCatalog();
        this._startedAt = (await checkHealth()).started_at;
        this._generation += 1;
        this._set({ kind: 'up', catalog, generation: this._generation });
      }
    } catch (error) {
      const message = error instanceof NvdashError ? error.message : `Unexpected error: ${String(error)}`;
      this._set({ kind: 'down', message });
    }
    return this._state;
  }

  private _set(state: ServerState): void {
    const previous = this._state;
    const same =
      previous.kind === state.kind &&
      (state.kind !== 'down' || (previous.kind === 'down' && previous.message === state.message)) &&
      (state.kind !== 'up' || (previous.kind === 'up' && previous.generation === state.generation));
    this._state = state;
    if (!same) {
      this._changed.emit(state);
    }
  }

  private _state: ServerState = { kind: 'idle' };
  private _users = 0;
  private _generation = 0;
  private _startedAt = 0;
  private _started = false;
  private _inflight: Promise<ServerState> | null = null;
  private readonly _poll: Poll;
  private readonly _changed = new Signal<this, ServerState>(this);
}
