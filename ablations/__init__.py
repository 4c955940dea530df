"""Study runner: declarative studies (ablations/<study>.toml) run resumably, locally or through Slurm.

`python -m ablations list|run|status|slurm|run-one ...`; see ablations/README.md.
"""
