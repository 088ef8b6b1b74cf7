"""Starting and joining multi-process jobs: a process's place in the job (`identity`), joining it
(`join`), starting meshrun processes with a role (`spawn`), and the local launcher (`local`)."""
