"""`meshrun k8s`: the job `meshrun train` would run, for Kubernetes. `options` reads the command's
flags; `render` turns a checked config and those flags into plain Kubernetes objects (a Kubeflow
Trainer TrainJob, or a headless Service and an Indexed Job); `simulate` runs the rendered pods here
as local processes; `submit` hands the objects to the cluster of the current kubeconfig context.
Nothing here imports jax or keras."""
