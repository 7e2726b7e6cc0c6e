#!/bin/sh
# Installs torch into a virtual environment (called by the Makefile; tests/test_packaging.py runs it
# with a stand-in python).
#   install_torch.sh PYTHON SPEC INDEX WANTED STAMP
# PYTHON: the environment's python; SPEC: the requirement (torch, torch==2.13.0); INDEX: the index
# to take it from (empty: pip's own configuration; when it cannot be reached or lacks SPEC, pip's
# default index is used instead, said out loud); WANTED: what STAMP records once it is installed. A
# STAMP that records something else means torch was installed from another spec or index: it is
# uninstalled first, since pip would otherwise keep it as "already satisfied".
set -eu
py=$1 spec=$2 index=$3 wanted=$4 stamp=$5

if [ -f "$stamp" ] && [ "$(cat "$stamp")" != "$wanted" ]; then
  echo "make: torch was installed as '$(cat "$stamp")', now '$wanted' is asked for: reinstalling it"
  "$py" -m pip uninstall -q -y torch || true
fi
rm -f "$stamp"

from="pip's default index"
if [ -n "$index" ]; then
  log=$(mktemp)
  # one quick try: an unreachable index must not cost minutes of retries
  if "$py" -m pip install -q --retries 1 --timeout 15 --index-url "$index" "$spec" >"$log" 2>&1; then
    from=$index
  else
    echo "make: $index cannot be reached or has no $spec ($(tail -n 1 "$log"))"
    echo "make: installing $spec from pip's default index instead, which may be a CUDA build (several GB);" \
         "to choose, set TORCH_SPEC (e.g. a +cpu version your index has) or TORCH_INDEX"
    "$py" -m pip install -q "$spec"
  fi
  rm -f "$log"
else
  "$py" -m pip install -q "$spec"
fi
# numpy comes with the project, after torch: torch's warning about it means nothing here
"$py" -W ignore::UserWarning -c "import sys, torch; b = ('CUDA ' + torch.version.cuda) if torch.version.cuda else 'CPU-only'; print(f'make: installed torch {torch.__version__} ({b} build), from {sys.argv[1]}')" "$from"
echo "$wanted" > "$stamp"
