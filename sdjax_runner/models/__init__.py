"""Plan -> pipeline and host weights: where a model comes from, its weight files, loading, the built-in
models, schedulers and the UNet's attention."""
