"""The built site in a real browser: Debian's Chromium driven by Playwright,
over a local HTTP server. Every page loads with no console error and no failed
or external request, math is rendered by the MathJax shipped with the site,
printed text and equations fit the text column (a printed table may scroll,
marked as such), figures open at full size and are not shrunk past legibility
(to under 85% of their drawn width), no page is wider than a phone,
links and images resolve, search works, exercise pages offer the student
notebook, and the home page and a chapter pass axe-core's serious and critical
rules. Screenshots are saved next to the build for a person to look at."""
import functools
import http.server
import json
import shutil
import threading
import urllib.error
import urllib.parse
import urllib.request

import nbformat
import pytest
import yaml

from tests.conftest import REPO, toc_files

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
CHAPTER = "book/principles/scaled_dot_product"
EXERCISE = "exercises/ch4_flash/flash"


def chromium_path():
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.fail("Chromium is not installed: ./scripts/test installs Debian's 'chromium' package when it "
                    "can (as root or with sudo); install it, then run the tests again.")
    return path


@pytest.fixture(scope="module")
def server(site):
    build, _ = site
    handler = functools.partial(_QuietHandler, directory=str(build / "html"))
    httpd = _QuietServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


class _QuietServer(http.server.ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        pass   # a browser closing a connection early is not a failure of the site


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_FLAGS)
        yield chromium
        chromium.close()


class Visit:
    """One page load with everything that went wrong on the way."""

    def __init__(self, browser, base, path):
        self.page = browser.new_page(viewport={"width": 1280, "height": 900})
        self.errors, self.failed, self.external = [], [], []
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("requestfailed", lambda r: self.failed.append(f"{r.url} ({r.failure})"))
        self.page.on("response", lambda r: r.status >= 400 and self.failed.append(f"{r.url} (HTTP {r.status})"))
        self.page.on("request", lambda r: not r.url.startswith((base, "data:", "blob:", "about:"))
                     and self.external.append(r.url))
        self.page.goto(f"{base}/{path}", wait_until="networkidle")

    def close(self):
        self.page.close()


def has_math(page):
    source = next((REPO / page).parent.glob(f"{(REPO / page).name}.*"))
    if source.suffix == ".ipynb":
        cells = nbformat.read(source, as_version=4).cells
        return any("$" in c.source for c in cells if c.cell_type == "markdown")
    return "$" in source.read_text()


def visible_text_outside_code(page):
    return page.evaluate("""() => {
        const body = document.querySelector('main') || document.body;
        const copy = body.cloneNode(true);
        copy.querySelectorAll('pre, code, script, style, mjx-container, .MathJax').forEach(e => e.remove());
        return copy.innerText;
    }""")


@pytest.mark.parametrize("page", toc_files())
def test_page_loads_cleanly_and_renders_its_math(browser, server, page):
    visit = Visit(browser, server, f"{page}.html")
    try:
        assert not visit.errors, f"{page}: console errors: {visit.errors}"
        assert not visit.failed, f"{page}: failed requests: {visit.failed}"
        assert not visit.external, f"{page}: requests that left the site: {visit.external}"
        if has_math(page):
            visit.page.wait_for_selector("mjx-container", state="attached", timeout=20_000)
            assert visit.page.locator("mjx-container").count() > 0
            text = visible_text_outside_code(visit.page)
            for raw in ("$$", "\\frac", "\\sqrt", "\\begin{"):
                assert raw not in text, f"{page}: unrendered math ({raw!r}) is visible"
        missing_alt = visit.page.locator("main img:not([alt]), main img[alt='']").count()
        assert missing_alt == 0, f"{page}: {missing_alt} images without alt text"
        # Printed text wraps and equations fit; a printed table may scroll, marked by a shadow and a scrollbar.
        hidden = visit.page.evaluate("""() => [...document.querySelectorAll(
                'div.cell_output pre, mjx-container[display="true"]')]
            .filter(e => e.scrollWidth > e.clientWidth + 1 && !e.matches('pre.printed-table.wider-than-column'))
            .map(e => e.innerText.slice(0, 80))""")
        assert not hidden, f"{page}: outputs or equations wider than the column, partly hidden: {hidden[:3]}"
        unlinked = visit.page.evaluate("""() => [...document.querySelectorAll('div.cell_output img')]
            .filter(img => img.closest('a.full-size-figure')?.getAttribute('href') !== img.getAttribute('src'))
            .map(img => img.getAttribute('src'))""")
        assert not unlinked, f"{page}: figures that do not open at full size: {unlinked}"
        # A figure drawn wider than the column is shrunk to it, and its labels with it: at most by 15%.
        shrunk = visit.page.evaluate("""() => [...document.querySelectorAll('div.cell_output img')]
            .filter(img => img.naturalWidth > 0 && img.getBoundingClientRect().width < 0.85 * img.naturalWidth)
            .map(img => `${img.getAttribute('src')} (${img.naturalWidth} px shown at ${
                Math.round(img.getBoundingClientRect().width)})`)""")
        assert not shrunk, f"{page}: figures shrunk to under 85% of their drawn size, labels too small: {shrunk}"
    finally:
        visit.close()


@pytest.mark.parametrize("page", toc_files())
def test_no_page_scrolls_sideways_on_a_phone(browser, server, page):
    """At a phone's width (390 px) the page itself fits: wide figures, tables, widgets and
    equations scroll or shrink inside their own boxes, and long code names wrap."""
    view = browser.new_page(viewport={"width": 390, "height": 844})
    try:
        view.goto(f"{server}/{page}.html", wait_until="networkidle")
        width = view.evaluate("() => document.documentElement.scrollWidth")
    finally:
        view.close()
    assert width <= 391, f"{page}: the page is {width} px wide on a 390 px screen"


