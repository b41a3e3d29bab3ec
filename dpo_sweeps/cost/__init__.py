"""What a run will cost before it runs: its step time, tokens/s, MFU and device-hours on a named cluster
(profile.py: the hardware; step_time.py: the prediction; cpu_profile.py: this machine, measured)."""
