# Sourced by the other scripts: makes .venv/ (once) and installs the pinned
# requirements into it whenever requirements.txt or pyproject.toml change.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
VENV="$ROOT/.venv"

if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "error: this course needs Python 3.11 or newer; '$PYTHON' is $("$PYTHON" --version 2>&1 || echo missing)." >&2
  echo "       Set PYTHON=/path/to/python3.11 and run again." >&2
  exit 1
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "==> creating virtual environment in .venv/"
  "$PYTHON" -m venv "$VENV"
fi

# The instructor's repository also installs its grading package; the student
# release (no autograde/) only needs the pinned libraries.
if [ -d "$ROOT/autograde" ]; then stamp="$VENV/.installed"; else stamp="$VENV/.installed-release"; fi
want="$(cat requirements.txt pyproject.toml | "$VENV/bin/python" -c 'import hashlib,sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())')"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "==> installing pinned requirements into .venv/ (first run takes a few minutes)"
  "$VENV/bin/python" -m pip install --quiet --upgrade pip
  "$VENV/bin/python" -m pip install --quiet -r requirements.txt
  if [ -d "$ROOT/autograde" ]; then
    # The course's own packages (autograde and the rest): importable by the grader and tests.
    "$VENV/bin/python" -m pip install --quiet --no-deps --no-build-isolation -e .
  fi
  echo "$want" > "$stamp"
fi

export PATH="$VENV/bin:$PATH"
# The book's kernels import bookutils and coursekit from this tree.
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export VIRTUAL_ENV="$VENV"
# Matplotlib writes its font cache here instead of the user's home. Kernels
# choose their own inline backend; a backend forced from outside would drop the
# figures from the built pages.
export MPLCONFIGDIR="$ROOT/.venv/.mplconfig"
unset MPLBACKEND
