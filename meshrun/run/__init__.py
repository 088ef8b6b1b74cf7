"""One training run, in phases with typed hand-overs (`meshrun.run.phases.train` runs them):

    setup = prepare(config, context)            every check, nothing built          run/prepare.py
    compared = float_base.compare(setup, ...)   a quantized base's float model      run/float_base.py
                                                built, evaluated and freed
    outcome = execute(setup, compared, ...)     build, fit, evaluate, export        run/execute.py
    metrics = collect(setup, outcome, ending)   what metrics.json holds             run/collect.py

The run is what ties the plugins together: it builds the model (build.py) under the placement's
distribution, feeds it the data (feed.py), trains it with training's objectives and callbacks,
logs through logs/, measures it (costs.py: XLA's analysis; hardware.py: peak FLOP/s) and completes
prompts with it (sampling.py). metrics.json's one definition is RunMetrics (meshrun.specs.metrics),
which reports and sweeps read without importing this package. The phases import jax and keras:
call `meshrun.placement.devices.prepare` before importing them; importing this package imports
neither.
"""
