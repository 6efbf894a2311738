"""REPLACE_ME: what the operator is."""
