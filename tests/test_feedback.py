"""Feedback HTML, rendered by nbconvert with the grader's feedback preprocessors: no hidden
test code, and nothing of the student's own HTML that a browser would run."""
from html.parser import HTMLParser

import nbformat
from nbconvert import HTMLExporter

from autograde.feedback import HIDDEN_NOTE, InertStudentHTML, RedactHiddenTests

SCRIPT = '<script>fetch("/formgrader/api/grade/x", {method: "PUT"})</script>'
IMAGE = "<img src=\"x\" onerror=\"document.title='ran'\">"


def _rendered(notebook):
    exporter = HTMLExporter()
    exporter.register_preprocessor(RedactHiddenTests, enabled=True)
    exporter.register_preprocessor(InertStudentHTML, enabled=True)
    return exporter.from_notebook_node(notebook)[0]


class _Active(HTMLParser):
    """What a browser would run: event-handler attributes and the text of script elements."""

    def __init__(self):
        super().__init__()
        self.handlers, self.scripts, self.in_script = [], [], False

    def handle_starttag(self, tag, attrs):
        self.handlers += [name for name, _ in attrs if name.startswith("on")]
        self.in_script = tag == "script"

    def handle_endtag(self, tag):
        self.in_script = False

    def handle_data(self, data):
        if self.in_script:
            self.scripts.append(data)


def _active(html):
    parser = _Active()
    parser.feed(html)
    return parser


def _notebook():
    answer = nbformat.v4.new_markdown_cell(f"My answer: $a < b$ and **bold**.\n\n{SCRIPT}\n\n{IMAGE}")
    answer.metadata["nbgrader"] = {"solution": True, "grade": True, "grade_id": "written", "points": 2}
    code = nbformat.v4.new_code_cell("display(HTML(...))")
    code.outputs = [nbformat.v4.new_output("display_data", data={"text/html": SCRIPT, "text/plain": "<HTML object>"})]
    test = nbformat.v4.new_code_cell("check()\n### BEGIN HIDDEN TESTS\nsecret_check()\n### END HIDDEN TESTS")
    prompt = nbformat.v4.new_markdown_cell("The instructor's <b>prompt</b>.")
    return nbformat.v4.new_notebook(cells=[prompt, answer, code, test])


def test_the_students_html_is_shown_as_text_and_never_runs():
    html = _rendered(_notebook())
    active = _active(html)
    assert "onerror" not in active.handlers and not any("formgrader" in text for text in active.scripts)
    assert "&lt;script&gt;fetch" in html and "onerror=" in html   # shown, as text
    assert "<strong>bold</strong>" in html and "$a &lt; b$" in html
    assert "<b>prompt</b>" in html                        # the instructor's own markdown keeps its HTML
    assert "&lt;HTML object&gt;" in html                  # the output's text form stands in for its HTML


def test_hidden_tests_are_not_in_the_feedback():
    html = _rendered(_notebook())
    assert "secret_check" not in html and HIDDEN_NOTE.lstrip("# ") in html
