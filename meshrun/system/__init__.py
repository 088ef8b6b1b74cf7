"""What meshrun does to and reads from its own process and its children, below every other layer
but the plain records: the allocator's policy (glibc's malloc tunables), host memory while weights
load, the disk under a checkpoint dir, the stop signals a job catches, forwards and answers, and the
process plumbing written once (file descriptors pointed elsewhere, signal handler scopes). Nothing
here imports keras or a meshrun package outside meshrun.system."""
