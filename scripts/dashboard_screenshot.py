"""Screenshot a panel of `lego ui` in headless Chromium: how docs/dashboard.png is made.

    .venv/bin/python scripts/dashboard_screenshot.py -c learn --run RUN --tab overview --out docs/dashboard.png

Serves the dashboard on a free loopback port for the run of the config's work dir, opens the panel, waits until it
shows the run, and saves the whole page. Needs Debian's chromium and chromium-driver (scripts/setup.sh) and
Selenium (the test extra).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from lego.config import load_config
from lego.ui import serve
from lego.ui.app import TABS
from lego.ui.browser import full_page_screenshot, headless_chromium, wait_for_graphs, wait_for_text
from lego.workdir import WorkDir

# What each panel shows once it is rendered (the element and a text it holds).
READY = {"overview": ("overview-stages", "taskset"), "rollouts": ("rollouts-stages", "rollout/"),
         "fidelity": ("fidelity-table", "rollout/"), "tasks": ("task-grid", "task"),
         "trajectory": ("segment-view", "Segment"), "logs": ("log-table", "started"), "harnesses": ("harness-evaluations", "harness")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-c", "--config", default="default")
    parser.add_argument("--run", default=None, help="run id (default: the newest run of the work dir)")
    parser.add_argument("--tab", default="overview", choices=list(TABS))
    parser.add_argument("--out", type=Path, default=Path("docs/dashboard.png"))
    parser.add_argument("--width", type=int, default=1500)
    parser.add_argument("overrides", nargs="*", help="config overrides section.key=value")
    args = parser.parse_args()
    config = load_config(args.config, args.overrides)
    work = WorkDir.create(config.project.work_dir)
    server = serve(work, config, [args.run] if args.run else None, refresh_s=60).start()
    driver = headless_chromium(width=args.width)
    try:
        query = f"?tab={args.tab}" + (f"&run={args.run}" if args.run else "")
        driver.get(server.url + query)
        wait_for_text(driver, "header", args.run or "updated")
        element, text = READY[args.tab]
        wait_for_text(driver, element, text)
        wait_for_graphs(driver)
        print(full_page_screenshot(driver, args.out, args.width))
    finally:
        driver.quit()
        server.shutdown()


if __name__ == "__main__":
    main()
