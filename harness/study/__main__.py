"""``python -m harness.study [overrides]``: the study's command line (harness.study.main)."""

from harness.study import main

main()
