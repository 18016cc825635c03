"""What opening one dashboard pane costs the server's event loop: building its document from a full store
and serializing it for the browser (Bokeh does both on the event loop when a session opens).

    python benchmarks/open_pane.py [--live-samples 1200] [--profile dgx-h100] [--repeat 5]

Prints, per route, the best and median of ``--repeat`` builds, in milliseconds.
"""

from __future__ import annotations

import argparse
import statistics
import time

from bokeh.document import Document

from nvdash.apps import APPS, AppContext, available_apps
from nvdash.sampling.hardware import open_hardware
from nvdash.sampling.sampler import Sampler
from nvdash.store import Store


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--live-samples", type=int, default=1200, help="snapshots in the store (the default)")
    parser.add_argument("--profile", default="dgx-h100")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    hardware = open_hardware(args.profile)
    try:
        store = Store(hardware.inventory, capacity=args.live_samples)
        sampler = Sampler(store, hardware.host, hardware.gpus, interval_s=0.5)
        for _ in range(args.live_samples):
            sampler.sample_once()
        context = AppContext(store=store, interval_s=0.5)
        print(f"# {args.profile}, {len(hardware.inventory.gpus)} GPUs, {len(store)} snapshots in the store")
        print(f"| {'route':<20} | {'build ms (best/median)':>22} | {'serialize ms (best/median)':>26} |")
        print(f"|{'-' * 22}|{'-' * 24}|{'-' * 28}|")
        for spec in APPS:
            if spec not in available_apps(hardware.inventory):
                continue
            builds, dumps = [], []
            for _ in range(args.repeat):
                doc = Document()
                started = time.perf_counter()
                spec.build(doc, context)
                built = time.perf_counter()
                doc.to_json()
                builds.append((built - started) * 1000)
                dumps.append((time.perf_counter() - built) * 1000)
            build = f"{min(builds):.1f} / {statistics.median(builds):.1f}"
            dump = f"{min(dumps):.1f} / {statistics.median(dumps):.1f}"
            print(f"| {spec.route:<20} | {build:>22} | {dump:>26} |")
    finally:
        hardware.close()


if __name__ == "__main__":
    main()
