"""What meshrun does to and reads from its own process and its children, below every other layer:
the allocator's policy (glibc's malloc tunables), host memory while weights load, and the stop
signals a job forwards and answers. Nothing here imports keras or another meshrun package."""
