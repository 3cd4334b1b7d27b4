"""The stateful examples live in examples/stateful/ (jobs, not a package)."""

from __future__ import annotations

import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "stateful"
if str(EXAMPLES) not in sys.path:
    sys.path.insert(0, str(EXAMPLES))
