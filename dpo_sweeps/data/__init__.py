"""Preference data: sources (synthetic, HH-RLHF, any prompt/chosen/rejected table) and tokenization."""
