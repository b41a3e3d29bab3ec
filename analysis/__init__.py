"""Turn sweep directories into rankings, tables, figures and an offline HTML dashboard.

    python analysis/report.py multirun/2026-11-30/12-00-00      # in a checkout
    dpo-sweeps-report multirun/2026-11-30/12-00-00              # any install

Installed as `dpo_sweeps.analysis` (this folder, linked into the package as dpo_sweeps/analysis).

`runs` reads run directories, `eval_pairs` their per-pair eval records, `plan` what a sweep set out
to run, `optuna_study` an Optuna sweep's study; `ranking` aggregates seeds and ranks configs, `ties`
compares their accuracy pair by pair (the statistics in `paired`) into ranks with ties; `tables`,
`figures` and `dashboard` write the outputs; `report` is the command line that ties them together.
"""
