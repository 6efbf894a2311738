"""Opt-in unquantized linear through hipBLASLt/cuBLASLt with per-shape tuning."""
