"""What a run reports: the rich tables (`render`), the comparison of runs (`sweep`), XLA's cost
analysis of the step (`costs`) and accelerator peaks (`hardware`)."""
