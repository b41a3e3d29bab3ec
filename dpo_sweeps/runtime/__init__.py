"""A rank's process life: signals, the watchdog over peer ranks, the local rank supervisor."""
