"""`python -m hicache.cli ...`: the `hicache` command (exit status from `main`)."""
from __future__ import annotations

import sys

from hicache.cli.command import main

sys.exit(main())
