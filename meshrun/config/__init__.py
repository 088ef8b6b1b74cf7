"""A run's configuration: the typed schema (`schema`), its parsing from a composed config
(`parse`) and the value checks (`checks`). Everything here runs before jax is imported, and
importing it imports none of the components: the parser loads the chosen model and data source
by name (meshrun.specs)."""
