"""A run's configuration: the typed schema (`schema`), the one home of every default and of a doc
line per key (`fields.setting`), its parsing from a composed config (`parse`), the value checks
(`checks`) and the config reference page generated from it (`reference`). Everything here runs before
jax is imported, and importing it imports none of the components: the parser loads the chosen model
and data source by name (meshrun.specs)."""
