"""XLA's compile options as a user's process has them: the suite leaves XLA's CPU optimizations off
(XLA_FLAGS in tests/conftest.py); a test that compares a program's output bit for bit with a reference made in
a user's setting (the noise a seed gives) compiles that program with these."""

USERS_COMPILE = {"xla_backend_optimization_level": 2, "xla_llvm_disable_expensive_passes": False}
