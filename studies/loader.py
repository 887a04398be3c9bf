"""Loads every study's registrations: each `genrec.studies.<topic>.registration` module registers the
topic's `benchmark:` entries (genrec.workloads.benchmark_registry) and report pages
(genrec.dashboards.registry) when imported.

The layers below (workloads, dashboards) hold the registries and never import a study; the platform
calls `load_studies()` before it looks a benchmark or a page kind up. A new study needs no list to
edit: a topic folder with a registration module is found by walking this namespace.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import pkgutil

import genrec.studies


def study_topics() -> list[str]:
    """The topic packages under genrec.studies (common holds shared driver code, not a study)."""
    return sorted(m.name for m in pkgutil.iter_modules(genrec.studies.__path__) if m.ispkg)


@functools.cache
def load_studies() -> tuple[str, ...]:
    """Import each topic's registration module once; the names of the topics that have one."""
    loaded = []
    for topic in study_topics():
        name = f"genrec.studies.{topic}.registration"
        if importlib.util.find_spec(name) is not None:
            importlib.import_module(name)
            loaded.append(topic)
    return tuple(loaded)
