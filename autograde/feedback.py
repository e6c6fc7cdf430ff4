"""Feedback for students: grades and outputs, but no hidden test code.

nbgrader's feedback renders the autograded notebook, whose test cells hold the
instructor's full source (hidden tests included). This preprocessor removes the
hidden regions and cuts tracebacks in those cells to their last line, which is
the check's message written for the student."""
from nbconvert.preprocessors import Preprocessor
from traitlets import Bool, Unicode

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
