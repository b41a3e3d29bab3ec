"""Turn sweep directories into rankings, tables, figures and an offline HTML dashboard.

    python analysis/report.py multirun/2026-11-30/12-00-00

`runs` reads run directories, `ranking` aggregates seeds and ranks configs, `optuna_study`
reads an Optuna sweep's study, `tables`, `figures` and `dashboard` write the outputs and
`report` is the command line that ties them together.
"""
