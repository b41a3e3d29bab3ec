"""Turn sweep directories into rankings, tables, figures and an offline HTML dashboard.

    python analysis/report.py multirun/2026-11-30/12-00-00      # in a checkout
    dpo-sweeps-report multirun/2026-11-30/12-00-00              # any install

Installed as `dpo_sweeps.analysis` (this folder, linked into the package as dpo_sweeps/analysis).

`runs` reads run directories, `plan` what a sweep set out to run, `optuna_study` an Optuna sweep's
study; `ranking` aggregates seeds and ranks configs, comparing their accuracy pair by pair into ranks
with ties through dpo_sweeps/ranking (per-pair eval records, the paired statistics, the ties: shared
with find_best's recommendation); `sample_replies` the best run's replies before and after training;
`tables`, `figures` and `dashboard` write the outputs; `report` is
the command line that ties them together.
"""
