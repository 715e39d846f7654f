"""``python -m tests.regen_probe_values``: rewrites tests/probe_values.json with every value the fixed-seed probes of
tests/probe_cases.py log now, and the docs tables (tests.regen_docs_tables); run it after registering a probe
metric, or after a change meant to move a value."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
VALUES = HERE / "probe_values.json"
COMMAND = "python -m tests.regen_probe_values"


def main() -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.path.insert(0, str(HERE))
    from probe_cases import CASES, logged_values
    from regen_docs_tables import main as regen_docs_tables

    VALUES.write_text(json.dumps({case: logged_values(case) for case in sorted(CASES)}, indent=0, sort_keys=True))
    print(f"wrote {VALUES}")
    regen_docs_tables()


if __name__ == "__main__":
    main()
