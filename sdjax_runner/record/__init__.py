"""Images and timings -> the run directory -> the tracker: the on-disk contract, the job's lifecycle,
tracking, provenance, and a sweep's summary."""
