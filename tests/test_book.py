"""The real `jupyter-book build` of the course site: warnings are errors, every
cell runs, every page of the table of contents is built, and nothing in the
built site gives away a solution or a hidden test."""
import re
import shutil

import pytest
import yaml

from tests.conftest import REPO, run
from tests.leaks import find_leaks


def toc_files():
    toc = yaml.safe_load((REPO / "_toc.yml").read_text())
    files = [toc["root"]]

    def walk(entries):
        for entry in entries or []:
            if "file" in entry:
                files.append(entry["file"])
            walk(entry.get("sections"))
            walk(entry.get("chapters"))

    for part in toc.get("parts", []):
        walk(part.get("chapters"))
    return files


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    proc = run([shutil.which("jupyter-book") or "jupyter-book", "build", str(REPO), "--builder", "html",
                "-W", "-n", "--keep-going", "--path-output", str(out)])
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"jupyter-book build failed:\n{log[-6000:]}"
    return out / "_build", log


def test_build_succeeds_without_warnings(site):
    _, log = site
    assert "build succeeded" in log
    assert not re.search(r"WARNING: (?!Location)", log), log[-4000:]


def test_every_page_in_the_toc_is_built(site):
    build, _ = site
    for page in toc_files():
        assert (build / "html" / f"{page}.html").is_file(), f"{page} was not built"


def test_every_cell_ran_without_error(site):
    build, _ = site
    for page in toc_files():
        text = (build / "html" / f"{page}.html").read_text()
        assert "Traceback (most recent call last)" not in text, f"{page} shows a traceback"
        assert 'class="output traceback' not in text and "ansi-red-fg" not in text, f"{page} shows an error"


def test_figures_have_alt_text(site):
    build, _ = site
    images = 0
    for page in toc_files():
        for tag in re.findall(r"<img [^>]*>", (build / "html" / f"{page}.html").read_text()):
            images += 1
            alt = re.search(r'alt="([^"]*)"', tag)
            assert alt and len(alt.group(1)) > 20, f"{page}: image without a real alt text: {tag[:120]}"
    assert images >= 5


def test_site_holds_no_solutions_or_hidden_tests(site):
    build, _ = site
    leaks = find_leaks(build)
    assert not leaks, "\n".join(f"{p.relative_to(build)}: {what!r}" for p, what in leaks[:20])
