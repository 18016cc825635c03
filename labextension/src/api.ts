/**
 * Talking to the nvdash server that jupyter-server-proxy starts on demand under `<base_url>nvdash/`.
 */
import { PageConfig, URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

/** The jupyter-server-proxy entry point's name, and so the URL path under the base URL. */
export const PROXY_NAME = 'nvdash';

/** A dashboard route offered by the server, e.g. `{route: '/GPU-Utilization', title: 'GPU Utilization'}`. */
export interface IDashboard {
  readonly route: string;
  readonly title: string;
}

/** One GPU as `info.json` describes it. */
export interface IGpu {
  readonly index: number;
  readonly name: string;
}

/** What `info.json` says about the machine. */
export interface IServerInfo {
  readonly hostname: string;
  readonly driver_version: string | null;
  readonly simulated: string | null;
  readonly nvml_error: string | null;
  readonly gpus: readonly IGpu[];
}

/** The dashboards and the machine, read together. */
export interface ICatalog {
  readonly dashboards: readonly IDashboard[];
  readonly info: IServerInfo;
}

/** The nvdash server could not be reached; `message` is one plain sentence for the user. */
export class NvdashError extends Error {
  constructor(
    message: string,
    readonly status: number | null = null
  ) {
    super(message);
    this.name = 'NvdashError';
  }
}

/** The absolute path of something the nvdash server serves, e.g. `nvdashUrl('GPU-Memory')`. */
export function nvdashUrl(...parts: string[]): string {
  const cleaned = parts.map(part => part.replace(/^\/+/, ''));
  return URLExt.join(PageConfig.getBaseUrl(), PROXY_NAME, ...cleaned);
}

/** The URL of a dashboard in the light or dark Bokeh theme. */
export function dashboardUrl(route: string, dark: boolean): string {
  return `${nvdashUrl(route)}?theme=${dark ? 'dark' : 'light'}`;
}

/** How long a request may take when it starts the server (Jupyter waits for nvdash to come up). */
const START_TIMEOUT_MS = 120_000;
/** How long a health check of a running server may take. */
const HEALTH_TIMEOUT_MS = 10_000;

/** GET a JSON document from the nvdash server through Jupyter (its token and cookies authenticate us). */
export async function requestJson<T>(path: string, timeoutMs: number = START_TIMEOUT_MS): Promise<T> {
  const settings = ServerConnection.makeSettings();
  const url = nvdashUrl(path);
  let response: Response;
  try {
    const init: RequestInit = { method: 'GET', cache: 'no-store', signal: AbortSignal.timeout(timeoutMs) };
    response = await ServerConnection.makeRequest(url, init, settings);
  } catch (error) {
    if (error instanceof Error && error.name === 'TimeoutError') {
      throw new NvdashError(`The nvdash server did not answer within ${timeoutMs / 1000} s.`);
    }
    throw new NvdashError(`JupyterLab's server cannot be reached (${String(error)}).`);
  }
  if (!response.ok) {
    throw new NvdashError(await describeFailure(response), response.status);
  }
  try {
    return (await response.json()) as T;
  } catch {
    throw new NvdashError(`${url} did not answer with JSON: is something other than nvdash serving it?`);
  }
}

/** Reads `index.json` and `info.json`; the first call starts the server (this can take a few seconds). */
export async function fetchCatalog(): Promise<ICatalog> {
  const [index, info] = await Promise.all([
    requestJson<Record<string, string>>('index.json'),
    requestJson<IServerInfo>('info.json')
  ]);
  const dashboards = Object.entries(index).map(([route, title]) => ({ route, title }));
  return { dashboards, info };
}

/** The part of `health` the extension reads: when the server process started (it changes on a restart). */
export interface IHealth {
  readonly started_at: number;
}

/** The server's health; rejects with an {@link NvdashError} when it does not answer. */
export function checkHealth(): Promise<IHealth> {
  return requestJson<IHealth>('health', HEALTH_TIMEOUT_MS);
}

/** One Jupyter session of a kernel: a notebook, console or file that uses it. */
export interface INotebookSession {
  readonly path: string;
  readonly name: string;
  readonly type: string;
}

/** A kernel's use of one GPU (or MIG instance). */
export interface INotebookGpu {
  readonly index: number;
  readonly uuid: string;
  readonly mig_uuid: string | null;
  readonly memory_bytes: number | null;
  readonly sm_pct: number | null;
  readonly pids: readonly number[];
}

/** One kernel of the Jupyter server and the GPU memory and time it holds (`gpus` empty: none). */
export interface INotebookKernel {
  readonly id: string;
  readonly name: string;
  readonly title: string;
  /** False when the kernel runs on another machine than the one nvdash reads: nvdash cannot see its GPU use. */
  readonly local: boolean;
  readonly pid: number | null;
  readonly execution_state: string | null;
  readonly sessions: readonly INotebookSession[];
  readonly memory_bytes: number | null;
  readonly sm_pct: number | null;
  readonly sm_pct_1min: number | null;
  readonly idle_since: number | null;
  readonly idle_s: number | null;
  readonly holding_since: number | null;
  readonly gpus: readonly INotebookGpu[];
  readonly pids: readonly number[];
}

/** Whether nvdash could join the Jupyter server's kernels to the GPU processes (`ok`), or why not. */
export type NotebookJoinState =
  | 'ok'
  | 'waiting'
  | 'unreadable'
  | 'elsewhere'
  | 'no_gpu'
  | 'no_processes'
  | 'pid_namespace';

/** What `api/notebooks.json` says: which kernels of the Jupyter server hold GPU memory. */
export interface INotebooks {
  readonly state: NotebookJoinState;
  /** One plain sentence for every state but `ok`. */
  readonly reason: string | null;
  readonly time: number | null;
  readonly base_url: string | null;
  readonly memory_bytes: number | null;
  readonly kernels: readonly INotebookKernel[];
}

/**
 * Reads `api/notebooks.json`; rejects with an {@link NvdashError} whose `status` is 404 when this nvdash was
 * started without the Jupyter server's kernels file, and with a plain one when the answer is not that document.
 */
export async function fetchNotebooks(): Promise<INotebooks> {
  const body = await requestJson<unknown>('api/notebooks.json', HEALTH_TIMEOUT_MS);
  if (!isNotebooks(body)) {
    throw new NvdashError(`${nvdashUrl('api/notebooks.json')} did not answer with the notebooks document.`);
  }
  return body;
}

/** A shallow check of the document's shape: enough that rendering it cannot throw. */
function isNotebooks(body: unknown): body is INotebooks {
  if (typeof body !== 'object' || body === null) {
    return false;
  }
  const { state, kernels } = body as { state?: unknown; kernels?: unknown };
  return (
    typeof state === 'string' &&
    Array.isArray(kernels) &&
    kernels.every(
      (kernel: unknown) =>
        typeof kernel === 'object' &&
        kernel !== null &&
        typeof (kernel as { id?: unknown }).id === 'string' &&
        typeof (kernel as { title?: unknown }).title === 'string' &&
        Array.isArray((kernel as { gpus?: unknown }).gpus) &&
        Array.isArray((kernel as { sessions?: unknown }).sessions)
    )
  );
}

/**
 * The GPUs as short lines, consecutive GPUs of one model together: `GPUs 0–7: NVIDIA H100 80GB HBM3`;
 * with no GPU, the reason NVML gave.
 */
export function describeGpus(info: IServerInfo): string[] {
  if (info.gpus.length === 0) {
    return [`No GPU: ${info.nvml_error ?? 'none was found'}.`];
  }
  const groups: { first: number; last: number; name: string }[] = [];
  for (const gpu of info.gpus) {
    const group = groups[groups.length - 1];
    if (group?.name === gpu.name && group.last + 1 === gpu.index) {
      group.last = gpu.index;
    } else {
      groups.push({ first: gpu.index, last: gpu.index, name: gpu.name });
    }
  }
  return groups.map(({ first, last, name }) =>
    first === last ? `GPU ${first}: ${name}` : `GPUs ${first}–${last}: ${name}`
  );
}

async function describeFailure(response: Response): Promise<string> {
  const detail = await errorDetail(response);
  const status = `HTTP ${response.status}${detail ? `: ${detail}` : ''}`;
  switch (response.status) {
    case 404:
      return (
        `Nothing answers at ${nvdashUrl()} (${status}). Is jupyter-server-proxy installed and enabled ` +
        'in this Jupyter server? See "jupyter server extension list".'
      );
    case 403:
    case 401:
      return `Jupyter refused the request (${status}). Log in to JupyterLab again and retry.`;
    case 500:
    case 502:
    case 503:
    case 504:
    case 599:
      return `The nvdash server could not start or stopped answering (${status}). Its error is in the Jupyter server's log.`;
    default:
      return `The nvdash server answered ${status}.`;
  }
}

async function errorDetail(response: Response): Promise<string> {
  let text: string;
  try {
    text = await response.text();
  } catch {
    return response.statusText;
  }
  const type = response.headers.get('Content-Type') ?? '';
  if (type.includes('json')) {
    try {
      const body = JSON.parse(text) as { message?: unknown; reason?: unknown };
      const message = body.message ?? body.reason;
      if (typeof message === 'string' && message) {
        return message;
      }
    } catch {
      // fall through to the plain text
    }
  }
  if (type.includes('html')) {
    const page = new DOMParser().parseFromString(text, 'text/html');
    const error = page.querySelector('.error pre') ?? page.querySelector('.error p') ?? page.body;
    text = error.textContent;
  }
  const squeezed = text.replace(/\s+/g, ' ').trim();
  return squeezed.length > 200 ? `${squeezed.slice(0, 197)}...` : squeezed || response.statusText;
}
