/**
 * Interrupt, restart or shut down a kernel that holds GPU memory: confirmed in a dialog that says what it frees,
 * then done through Jupyter's own kernel API (the same calls as JupyterLab's Kernel menu).
 */
import { Dialog, showDialog } from '@jupyterlab/apputils';
import { Kernel } from '@jupyterlab/services';

import { INotebookKernel } from './api';
import { formatGpus, formatMemory, kernelLabel } from './notebooks';

/** What can be done to a kernel from the sidebar. */
export type KernelAction = 'interrupt' | 'restart' | 'shutdown';

/** The button labels, in the order they are shown. */
export const ACTION_LABELS: Readonly<Record<KernelAction, string>> = {
  interrupt: 'Interrupt',
  restart: 'Restart',
  shutdown: 'Shut down'
};

/** The part of JupyterLab's kernel manager the actions use. */
export type IKernels = Pick<Kernel.IManager, 'connectTo' | 'shutdown'>;

/** What the action frees, in words: `3.0 GiB of GPU memory on GPU 0`. */
function freed(kernel: INotebookKernel): string {
  const where = formatGpus(kernel.gpus);
  return kernel.memory_bytes === null
    ? `its GPU memory on ${where} (how much is unknown)`
    : `${formatMemory(kernel.memory_bytes)} of GPU memory on ${where}`;
}

/** The question the dialog asks before `action`, e.g. `Shut down the kernel of train/a.ipynb? It frees …`. */
export function confirmation(action: KernelAction, kernel: INotebookKernel): string {
  const label = kernelLabel(kernel);
  switch (action) {
    case 'shutdown':
      return `Shut down the kernel of ${label}? It frees ${freed(kernel)}.`;
    case 'restart':
      return `Restart the kernel of ${label}? It frees ${freed(kernel)}; the kernel's variables are lost.`;
    case 'interrupt':
      return `Interrupt the kernel of ${label}? It may free ${freed(kernel)}, if the interrupted code releases it.`;
  }
}

/** Asks the user; resolves true when they confirmed. */
export async function confirmAction(action: KernelAction, kernel: INotebookKernel): Promise<boolean> {
  const accept =
    action === 'interrupt'
      ? Dialog.okButton({ label: ACTION_LABELS[action] })
      : Dialog.warnButton({ label: ACTION_LABELS[action] });
  const result = await showDialog({
    title: `${ACTION_LABELS[action]} kernel`,
    body: confirmation(action, kernel),
    buttons: [Dialog.cancelButton(), accept]
  });
  return result.button.accept;
}

/** Does `action` through Jupyter's kernel API; rejects with Jupyter's error. */
export async function performAction(kernels: IKernels, action: KernelAction, kernel: INotebookKernel): Promise<void> {
  if (action === 'shutdown') {
    await kernels.shutdown(kernel.id);
    return;
  }
  const connection = kernels.connectTo({ model: { id: kernel.id, name: kernel.name } });
  try {
    if (action === 'restart') {
      await connection.restart();
    } else {
      await connection.interrupt();
    }
  } finally {
    connection.dispose();
  }
}
