"""Feedback for students: grades and outputs, but no hidden test code.

nbgrader's feedback renders the autograded notebook, whose test cells hold the
instructor's full source (hidden tests included). This preprocessor removes the
hidden regions and cuts tracebacks in those cells to their last line, which is
the check's message written for the student. A second one makes the student's
own HTML inert, so that nothing in it runs where the feedback is opened."""
import re

from nbconvert.preprocessors import Preprocessor
from traitlets import Bool, Unicode

from autograde.structure import is_students

HIDDEN_NOTE = "# (hidden tests ran here; their code is not shown)"


class RedactHiddenTests(Preprocessor):
    enabled = Bool(True)  # nbconvert preprocessors are off unless enabled
    begin = Unicode("### BEGIN HIDDEN TESTS").tag(config=True)
    end = Unicode("### END HIDDEN TESTS").tag(config=True)

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type != "code" or self.begin not in cell.source:
            return cell, resources
        kept, hidden = [], False
        for line in cell.source.split("\n"):
            if self.begin in line:
                hidden = True
                kept.append(HIDDEN_NOTE)
            elif self.end in line:
                hidden = False
            elif not hidden:
                kept.append(line)
        cell.source = "\n".join(kept)
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                output["traceback"] = [f"{output.get('ename', 'Error')}: {output.get('evalue', '')}"]
        return cell, resources


# Rich outputs a browser would run or that can carry script: kept out of feedback, whose
# outputs come from the student's process. Every display also has its text/plain form.
ACTIVE_OUTPUTS = ("text/html", "application/javascript", "image/svg+xml", "text/markdown")
TAG_START = re.compile(r"<(?=[A-Za-z/!?])")


class InertStudentHTML(Preprocessor):
    """The student's markdown answers with every tag shown as text (`<script>` and
    `<img onerror=...>` would otherwise run in the student's or the instructor's browser),
    and code outputs without their HTML, JavaScript, SVG or Markdown forms."""
    enabled = Bool(True)

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type == "markdown" and is_students(cell):
            cell.source = TAG_START.sub("&lt;", cell.source)
        for output in cell.get("outputs", []):
            data = output.get("data")
            if data is not None:
                for mime in ACTIVE_OUTPUTS:
                    data.pop(mime, None)
                if not data:
                    data["text/plain"] = ""
        return cell, resources
