"""Building the policy and reference models and their tokenizers."""
