"""Which notebook holds the GPU, in a real JupyterLab driven in Chromium.

Two notebooks' real kernels (ipykernel) in a JupyterLab under a non-root base URL; the first kernel starts a child
process (as a data-loader worker is). The simulated GPUs are told, at run time, that these real processes hold GPU
memory: the first kernel 2 GiB and its child 1 GiB on GPU 0 (busy), the second kernel 5 GiB on GPU 1 (idle, 0 %).
A second JupyterLab on the same machine has a kernel holding 6 GiB on GPU 1 too: NVML lists every process of the
machine, but the first lab's sidebar must list its own notebooks only.

Expected values come from what the simulated driver was told (``usedGpuMemory`` in bytes per process): a kernel
holds the sum of its processes' memory.
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Locator, Page, expect

from tests.browser.chromium import artifact, chromium, wait_until_drawn
from tests.browser.test_jupyterlab import open_lab, open_sidebar
from tests.fake_processes import write_process_file
from tests.jupyter.jupyter import NOTEBOOK, JupyterLab, jupyter_lab
from tests.jupyter.kernels import CHILD, PID, api, run_in_kernel, start_session, until

pytestmark = pytest.mark.browser

MIB = 1024 * 1024
BUSY, IDLE, OTHER = "train/a.ipynb", "eval/b.ipynb", "theirs/c.ipynb"
BUSY_MIB, CHILD_MIB, IDLE_MIB, OTHER_MIB = 2048, 1024, 5120, 6144
EXPOSE_APP = ("--LabApp.expose_app_in_browser=True",)
VIEWPORT = {"width": 1400, "height": 900}
UPDATE_TIMEOUT_MS = 60_000
"""nvdash sees a change at its next process reading, the sidebar at its next poll: seconds, more on a loaded
machine."""


@dataclass
class Notebooks:
    """The first lab with its two notebooks' kernels, and the other lab's kernel, all on the simulated GPUs."""

    lab: JupyterLab
    kernel_ids: dict[str, str]
    pids: dict[str, int]
    child: int
    other_pid: int


def write_notebook(lab: JupyterLab, path: str) -> None:
    target = lab.home / "work" / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(NOTEBOOK))


def kernel_pid(lab: JupyterLab, path: str) -> tuple[str, int]:
    """A new session's kernel id, and its process id as the kernel itself tells."""
    write_notebook(lab, path)
    kernel_id = str(start_session(lab, path)["kernel"]["id"])
    return kernel_id, int(run_in_kernel(lab, kernel_id, PID))


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as running:
        yield running


@pytest.fixture(scope="module")
def notebooks() -> Iterator[Notebooks]:
    with tempfile.TemporaryDirectory(prefix="nvdash-gpu-processes-") as folder:
        process_file = Path(folder) / "processes"
        env = {"NVDASH_SIMULATE": "a100-pcie-2", "NVDASH_FAKE_PROCESS_FILE": str(process_file)}
        with jupyter_lab() as other, jupyter_lab(env=env, base_url="/user/alice/", extra_args=EXPOSE_APP) as lab:
            _, other_pid = kernel_pid(other, OTHER)
            ids, pids = {}, {}
            for path in (BUSY, IDLE):
                ids[path], pids[path] = kernel_pid(lab, path)
            child = int(run_in_kernel(lab, ids[BUSY], CHILD))
            try:
                write_process_file(process_file, [
                    "clear_processes:0", "clear_processes:1",
                    f"process:0:{pids[BUSY]}:0.6:{BUSY_MIB}", f"process:0:{child}:0.3:{CHILD_MIB}",
                    f"process:1:{pids[IDLE]}:0:{IDLE_MIB}", f"process:1:{other_pid}:0.5:{OTHER_MIB}",
                ])
                yield Notebooks(lab, ids, pids, child, other_pid)
            finally:
                with suppress(ProcessLookupError):
                    os.kill(child, signal.SIGKILL)


@pytest.fixture(scope="module")
def page(browser: Browser, notebooks: Notebooks) -> Iterator[Page]:
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    open_lab(page, notebooks.lab)
    open_sidebar(page)
    yield page
    context.close()
    assert errors == []


def row(page: Page, kernel_id: str) -> Locator:
    return page.locator(f'#nvdash-sidebar .jp-nvdash-Notebook[data-kernel-id="{kernel_id}"]')


def kernels_of(lab: JupyterLab) -> set[str]:
    status, body = api(lab, "GET", "api/kernels")
    assert status == 200, body
    listed: list[dict[str, Any]] = json.loads(body)
    return {str(kernel["id"]) for kernel in listed}


