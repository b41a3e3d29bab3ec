"""The parallel plan: process groups, FSDP sharding, precision, memory and FLOPs estimates."""
