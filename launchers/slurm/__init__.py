"""SLURM: the `hydra/launcher=slurm` launcher (launcher.py), what SLURM says of a job that died
(forensics.py), and (local_cluster.sh, in a checkout) a one-node cluster for tests.

Nothing is imported here: launchers/base.py reads forensics.py, and launcher.py imports base.py.
"""
