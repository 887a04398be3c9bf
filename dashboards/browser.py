"""Open a report page in a real headless browser, as a user would, and say what it saw.

`audit_page` loads a page from disk in the machine's Chromium (driven by Playwright, which downloads
no browser of its own), with the network cut: every request that is not a local file is blocked and
recorded. It returns the console errors, the blocked requests, the headline text and every figure's
axis titles as Plotly drew them, and optionally saves a screenshot of the first screen. The report
browser test asserts on it; `python -m genrec.dashboards.browser PAGE --screenshot OUT.png` makes the
README's screenshot.
"""

from __future__ import annotations

import argparse
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from genrec.workloads.errors import UserInputError

CHROMIUM_CANDIDATES = ("chromium", "chromium-browser", "google-chrome")
# a closed network: without these, Chromium keeps trying to reach Google's services
CHROMIUM_ARGS = (
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)

# Every Plotly figure's axes and their titles, as drawn (the figure's full layout after Plotly ran).
AXES_JS = """
() => Array.from(document.querySelectorAll('.js-plotly-plot')).map((el, i) => {
  const full = el._fullLayout || {};
  const axes = Object.keys(full).filter(k => /^[xy]axis[0-9]*$/.test(k) && full[k].visible !== false);
  const traces = (el.data || []).length;
  return {index: i, id: el.id, traces: traces,
          title: (full.title && full.title.text) || '',
          axes: axes.map(k => ({name: k, title: (full[k].title && full[k].title.text) || '',
                                range: full[k].range || null, type: full[k].type || ''}))};
})
"""


@dataclass
class PageAudit:
    console_errors: list[str] = field(default_factory=list)
    blocked_requests: list[str] = field(default_factory=list)
    headline: str = ""
    title: str = ""
    first_text: str = ""  # the page's first line of text under its title (the decision, on decoder pages)
    figures: list[dict] = field(default_factory=list)

    def untitled_axes(self) -> list[str]:
        """'figure 2 (id): yaxis3' for every drawn axis without a title."""
        return [
            f"figure {f['index']} ({f['id']}): {a['name']}"
            for f in self.figures
            for a in f["axes"]
            if not a["title"].strip()
        ]


def find_chromium() -> str | None:
    env = os.environ.get("GENREC_CHROMIUM")
    if env:
        return env
    for name in CHROMIUM_CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


def audit_page(
    page_path: str | os.PathLike,
    screenshot: str | os.PathLike | None = None,
    viewport: tuple[int, int] = (1280, 900),
    timeout_s: float = 60.0,
) -> PageAudit:
    """Load `page_path` offline in headless Chromium and report what it saw (see the module doc)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as e:
        raise UserInputError("the browser check needs playwright: pip install playwright") from e
    chromium = find_chromium()
    if chromium is None:
        raise UserInputError(
            "no Chromium found (apt-get install chromium, or set GENREC_CHROMIUM=/path/to/chrome)"
        )
    page_path = Path(page_path).resolve()
    if not page_path.is_file():
        raise UserInputError(f"{page_path}: no such report page")
    audit = PageAudit()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=list(CHROMIUM_ARGS))
        try:
            page = browser.new_page(viewport={"width": viewport[0], "height": viewport[1]})
            page.on("console", lambda m: m.type == "error" and audit.console_errors.append(m.text))
            page.on("pageerror", lambda e: audit.console_errors.append(str(e)))

            def route(r):
                if r.request.url.startswith("file://"):
                    return r.continue_()
                audit.blocked_requests.append(r.request.url)
                return r.abort()

            page.route("**/*", route)
            page.goto(page_path.as_uri(), wait_until="load", timeout=timeout_s * 1000)
            page.wait_for_timeout(300)  # Plotly draws after load
            audit.title = page.title()
            head = page.query_selector(".headline")
            audit.headline = head.inner_text() if head else ""
            lines = [ln.strip() for ln in page.inner_text("main").splitlines() if ln.strip()]
            audit.first_text = lines[1] if len(lines) > 1 else ""
            audit.figures = page.evaluate(AXES_JS)
            if screenshot:
                Path(screenshot).parent.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(screenshot))
        finally:
            browser.close()
    return audit


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("page", help="a report page (HTML) on disk")
    parser.add_argument("--screenshot", help="save the first screen as PNG here")
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=900)
    args = parser.parse_args(argv)
    try:
        audit = audit_page(args.page, args.screenshot, (args.width, args.height))
    except UserInputError as e:
        print(f"error: {e}")
        return 2
    print(f"page: {audit.title}")
    print(f"console errors: {len(audit.console_errors)}; blocked requests: {len(audit.blocked_requests)}")
    print(f"figures: {len(audit.figures)}; axes without a title: {audit.untitled_axes() or 'none'}")
    print("headline:", audit.headline or "(none)")
    if args.screenshot:
        print(f"screenshot: {args.screenshot}")
    return 0 if not audit.console_errors and not audit.blocked_requests else 1


if __name__ == "__main__":
    raise SystemExit(main())
