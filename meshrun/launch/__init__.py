"""How a job runs: the invocation's state (`invocation`), who answers for a job's run dir
(`rundir`), one `Launcher` per way a train job runs (`launchers`: in this process, in a process of
its own, as local processes, under SLURM), and what they use: starting meshrun processes with a role
(`spawn`), joining a multi-process job (`join`) and the local launcher (`local`)."""
