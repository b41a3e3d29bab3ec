"""Reading the run's configuration: the checks every run and sweep point passes before launch."""
