"""Host weights -> images and timings: the process's XLA runtime, multi-host setup, one strategy per
parallel mode (placement and lowering), generation, what a process reuses across jobs, the persistent
compilation cache, and efficiency measurement."""
