"""The data-source registry: each source module registers its SourceSpec (meshrun.specs.data) under a
name at import, and `get_source(name)` imports the module of that name alone (the table is
meshrun.specs.data.SOURCES)."""

from meshrun.specs.data import SOURCES, DataContext, SourceSpec

register_source = SOURCES.register
get_source = SOURCES.get
source_names = SOURCES.names

__all__ = ["DataContext", "SourceSpec", "get_source", "register_source", "source_names"]
