#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment and install drivetrain with its dev tools.
#
# torch is installed as torch==2.13.0 only when the environment has no torch yet: on the CPU-only
# machines this project is developed on, pip takes that version from a local CPU wheel. Installing
# drivetrain afterwards never resolves torch again (the installed one satisfies torch>=2.4), so the
# multi-GB CUDA build is never pulled. Override the location with DRIVETRAIN_VENV.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${DRIVETRAIN_VENV:-.venv}"
python="${PYTHON:-python3}"

if [ ! -x "$venv/bin/python" ]; then
  echo "setup: creating virtual environment $venv"
  "$python" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
quiet_pip() {  # hide the notes this machine's pip configuration prints about absent local index folders
  "${pip[@]}" "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
}

if ! "$venv/bin/python" -c "import torch" >/dev/null 2>&1; then
  echo "setup: installing torch==2.13.0"
  quiet_pip install "torch==2.13.0"
fi

# Reinstall only when the package metadata changed since the last install (keeps reruns fast).
stamp="$venv/.drivetrain-setup"
want="$(pwd) $(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ] || ! "$venv/bin/python" -c "import drivetrain" >/dev/null 2>&1; then
  echo "setup: installing drivetrain (editable) with the dev extra"
  quiet_pip install -e ".[dev]"
  echo "$want" > "$stamp"
fi
