"""Turn sweep directories into rankings, tables, figures and an offline HTML dashboard.

    python analysis/report.py multirun/2026-11-30/12-00-00

`runs` reads run directories, `plan` what a sweep set out to run, `optuna_study` an Optuna
sweep's study; `ranking` aggregates seeds and ranks configs; `tables`, `figures` and
`dashboard` write the outputs; `report` is the command line that ties them together.
"""
