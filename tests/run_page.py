"""Execute one page of the book as the build does, under another machine's kernels.

    python -m tests.run_page book/variants/trained_model.md [--setting avx2] [--timeout 900] [--save out.ipynb]

The page (MyST Markdown) is read as myst-nb reads it and executed with nbclient
in its own folder, with the environment of tests/machine_settings.py's setting
added; every cell must run (a page's asserts hold its claims). Prints the time
and, on failure, the failing cell's error, and exits with 1."""
import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def execute_page(page, setting="native", timeout=900, save=None):
    """(seconds, None) when every cell ran, (seconds, error text) otherwise; `save` names a
    file for the executed notebook, outputs and all (kept on failure too)."""
    import nbformat
    from myst_nb.core.read import read_myst_markdown_notebook
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    from tests.machine_settings import SETTINGS

    page = Path(page).resolve()
    notebook = read_myst_markdown_notebook(page.read_text())
    notebook = nbformat.from_dict(notebook)
    env = {**os.environ, **SETTINGS[setting]}
    env.pop("MPLBACKEND", None)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    client = NotebookClient(notebook, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(page.parent)}},
                            allow_errors=False)
    start = time.monotonic()
    try:
        client.execute(env=env)
    except CellExecutionError as exc:
        return time.monotonic() - start, str(exc)
    finally:
        if save:
            nbformat.write(notebook, save)
    return time.monotonic() - start, None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("page")
    parser.add_argument("--setting", default="native")
    parser.add_argument("--timeout", type=int, default=900)
    parser.add_argument("--save", help="write the executed notebook here")
    args = parser.parse_args(argv)
    seconds, error = execute_page(args.page, args.setting, args.timeout, args.save)
    print(f"{args.page} under '{args.setting}': {'failed' if error else 'ran'} in {seconds:.1f} s")
    if error:
        print(error[-6000:])
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
