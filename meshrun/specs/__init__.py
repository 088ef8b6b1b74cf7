"""Plain records the layers above share and none of them owns: what a model, a data source and a log
sink declare, with the table of which module registers which name (so a registry imports only the
components a run chooses), and metrics.json's schema. Nothing here imports jax, keras or another
meshrun package but the bottom layer (errors, wording, files, registry)."""
