"""`python -m genrec.platform.serve.harness`: the in-process open-loop serving harness (no Ray).

The harness itself is genrec.workloads.serving.harness (its docstring says what it measures): it sits
in workloads so it imports nothing the lent GPU machine lacks, and so the `xgr_serving` sweep benchmark
(a workloads registry entry) can run it. This module is its entry point beside the Serve app.
"""

import sys

from genrec.workloads.serving.harness import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m genrec.platform.serve.harness"))
