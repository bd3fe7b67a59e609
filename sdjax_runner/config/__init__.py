"""Config -> plan: the schema every key is typed by, every value check, prompts, and the Plan a job follows."""
