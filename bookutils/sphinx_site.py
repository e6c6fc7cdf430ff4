"""A Sphinx extension with fixes to the pages Jupyter Book 1 writes.

- sphinx-thebe and sphinx-togglebutton register their inline configuration
  scripts twice (a second `const THEBE_JS_URL` is a SyntaxError in the browser);
  each script is kept once.
- The sidebar's expand/collapse toggles are <summary> elements holding only an
  icon, which screen readers announce without a name; they get an aria-label.
- site_static/course.css and course.js: long output lines and display equations
  stay visible in the text column, long inline code wraps on a phone, and each
  figure opens at full size when clicked."""
from pathlib import Path

STATIC = Path(__file__).resolve().parent / "site_static"

TOGGLE = '<summary><span class="toctree-toggle" role="presentation">'
LABELLED_TOGGLE = '<summary aria-label="Show or hide the sections"><span class="toctree-toggle" role="presentation">'


def _unique_scripts(app, pagename, templatename, context, doctree):
    seen, kept = set(), []
    for script in context.get("script_files", []):
        # An inline script's filename is None or "", depending on how it was added.
        name = getattr(script, "filename", script) or ""
        key = (str(name), tuple(sorted((k, str(v)) for k, v in getattr(script, "attributes", {}).items())))
        if key not in seen:
            seen.add(key)
            kept.append(script)
    context["script_files"] = kept


def _label_sidebar_toggles(app, pagename, templatename, context, doctree):
    make_toctree = context.get("generate_toctree_html")
    if make_toctree is None:
        return

    def labelled(*args, **kwargs):
        return str(make_toctree(*args, **kwargs)).replace(TOGGLE, LABELLED_TOGGLE)

    context["generate_toctree_html"] = labelled


def _add_static(app):
    app.config.html_static_path.append(str(STATIC))
    app.add_css_file("course.css")
    app.add_js_file("course.js")


def setup(app):
    app.connect("builder-inited", _add_static)
    app.connect("html-page-context", _unique_scripts, priority=900)
    app.connect("html-page-context", _label_sidebar_toggles, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
