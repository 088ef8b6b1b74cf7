"""The Keras pieces a run trains with: optimizer, loss and metrics from config names
(`objectives`), learning-rate schedules, checkpoints, and the callbacks that guard and stop training."""
