"""What the tests share: running the CLI, composing configs, reading images and MLflow stores, the
guide's own code, and writing PyTorch-layout checkpoints. Test modules import these, never each other."""
