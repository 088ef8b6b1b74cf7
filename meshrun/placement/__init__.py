"""Where things go on the mesh: the devices a run uses, the Keras distribution over them, layout
rules checked against the model's variables, and the placement plan (bytes per device)."""
