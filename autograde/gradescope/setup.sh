#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder's image
# (Ubuntu 22.04): bubblewrap for the sandbox, Python 3.11 or newer, and the
# course's pinned packages in a virtual environment outside source/.
#
# The grader itself is not installed into that environment: the environment is
# visible, read-only, to student code inside the sandbox, so the grader runs
# from source/course (PYTHONPATH), where student code cannot look.
#
# COURSE_PYTHON=/path/to/python skips every installation and grades with that
# interpreter, which must already have the pinned packages (the course's own
# tests do this with their virtual environment).
set -euo pipefail
ROOT="${AUTOGRADER_ROOT:-/autograder}"
SOURCE="$ROOT/source"
VENV="$ROOT/venv"

python_ok() {  # python_ok INTERPRETER: Python 3.11 or newer?
  "$1" -c 'import sys; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1
}

if [ -n "${COURSE_PYTHON:-}" ]; then
  echo "==> using $COURSE_PYTHON as it is (COURSE_PYTHON set: nothing installed)"
  python="$COURSE_PYTHON"
else
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq bubblewrap >/dev/null
  base=""
  for candidate in python3.13 python3.12 python3.11 python3; do
    if command -v "$candidate" >/dev/null && python_ok "$candidate"; then base="$candidate"; break; fi
  done
  if [ -z "$base" ]; then
    # Ubuntu 22.04's own Python is 3.10; 3.11 is in its universe component,
    # and the deadsnakes archive is the fallback.
    if ! apt-get install -y -qq python3.11 python3.11-venv >/dev/null; then
      apt-get install -y -qq software-properties-common >/dev/null
      add-apt-repository -y ppa:deadsnakes/ppa
      apt-get update -qq
      apt-get install -y -qq python3.11 python3.11-venv >/dev/null
    fi
    base=python3.11
  fi
  apt-get install -y -qq "$(basename "$base")-venv" >/dev/null 2>&1 || true
  echo "==> creating $VENV with $("$base" --version)"
  "$base" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --upgrade pip
  # PyTorch's CPU-only build: the containers have no GPU, and it is a fraction of the size.
  "$VENV/bin/python" -m pip install --quiet --extra-index-url "${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}" \
    -r "$SOURCE/course/requirements.txt"
  python="$VENV/bin/python"
fi

python_ok "$python" || { echo "error: $python is not Python 3.11 or newer" >&2; exit 1; }
command -v bwrap >/dev/null || echo "warning: bubblewrap (bwrap) is missing: grading will stop unless the autograder was built with --no-namespaces" >&2
# The grader imports from the course's copy, with the pinned packages.
PYTHONPATH="$SOURCE/course" "$python" -c 'import autograde.grade, nbgrader, numpy, torch' \
  || { echo "error: the grader cannot import its packages with $python" >&2; exit 1; }
printf 'COURSE_PYTHON=%q\n' "$python" > "$SOURCE/environment"
echo "==> ready: run_autograder grades with $python"
