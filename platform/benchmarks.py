"""The registries as the platform reads them: every study's registrations loaded first.

The benchmark registry (genrec.workloads.benchmark_registry) and the report page registry
(genrec.dashboards.registry) are filled by the studies (genrec.studies.<topic>.registration), which
the layers below never import. Platform code looks benchmarks up here, and calls `load_studies`
before it builds a report, so a study's entries are there in every process (CLI, Tune trials).
"""

from __future__ import annotations

from genrec.studies.loader import load_studies
from genrec.workloads import benchmark_registry
from genrec.workloads.benchmark_registry import Benchmark


def get_benchmark(name: str) -> Benchmark:
    """The registered benchmark NAME (UserInputError naming the known ones otherwise)."""
    load_studies()
    return benchmark_registry.get_benchmark(name)


def find_benchmark(name: str) -> Benchmark | None:
    """The registered benchmark NAME, or None (e.g. a row of a benchmark this checkout no longer has)."""
    load_studies()
    return benchmark_registry.BENCHMARKS.get(name)


def benchmark_names() -> list[str]:
    load_studies()
    return benchmark_registry.benchmark_names()


def load_report_pages() -> None:
    """Register every study's report page before a report is built."""
    load_studies()