def test_chapter_page_has_copy_buttons_navigation_and_outputs(browser, server):
    visit = Visit(browser, server, f"{CHAPTER}.html")
    try:
        code_cells = visit.page.locator("div.cell div.highlight pre").count()
        copy_buttons = visit.page.locator("button.copybtn").count()
        outputs = visit.page.locator("div.cell_output").count()
        next_link = visit.page.locator(".prev-next-area a.right-next").count()
        previous_link = visit.page.locator(".prev-next-area a.left-prev").count()
    finally:
        visit.close()
    assert code_cells > 3 and copy_buttons >= code_cells and outputs > 0
    assert next_link == 1 and previous_link == 1


def _status(url):
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code


def test_every_internal_link_and_image_resolves(browser, server):
    targets = {}
    for page in toc_files():
        visit = Visit(browser, server, f"{page}.html")
        try:
            urls = visit.page.evaluate("""() => [
                ...[...document.querySelectorAll('a[href]')].map(a => a.href),
                ...[...document.querySelectorAll('img[src]')].map(i => i.src),
                ...[...document.querySelectorAll('link[href]')].map(l => l.href),
                ...[...document.querySelectorAll('script[src]')].map(s => s.src)]""")
        finally:
            visit.close()
        for url in urls:
            if url.startswith(server):
                targets.setdefault(urllib.parse.urldefrag(url)[0], page)
    assert len(targets) > 50
    broken = [f"{url} (linked from {page}): {status}" for url, page in sorted(targets.items())
              if (status := _status(url)) != 200]
    assert not broken, "\n".join(broken)


def test_search_finds_the_chapter_for_softmax(browser, server):
    visit = Visit(browser, server, "search.html?q=softmax")
    try:
        visit.page.wait_for_selector("#search-results li a", timeout=30_000)
        hits = visit.page.eval_on_selector_all("#search-results li a", "links => links.map(a => a.href)")
    finally:
        visit.close()
    assert any("book/principles/stable_softmax" in h for h in hits), hits[:10]


def test_exercise_pages_offer_the_student_notebook_and_launch_buttons(browser, server):
    config = yaml.safe_load((REPO / "_config.yml").read_text())
    repository = config["repository"]["url"].removeprefix("https://github.com/")
    visit = Visit(browser, server, f"{EXERCISE}.html")
    try:
        links = visit.page.eval_on_selector_all("a[href]", "links => links.map(a => a.href)")
    finally:
        visit.close()
    downloads = [h for h in links if h.startswith(server) and h.endswith(".ipynb")]
    assert downloads, "no .ipynb download on the exercise page"
    with urllib.request.urlopen(downloads[0]) as response:
        served = nbformat.reads(response.read().decode(), as_version=4)
    student = nbformat.read(REPO / f"{EXERCISE}.ipynb", as_version=4)
    assert [c.source for c in served.cells] == [c.source for c in student.cells]
    assert "BEGIN SOLUTION" not in json.dumps(served) and "BEGIN HIDDEN TESTS" not in json.dumps(served)
    assert any(h.startswith("https://colab.research.google.com/github/") and repository in h
               and h.endswith(f"{EXERCISE}.ipynb") for h in links), "no Colab launch link"
    assert any(h.startswith("https://mybinder.org/v2/gh/") and repository in h for h in links), "no Binder link"


@pytest.mark.parametrize("name, path", [("home", "book/intro.html"), ("chapter", f"{CHAPTER}.html")])
def test_screenshot_and_accessibility(browser, server, site, name, path):
    from axe_playwright_python.sync_playwright import Axe

    build, _ = site
    visit = Visit(browser, server, path)
    try:
        shots = build / "screenshots"
        shots.mkdir(exist_ok=True)
        visit.page.screenshot(path=str(shots / f"{name}.png"), full_page=False)
        print(f"screenshot: {shots / f'{name}.png'}")
        results = Axe().run(visit.page)
    finally:
        visit.close()
    assert (shots / f"{name}.png").stat().st_size > 10_000
    serious = [f"{v['id']} ({v['impact']}): {v['help']} — {[n['target'] for n in v['nodes']][:3]}"
               for v in results.response["violations"] if v["impact"] in ("serious", "critical")]
    assert not serious, "\n".join(serious)


def test_publish_workflow_builds_with_the_readme_command_and_uploads_the_site():
    workflow = yaml.safe_load((REPO / ".github" / "workflows" / "pages.yml").read_text())
    steps = workflow["jobs"]["build"]["steps"]
    assert any(step.get("run") == "./scripts/build" for step in steps)
    upload = next(step for step in steps if str(step.get("uses", "")).startswith("actions/upload-pages-artifact"))
    assert upload["with"]["path"] == "_build/html"
    assert workflow["jobs"]["deploy"]["needs"] == "build"
    assert "./scripts/build" in (REPO / "README.md").read_text()


def test_serve_command_serves_the_built_site(site, tmp_path):
    import socket
    import subprocess
    import time

    build, _ = site
    checkout = tmp_path / "checkout"
    (checkout / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "serve", checkout / "scripts" / "serve")
    shutil.copytree(build / "html", checkout / "_build" / "html")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([str(checkout / "scripts" / "serve"), str(port)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    try:
        for _ in range(50):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/book/intro.html", timeout=2) as r:
                    assert r.status == 200 and b"first principles" in r.read()
                    break
            except urllib.error.URLError:
                time.sleep(0.2)
        else:
            pytest.fail("scripts/serve did not answer")
    finally:
        proc.terminate()
        proc.wait(timeout=10)
