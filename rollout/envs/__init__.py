"""Agent environments (see base.py for the format; bundled ones are the sub-directories with an env.yaml)."""
