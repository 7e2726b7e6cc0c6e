#!/bin/sh
# Installs torch into a virtual environment (called by the Makefile; tests/test_packaging.py runs it
# with a stand-in python).
#   install_torch.sh PYTHON SPEC INDEX WANTED STAMP
# PYTHON: the environment's python; SPEC: the requirement (torch, torch==2.13.0); INDEX: the index
# to take it from (empty: pip's own configuration; when it cannot be reached or lacks SPEC, pip's
# default index is used instead, said out loud); the line it ends with names where pip really took
# torch from (pip's install report); WANTED: what STAMP records once it is installed. A
# STAMP that records something else means torch was installed from another spec or index: it is
# uninstalled first, since pip would otherwise keep it as "already satisfied".
set -eu
py=$1 spec=$2 index=$3 wanted=$4 stamp=$5

if [ -f "$stamp" ] && [ "$(cat "$stamp")" != "$wanted" ]; then
  echo "make: torch was installed as '$(cat "$stamp")', now '$wanted' is asked for: reinstalling it"
  "$py" -m pip uninstall -q -y torch || true
fi
rm -f "$stamp"

# pip writes what it installed, and from where, to this report (PIP_REPORT is pip's --report, set
# through the environment so the commands stay as they are): an index may be named while pip's
# find-links hand it a local wheel, and make must say where torch really came from
report=$(mktemp)
export PIP_REPORT="$report"
from="pip's configured indexes/find-links"
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
unset PIP_REPORT
"$py" -W ignore::UserWarning -c "import json, sys, torch
b = ('CUDA ' + torch.version.cuda) if torch.version.cuda else 'CPU-only'
try:  # the URL pip took torch from; none when it was already installed (or the report is unreadable)
    urls = [i['download_info']['url'] for i in json.load(open(sys.argv[2]))['install']
            if i['metadata']['name'].lower() == 'torch']
except (OSError, ValueError, KeyError, TypeError):
    urls = []
src = sys.argv[1] if not urls else ('a local wheel, ' + urls[0][7:]) if urls[0].startswith('file://') else urls[0]
print(f'make: installed torch {torch.__version__} ({b} build), from {src}')" "$from" "$report"
rm -f "$report"
echo "$wanted" > "$stamp"
