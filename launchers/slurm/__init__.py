"""SLURM: the `hydra/launcher=slurm` launcher (launcher.py), and (local_cluster.sh, in a checkout) a
one-node cluster for tests. What SLURM says of a job that died is launchers/forensics.py: every
launcher's collecting (launchers/collect.py) asks it, so it sits beside them, not in here.

Nothing is imported here: launcher.py imports base.py and collect.py.
"""
