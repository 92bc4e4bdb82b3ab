"""`python -m sglang_cpp.cli`: the same entry point as the `sglang-cpp` console script."""
from __future__ import annotations

import sys

from . import main

sys.exit(main())
