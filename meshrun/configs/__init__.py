"""meshrun's Hydra config tree, shipped inside the package so an installed meshrun finds it."""