def test_the_sidebar_lists_this_servers_notebooks_with_their_memory(page: Page, notebooks: Notebooks) -> None:
    busy, idle = row(page, notebooks.kernel_ids[BUSY]), row(page, notebooks.kernel_ids[IDLE])
    expect(busy).to_have_attribute("data-memory-bytes", str((BUSY_MIB + CHILD_MIB) * MIB), timeout=UPDATE_TIMEOUT_MS)
    expect(idle).to_have_attribute("data-memory-bytes", str(IDLE_MIB * MIB), timeout=UPDATE_TIMEOUT_MS)
    expect(busy).to_have_attribute("data-path", BUSY)
    expect(idle).to_have_attribute("data-path", IDLE)
    expect(busy.locator(".jp-nvdash-Notebook-memory")).to_have_text("3.0 GiB")
    expect(busy.locator(".jp-nvdash-Notebook-gpus")).to_have_text("GPU 0")
    expect(idle.locator(".jp-nvdash-Notebook-gpus")).to_have_text("GPU 1")
    # The other server's kernel holds more than either, on a GPU this server uses too: never listed.
    section = page.locator("#nvdash-sidebar .jp-nvdash-Notebooks")
    expect(section.locator(".jp-nvdash-Notebook")).to_have_count(2)
    expect(section).not_to_contain_text(OTHER)
    expect(page.locator("#nvdash-notebooks-status")).to_have_text("GPU: 8.0 GiB in 2 notebooks")


def test_the_notebook_idle_at_zero_percent_is_marked(page: Page, notebooks: Notebooks) -> None:
    busy, idle = row(page, notebooks.kernel_ids[BUSY]), row(page, notebooks.kernel_ids[IDLE])
    expect(idle).to_have_class("jp-nvdash-Notebook jp-nvdash-Notebook-idle", timeout=UPDATE_TIMEOUT_MS)
    expect(idle.locator(".jp-nvdash-Notebook-idleFor")).to_be_visible()
    expect(idle.locator(".jp-nvdash-Notebook-sm")).to_have_text("SM 0 %")
    expect(busy.locator(".jp-nvdash-Notebook-sm")).not_to_have_text("SM 0 %", timeout=UPDATE_TIMEOUT_MS)
    expect(busy).not_to_have_class("jp-nvdash-Notebook jp-nvdash-Notebook-idle")


def test_a_click_on_a_notebook_opens_it_and_the_memory_pane_draws_it(page: Page, notebooks: Notebooks) -> None:
    row(page, notebooks.kernel_ids[BUSY]).locator(".jp-nvdash-Notebook-name").click()
    tab = page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab.lm-mod-current", has_text="a.ipynb")
    expect(tab).to_have_count(1, timeout=UPDATE_TIMEOUT_MS)
    page.locator("#nvdash-sidebar .jp-nvdash-Sidebar-dashboard", has_text="GPU Memory by Notebook").click()
    pane = page.locator("#nvdash-GPU-Memory-by-Notebook")
    expect(pane).to_be_visible()
    handle = pane.locator("iframe").element_handle(timeout=UPDATE_TIMEOUT_MS)
    frame = handle.content_frame()
    assert frame is not None
    wait_until_drawn(frame, UPDATE_TIMEOUT_MS)
    page.screenshot(path=str(artifact("jupyterlab-notebooks.png")))


def test_cancelled_shutdown_keeps_the_kernel(page: Page, notebooks: Notebooks) -> None:
    idle_id = notebooks.kernel_ids[IDLE]
    row(page, idle_id).locator('.jp-nvdash-Notebook-action[data-action="shutdown"]').click()
    dialog = page.locator(".jp-Dialog")
    expect(dialog.locator(".jp-Dialog-body")).to_have_text(
        f"Shut down the kernel of {IDLE}? It frees 5.0 GiB of GPU memory on GPU 1.")
    dialog.locator(".jp-mod-reject").click()
    expect(dialog).to_have_count(0)
    assert idle_id in kernels_of(notebooks.lab)
    expect(row(page, idle_id)).to_have_attribute("data-memory-bytes", str(IDLE_MIB * MIB))


def test_shutting_down_from_the_sidebar_frees_its_memory_in_the_list(page: Page, notebooks: Notebooks) -> None:
    idle_id, busy_id = notebooks.kernel_ids[IDLE], notebooks.kernel_ids[BUSY]
    row(page, idle_id).locator('.jp-nvdash-Notebook-action[data-action="shutdown"]').click()
    page.locator(".jp-Dialog .jp-mod-accept").click()
    expect(row(page, idle_id)).to_have_count(0, timeout=UPDATE_TIMEOUT_MS)
    expect(page.locator("#nvdash-notebooks-status")).to_have_text("GPU: 3.0 GiB in 1 notebook")
    assert idle_id not in kernels_of(notebooks.lab)
    until("the idle kernel's process ended", lambda: None if Path(f"/proc/{notebooks.pids[IDLE]}").exists() else True)
    expect(row(page, busy_id)).to_have_attribute("data-memory-bytes", str((BUSY_MIB + CHILD_MIB) * MIB))
