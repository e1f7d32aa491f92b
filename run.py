"""`python run.py start|stop|status|reload|demo`: the `rmq-mp` command run from a checkout (workers/cli.py
is the program; `rmq-mp --help` and docs/architecture.md say what each command does)."""

from __future__ import annotations

import sys

from workers.cli import did_not_start as did_not_start
from workers.cli import main

if __name__ == "__main__":
    sys.exit(main(prog="run.py"))
