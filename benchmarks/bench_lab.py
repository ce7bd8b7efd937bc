"""How fast the lab answers, as a learner sees it: ``attnlab lab``'s server driven by headless Chromium.

Prints (asserts nothing; this is not a test):

* the machine: ``/proc/loadavg`` before and after, the CPU model and whether it has AVX2 / AVX-512 (``lscpu``);
* the live model: the time from pressing *run* to SmolLM2's first heatmap on a fresh server (the model load
  included; the page starts loading the model in the background when it opens, ``--run-after`` seconds earlier)
  and to its views; then the time to the next sentence's heatmap, typed once the views are on the page, and to a
  third's, pressed the moment the second's heatmap appears (:func:`live_latency`);
* slider -> heatmap: the temperature slider moved ``--moves`` times on 8×8 Q, K and V, the time from the key press
  until the heatmap for the new temperature is on the page (median and max).

Run::

    python benchmarks/bench_lab.py                  # the whole benchmark, about a minute
    python benchmarks/bench_lab.py --moves 16 --no-live

Goals (issue 22, a quiet 2-core machine): slider -> heatmap <= 150 ms median, first live heatmap <= 5 s, the next
sentence <= 0.5 s. Chromium is Debian's (/usr/bin/chromium), never a download; the server binds to 127.0.0.1.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import time
from pathlib import Path

import numpy as np

CHROMIUM = "/usr/bin/chromium"
FIRST = "The cat sat on the mat because it was tired"
NEXT = "Paris is the capital of France"
RUSHED, RUSHED_TOKENS = "Birds fly south", 3


def loadavg() -> str:
    """The first three fields of /proc/loadavg (1, 5 and 15 minutes)."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def cpu() -> str:
    """The CPU's model name, core count and vector extensions, from ``lscpu``."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown (no lscpu)"
    model = re.search(r"^Model name:\s*(.+)$", out, re.M)
    cores = re.search(r"^CPU\(s\):\s*(\d+)$", out, re.M)
    flags_line = re.search(r"^Flags:\s*(.+)$", out, re.M)
    flags = set(flags_line[1].split()) if flags_line else set()
    vec = [name for flag, name in (("avx2", "AVX2"), ("avx512f", "AVX-512")) if flag in flags]
    return (
        f"{model[1].strip() if model else 'unknown CPU'}, {cores[1] if cores else '?'} CPUs, "
        f"{' and '.join(vec) if vec else 'neither AVX2 nor AVX-512'}"
    )


def fill(page, name: str, m: np.ndarray) -> None:
    """Type a matrix into the Q, K or V box (one row per line) and leave the box, as a learner does."""
    box = page.locator(f"[data-testid='al-input-{name.lower()}'] textarea")
    box.fill("\n".join(", ".join(f"{x:g}" for x in r) for r in m))
    box.blur()


def slider_latency(page, moves: int) -> list[float]:
    """Milliseconds from each temperature-slider key press to the heatmap drawn for the new temperature (8×8)."""
    from attnlab.lab import logic

    rng = np.random.default_rng(0)
    for name in ("Q", "K", "V"):
        fill(page, name, np.round(rng.normal(size=(8, 8)), 2))
    page.wait_for_function("document.querySelectorAll('#al-weights tr').length === 9")
    page.wait_for_selector("[data-testid='al-pictures'][data-temperature='1'] [data-testid='al-heatmap']")
    slider = page.get_by_role("slider").first
    slider.focus()
    times = []
    for step in range(1, moves + 1):
        t0 = time.perf_counter()
        page.keyboard.press("ArrowRight")
        page.wait_for_selector(
            f"[data-testid='al-pictures'][data-temperature='{logic.num(1 + step / 10)}'] [data-testid='al-heatmap']"
        )
        times.append((time.perf_counter() - t0) * 1000)
    return times


def _press(page, text: str | None) -> float:
    """Type ``text`` into the sentence box (None: keep it), press run; the clock starts at the click."""
    if text is not None:
        page.locator("[data-testid='al-input-sentence'] input").fill(text)
    button = page.get_by_role("button", name="run", exact=True)
    button.scroll_into_view_if_needed()
    t0 = time.perf_counter()
    button.click()
    return t0


def live_latency(page, run_after: float) -> dict[str, float]:
    """Seconds from pressing run to SmolLM2's heatmap: ``first`` on a fresh server (load included), ``views`` until
    that sentence's head view and model view (its last head) are on the page too; ``next``, a sentence typed once the
    page shows the first one's views (a learner reads a sentence's attention before typing the next); ``rushed``, a
    third sentence pressed the moment the second's heatmap appears, while the page still builds the second's views."""
    page.wait_for_timeout(int(run_after * 1000))
    heatmap = "[data-testid='al-live'][data-n='{n}'] [data-testid='al-live-heatmap']"
    t0 = _press(page, None)
    page.wait_for_selector("[data-testid='al-live-heatmap']", timeout=180_000)
    out = {"first": time.perf_counter() - t0}
    page.wait_for_selector("[data-testid='al-head-view'][data-n='10']", timeout=60_000)
    page.wait_for_selector("[data-testid='al-model-view'] [data-layer='29'][data-head='8']", timeout=60_000)
    out["views"] = time.perf_counter() - t0
    t0 = _press(page, NEXT)
    page.wait_for_selector(heatmap.format(n=6), timeout=60_000)
    out["next"] = time.perf_counter() - t0
    t0 = _press(page, RUSHED)
    page.wait_for_selector(heatmap.format(n=RUSHED_TOKENS), timeout=60_000)
    out["rushed"] = time.perf_counter() - t0
    return out


def main(argv: list[str] | None = None) -> int:
    """Start the lab, drive it in Chromium and print the numbers."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--moves", type=int, default=12, help="slider moves to time (at least 8; default 12)")
    ap.add_argument("--no-live", action="store_true", help="skip the live model")
    ap.add_argument(
        "--run-after", type=float, default=0.0, help="seconds between the page opening and pressing run (default 0)"
    )
    args = ap.parse_args(argv)
    if args.moves < 8 or args.moves > 40:
        ap.error(f"--moves: expected an int in [8, 40], got {args.moves}")
    if not 0 <= args.run_after <= 120:
        ap.error(f"--run-after: expected seconds in [0, 120], got {args.run_after}")

    from playwright.sync_api import sync_playwright

    from attnlab.lab.server import start

    print(f"CPU: {cpu()}")
    print(f"load average before: {loadavg()}")
    t_start = time.perf_counter()
    with start() as lab, sync_playwright() as p:
        lab.wait_ready(120)
        print(f"server up in {time.perf_counter() - t_start:.1f} s")
        browser = p.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--disable-background-networking"]
        )
        try:
            page = browser.new_context(viewport={"width": 1300, "height": 1600}).new_page()
            page.set_default_timeout(60_000)
            t0 = time.perf_counter()
            page.goto(lab.url)
            page.wait_for_selector("#al-weights")
            print(f"page open (first weights on the page) in {time.perf_counter() - t0:.1f} s")
            if not args.no_live:
                t = live_latency(page, args.run_after)
                print(
                    f"live SmolLM2-135M: first heatmap {t['first']:.2f} s after pressing run (model load included, "
                    f"run pressed {args.run_after:g} s after the page opened; goal <= 5 s), its views "
                    f"{t['views']:.2f} s; next sentence {t['next']:.2f} s (typed once the views are on the page; "
                    f"goal <= 0.5 s); a sentence pressed the moment the last heatmap appears {t['rushed']:.2f} s"
                )
            times = slider_latency(page, args.moves)
            print(
                f"slider -> heatmap, 8x8: median {statistics.median(times):.0f} ms, max {max(times):.0f} ms over "
                f"{len(times)} moves (goal <= 150 ms median); each: {', '.join(f'{t:.0f}' for t in times)}"
            )
        finally:
            browser.close()
    print(f"load average after: {loadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
