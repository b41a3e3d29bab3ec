"""dpo-sweeps: find the best FSDP setup for DPO training, one Hydra sweep at a time."""

__version__ = "0.1.0"
