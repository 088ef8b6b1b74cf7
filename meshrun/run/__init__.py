"""One training run, in three phases with typed hand-overs (`meshrun.run.phases.train` runs them):

    setup = prepare(config, context)            every check, nothing built          run/prepare.py
    outcome = execute(setup)                    build, fit, evaluate, export        run/execute.py
    metrics = collect(setup, outcome, ending)   what metrics.json holds             run/collect.py

RunMetrics (run/metrics.py) is metrics.json's one definition, written by a run and read by reports
and sweeps. The phases import jax and keras: call `meshrun.placement.devices.prepare` before
importing them; importing this package (and run/metrics.py) imports neither.
"""
