"""Which configs are tied with the best on preference accuracy: the statistics both the report
(analysis/) and find_best's recommendation (launchers/find_best.py) decide with, so that the two cannot
disagree on what "tied" means.

`eval_pairs` reads a run's per-pair eval records, `paired` holds the paired statistics over them
(McNemar, Holm, the paired bootstrap, the seed-level variance, power), `ties` compares configs into ties with the best and
ranks with ties. Pure functions of run directories and arrays: nothing here starts a run or writes a file.
"""
